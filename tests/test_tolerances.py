"""The frozen engine's default tolerances are torch's own:
``torch._dynamo.utils.same(..., fp64_ref=...)`` with the dynamo benchmark suites'
tol (1e-3 inference, 1e-2 training; floor tol / 10) and multipliers (2; 3 for
bf16/fp16, fewer than 1000 elements, 4-D values over 1x1 maps)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from precompile_build.validation import numerics  # noqa: E402


def _noisy(ref, rel: float, seed: int):
    """``ref`` plus noise of relative RMS ``rel``, in fp32 (as eager or a kernel)."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    rms = ref.pow(2).mean().sqrt()
    return (ref + noise * (rel * rms / noise.pow(2).mean().sqrt())).float()


def _running_var():
    """A BatchNorm running_var of efficientnet_b0's blocks.5.1.bn1 (1152 channels)."""
    g = torch.Generator().manual_seed(0)
    return 0.9 + 0.2 * torch.rand(1152, generator=g, dtype=torch.float64)


def test_a_training_steps_value_within_torchs_training_tolerance_is_accepted():
    """A timm efficientnet_b0 training step: running_var error 0.0014 against eager's
    0.000583 (2.4 x): torch's suite accepts it (2 x 0.000583 + 1e-2 / 10), so does
    the capture of a training step; the same numbers in an inference value, whose
    floor is 1e-3 / 10, are refused."""
    ref = _running_var()
    eager, frozen = _noisy(ref, 0.000583, 1), _noisy(ref, 0.0014, 2)
    v = numerics.judge(eager, frozen, ref, training=True)
    assert v.problem is None and v.multiple == 2.0 and v.floor == pytest.approx(1e-3)
    assert v.eager_error == pytest.approx(0.000583, rel=0.02)
    assert v.frozen_error == pytest.approx(0.0014, rel=0.02)
    inference = numerics.judge(eager, frozen, ref)
    assert inference.floor == pytest.approx(1e-4)
    assert inference.problem == "error beyond the allowed multiple of eager's"


def test_what_torchs_same_accepts_the_judge_accepts():
    """The judge against torch's own ``same`` on values of RMS 1 (where relative and
    absolute RMS agree): torch accepts -> accepted, torch refuses -> refused (fp32),
    for inference and training and each multiplier case. Except one step: ``same`` first
    accepts what is allclose at the suite's tol (1e-2 in training: a gradient 2 % off
    where gradients are below 1); the judge keeps ``same``'s default 1e-4 there, so
    that a wrong kernel is still refused (test_a_broken_kernel_is_still_refused...)."""
    same = pytest.importorskip("torch._dynamo.utils").same
    cases = [
        ((1152,), torch.float32),
        ((200,), torch.float32),
        ((4, 16, 1, 1), torch.float32),
        ((64, 64), torch.bfloat16),
    ]
    checked = 0
    for shape, dtype in cases:
        g = torch.Generator().manual_seed(3)
        ref = torch.randn(shape, generator=g, dtype=torch.float64)
        ref = ref / ref.pow(2).mean().sqrt()
        eager_rel = 0.004 if dtype == torch.bfloat16 else 3e-4
        for training, tol in ((False, 1e-3), (True, 1e-2)):
            for factor in (1.5, 2.5, 3.5, 12):
                eager = _noisy(ref, eager_rel, 4).to(dtype)
                frozen = _noisy(ref, eager_rel * factor, 5).to(dtype)
                torch_ok = same(eager, frozen, fp64_ref=ref, tol=tol, log_error=lambda *a: None)
                ours = numerics.judge(eager, frozen, ref, training=training).problem is None
                if torch.allclose(eager, frozen, atol=tol, rtol=tol) and not ours:
                    continue  # same()'s first step at the suite's tol: not taken (docstring)
                # bf16: the judge's floor is at least one rounding of the result (bf16's
                # unit roundoff, 3.9e-3), above torch's 1e-4: it may accept more there
                assert ours == torch_ok if dtype == torch.float32 else ours >= torch_ok, (
                    shape,
                    dtype,
                    training,
                    factor,
                )
                checked += 1
    assert checked >= 20


def test_a_broken_kernel_is_still_refused_in_a_training_step():
    """The training floor (1e-3) is far below what a wrong kernel gives: a gradient
    off by 2 % is refused, also where gradients are small (0.01)."""
    g = torch.Generator().manual_seed(6)
    ref = torch.randn(64, 64, generator=g, dtype=torch.float64) * 0.01
    eager = _noisy(ref, 1e-6, 7)
    v = numerics.judge(eager, eager * 1.02, ref, training=True)
    assert v.problem == "error beyond the allowed multiple of eager's"
