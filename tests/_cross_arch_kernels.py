"""Triton kernels for tests/test_cross_arch.py's compile-only checks (imported by the
cross-compile worker, never by pytest's collection)."""

import triton
import triton.language as tl


@triton.jit
def mm(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """c = a @ b for fp16 row-major a (M, K), b (K, N); shared memory grows with
    BM, BN, BK and num_stages (software pipelining keeps num_stages tiles)."""
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        x = tl.load(a + rm[:, None] * K + (k + rk)[None, :])
        y = tl.load(b + (k + rk)[:, None] * N + rn[None, :])
        acc += tl.dot(x, y)
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))


@triton.jit
def fp8_cast(x, y, n, BLOCK: tl.constexpr):
    """fp32 -> float8e4nv: a type sm_80 has no instructions for."""
    off = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = off < n
    tl.store(y + off, tl.load(x + off, mask=m).to(tl.float8e4nv), mask=m)
