"""Judging a value piece by piece: the same numbers as over the whole value, and no
fp64 temporary larger than a piece (a 128k-vocabulary model's logits made the judge
hold a GiB beyond the model's own peak)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from precompile_build.validation import numerics  # noqa: E402


def _values(n=5003, seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(n, generator=g, dtype=torch.float64) * 3
    eager = (ref + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)).float()
    frozen = (ref + 2e-3 * torch.randn(n, generator=g, dtype=torch.float64)).float()
    eager[7] = frozen[7] = float("nan")  # non-finite in both: left out
    ref[11] = float("inf")
    return eager, frozen, ref


def _whole(eager, frozen, ref):
    """The numbers computed over whole tensors, as before."""
    mask = torch.isfinite(eager) & torch.isfinite(ref)
    r, e, f = ref[mask], eager[mask].double(), frozen[mask].double()
    denom = max(float(r.square().mean().sqrt()), float(e.square().mean().sqrt()))
    return (
        float((e - r).square().mean().sqrt()) / denom,
        float((f - r).square().mean().sqrt()) / denom,
        float((f - e).abs().max()),
        float(r.abs().max()),
    )


def test_pieces_give_the_numbers_of_the_whole_value(monkeypatch):
    eager, frozen, ref = _values()
    monkeypatch.setattr(numerics, "CHUNK", 64)
    v = numerics.judge(eager, frozen, ref)
    want = _whole(eager, frozen, ref)
    for got, w in zip((v.eager_error, v.frozen_error, v.max_abs, v.scale), want):
        assert math.isclose(got, w, rel_tol=1e-9), (got, w)
    frozen[100] = float("inf")  # a new non-finite element, in a later piece
    assert "1 NaN/inf element" in numerics.judge(eager, frozen, ref).problem
    diff, _, max_abs, close = numerics.judge_against_eager_call(eager, frozen, ref, v)
    assert diff == math.inf and not close


def test_the_eager_call_comparison_by_pieces(monkeypatch):
    eager, frozen, ref = _values(seed=1)
    verdict = numerics.judge(eager, frozen, ref)
    whole = numerics.judge_against_eager_call(eager, frozen, ref, verdict)
    monkeypatch.setattr(numerics, "CHUNK", 100)
    pieces = numerics.judge_against_eager_call(eager, frozen, ref, verdict)
    assert (
        all(math.isclose(a, b, rel_tol=1e-9) for a, b in zip(whole[:3], pieces[:3]))
        and whole[3] == pieces[3]
    )
    mask = torch.isfinite(eager) & torch.isfinite(ref)
    d = frozen[mask].double() - eager[mask].double()
    assert math.isclose(
        pieces[0],
        float(d.square().mean().sqrt())
        / max(
            float(ref[mask].square().mean().sqrt()),
            float(eager[mask].double().square().mean().sqrt()),
        ),
        rel_tol=1e-9,
    )


class _LargestWide(TorchDispatchMode):
    """The most elements of any fp64 tensor an op makes."""

    def __init__(self):
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {
            a.untyped_storage().data_ptr()
            for a in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        }
        for t in out if isinstance(out, (tuple, list)) else (out,):
            # new memory only: a view of an input is no temporary
            if (
                isinstance(t, torch.Tensor)
                and t.dtype == torch.float64
                and t.untyped_storage().data_ptr() not in given
            ):
                self.most = max(self.most, t.numel())
        return out


@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_no_fp64_temporary_is_larger_than_a_piece(monkeypatch, layout):
    monkeypatch.setattr(numerics, "CHUNK", 1000)
    g = torch.Generator().manual_seed(2)
    eager = torch.randn(250, 200, generator=g).bfloat16()
    frozen = (eager.float() + 1e-2).bfloat16()
    ref = eager.double() + 1e-3
    if layout == "transposed":  # results in another layout than their values' order
        eager, frozen, ref = eager.t(), frozen.t(), ref.t()
    want = numerics.judge(eager.contiguous(), frozen.contiguous(), ref.contiguous())
    with _LargestWide() as seen:
        v = numerics.judge(eager, frozen, ref)
        numerics.judge_against_eager_call(eager, frozen, ref, v)
    assert 0 < seen.most <= 1000, seen.most
    assert (
        math.isclose(v.frozen_error, want.frozen_error, rel_tol=1e-9) and v.max_abs == want.max_abs
    )
