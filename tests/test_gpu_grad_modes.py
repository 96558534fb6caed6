"""Grad modes on CUDA: a frozen pair traced under the caller's no_grad is
refused with grad enabled (a parameter requires grad) and served under no_grad; a
CUDA capture made without deterministic algorithms is refused under them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import precompile_build  # noqa: E402
from precompile_runtime.errors import CallError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _pairs import load_pair_at, pair_paths  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def apply(m, x):
    return torch.nn.functional.gelu(m(x))


def test_a_cuda_no_grad_capture_checks_grad_mode_and_deterministic_algorithms(tmp_path):
    m, x = torch.nn.Linear(64, 64).cuda(), torch.randn(8, 64, device="cuda")
    with (
        torch.no_grad(),
        precompile_build.capture(apply, engine="frozen", **pair_paths(tmp_path)) as f,
    ):
        f(m, x)
    fn = load_pair_at(tmp_path)
    assert fn.uses_kernels and fn.metadata["ambient"]["grad_off"] is True
    with torch.no_grad():
        torch.testing.assert_close(fn(m, x), apply(m, x))
    with pytest.raises(
        CallError, match="called with grad enabled and parameter/buffer m.weight requiring grad"
    ):
        (fn(m, x).sum() + (m(x) ** 2).sum()).backward()
    assert m.weight.grad is None
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with (
            torch.no_grad(),
            pytest.raises(CallError, match=r"called with torch.use_deterministic_algorithms"),
        ):
            fn(m, x)
    finally:
        torch.use_deterministic_algorithms(before)
