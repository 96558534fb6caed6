"""The raw ``@triton.jit`` kernels. Importing this module imports triton; only
:mod:`tinylm.kernels` imports it, lazily, on the first CUDA call."""

import triton
import triton.language as tl


@triton.jit
def rmsnorm_fwd_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    n_cols,
    stride_x_row,
    stride_out_row,
    eps,
    BLOCK: tl.constexpr,
):
    """One program per row: ``out = x * rsqrt(mean(x**2) + eps) * w`` in fp32."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    tl.store(out_ptr + row * stride_out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
