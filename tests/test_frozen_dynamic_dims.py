"""The frozen and eager engines with dims marked dynamic (torch._dynamo.mark_dynamic)
on CPU: marks the captured code cannot serve are capture errors with nothing written,
pairs serve every size of their range like eager and refuse the rest by name."""

from __future__ import annotations

import linecache
import re

import pytest

import precompile_build
from precompile_build.errors import CaptureError

torch = pytest.importorskip("torch")

from _pairs import capture_and_load, load_pair_at, marked, pair_paths  # noqa: E402


@pytest.mark.parametrize(
    "fn, x, message",
    [
        (
            lambda x: x.view(4, 2, 4).sum(1),
            marked(4, 8),
            r"argument 'x' dim 0 is marked dynamic but the "
            r"captured code specialised it to 4",
        ),
        (
            lambda x: x * 2 if x.shape[0] > 8 else x + 1,
            marked(4, 8),
            r"marked dynamic in \[1, inf\] but the "
            r"captured code only holds for \[1, 8\].*mark_dynamic\(t, 0, min=1, max=8\)",
        ),
        (
            lambda x: x + 1,
            marked(4, 8, lo=5, hi=9),
            r"marked dynamic in \[5, 9\] but the example has size 4",
        ),
        (lambda x: x + 1, marked(4, 8, lo=3, hi=2), r"empty range \[3, 2\]"),
        (lambda x: x + 1, marked(4, 8, lo=-3, hi=9), r"marked with min=-3; sizes start at 0"),
        (
            lambda x: x + 1,
            marked(4, 8, lo=4, hi=4),
            r"one-size range \[4, 4\]: that is a static size",
        ),
        (
            lambda x: x * 2 if x.shape[0] % 2 == 0 else x + 1,
            marked(4, 8, hi=64),
            r"target 'dyn': argument 'x' dim 0 is marked dynamic in \[1, 64\] but the captured code relies on "
            r"\(size % 2\) == 0 \(sizes \[1, 3, 5, 7\] break it\)",
        ),
        (
            lambda x: (x * 2, x.shape[0]),
            marked(4, 8),
            r"target 'dyn': the result's part result\[1\] is a Python number computed while tracing \(SymInt",
        ),
    ],
)
def test_a_dynamic_dim_the_code_cannot_serve_is_a_capture_error(tmp_path, fn, x, message):
    with pytest.raises(CaptureError, match=message):
        with precompile_build.capture(
            fn, engine="eager", target="dyn", **pair_paths(tmp_path)
        ) as f:
            f(x)
    assert not list(tmp_path.iterdir())  # nothing half-written


@pytest.mark.parametrize(
    "fn, x, message",
    [
        # eager squeezes dim 0 at size 1 only: the pair is refused at the range's low end
        (
            lambda x: x.squeeze(0) + 1,
            marked(4, 8, hi=16),
            r"differs from the traced graph on sizes argument 'x' "
            r"dim 0 = 1;.*narrow the marks \(min=, max=\)",
        ),
        # amax over an empty dim fails in eager too
        (
            lambda x: x.amax(0),
            marked(4, 8, lo=0, hi=64),
            r"the captured function itself fails at sizes "
            r"argument 'x' dim 0 = 0 \(IndexError.*declare ranges that exclude these sizes",
        ),
    ],
)
def test_a_pair_that_fails_inside_its_range_is_never_written(tmp_path, fn, x, message):
    with pytest.raises(CaptureError, match=message):
        with precompile_build.capture(
            fn, engine="frozen", target="dyn", **pair_paths(tmp_path)
        ) as f:
            f(x)
    assert not list(tmp_path.iterdir())


def test_batchnorm_training_with_a_dynamic_batch(tmp_path):
    # BatchNorm's running_var uses N/(N-1): Python float math on the dynamic size
    import copy

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16)).train()
    x = marked(6, 8, lo=2, hi=32)
    with precompile_build.capture(lambda m, x: m(x), engine="frozen", **pair_paths(tmp_path)) as f:
        f(copy.deepcopy(model), x)
    served, eager, fn = copy.deepcopy(model), copy.deepcopy(model), load_pair_at(tmp_path)
    assert fn.uses_kernels
    with torch.no_grad():
        for n in (2, 3, 17, 32):
            xn = torch.randn(n, 8)
            torch.testing.assert_close(fn(served, xn), eager(xn))
    for (name, b), c in zip(served.named_buffers(), eager.buffers()):
        torch.testing.assert_close(b, c, msg=name)  # running statistics and the batch counter


def test_layouts_the_example_had_are_served(tmp_path):
    # a slice with gaps, captured without marks: compiled for that layout, served in it
    x = torch.randn(6, 16)[:, :8]
    fn = capture_and_load(tmp_path / "slice", lambda x: x * 3, x)
    y = torch.randn(6, 16)[:, :8]
    torch.testing.assert_close(fn(y), y * 3)
    from precompile_runtime import CallError

    with pytest.raises(CallError, match=r"stride \[8, 1\] \(captured \[16, 1\]"):
        fn(torch.randn(6, 8))
    # a dim of size 1 may have any stride (it is never stepped along), as in eager
    ids = torch.randint(0, 20, (3, 5))
    torch._dynamo.mark_dynamic(ids, 0, min=1, max=16)
    torch._dynamo.mark_dynamic(ids, 1, min=1, max=16)
    emb = torch.nn.Embedding(20, 4)
    fn = capture_and_load(tmp_path / "size1", lambda m, ids: m(ids) * 2, emb, ids)
    last = torch.randint(0, 20, (1, 9))[:, -1:]  # shape [1, 1], stride [9, 1]
    with torch.no_grad():
        torch.testing.assert_close(fn(emb, last), emb(last) * 2)


def test_size_one_is_refused_at_capture_or_served_correctly(tmp_path):
    # Attention's output, transposed back and reshaped, has other strides at size 1.
    # torch 2.13's compiler then guards on size != 1: the capture must be refused,
    # naming the range that works. Where a torch's compiler adds no such guard, the
    # pair must serve size 1 like eager.
    def fn(x):
        q = x.view(1, x.shape[0], 2, 2).transpose(1, 2)
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        return y.transpose(1, 2).reshape(x.shape[0], 4)

    x = marked(3, 4)
    try:
        with precompile_build.capture(
            fn, engine="frozen", target="dyn", **pair_paths(tmp_path)
        ) as f:
            f(x)
    except CaptureError as e:
        assert re.search(
            r"only holds for \[2, inf\] \(its strides or kernels differ at size 1.*"
            r"min=2, max=None",
            str(e),
        ), str(e)
        assert not list(tmp_path.iterdir())  # nothing half-written
        return
    served = load_pair_at(tmp_path)
    for n in (1, 2, 5):
        xn = torch.randn(n, 4)
        torch.testing.assert_close(served(xn), fn(xn))


def test_eager_engine_serves_dynamic_dims_from_the_graph(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = marked(4, 8, lo=1, hi=32)
    with precompile_build.capture(
        lambda m, x: m(x).cumsum(0), engine="eager", **pair_paths(tmp_path)
    ) as f:
        f(model, x)
    from precompile_runtime import CallError

    fn = load_pair_at(tmp_path)  # an eager pair: no kernels, the graph runs
    with torch.no_grad():
        for n in (1, 4, 32):
            xn = torch.randn(n, 8)
            torch.testing.assert_close(fn(model, xn), model(xn).cumsum(0))
    with pytest.raises(CallError, match=r"size 33 is outside the range \[1, 32\]"):
        fn(model, torch.randn(33, 8))


def test_a_mark_on_a_parameter_is_ignored_with_a_warning(tmp_path):
    lin = torch.nn.Linear(4, 4)
    torch._dynamo.mark_dynamic(lin.weight, 0)
    with pytest.warns(
        UserWarning, match=r"target 'p': a parameter/buffer is marked dynamic; parameters keep"
    ) as rec:
        with precompile_build.capture(
            lambda m, x: m(x), engine="eager", target="p", **pair_paths(tmp_path)
        ) as f:
            f(lin, torch.randn(2, 4))
    # attributed to the user's line, not to the engine's code that noticed
    assert [
        linecache.getline(w.filename, w.lineno).strip()
        for w in rec
        if "marked dynamic" in str(w.message)
    ] == ["f(lin, torch.randn(2, 4))"]
    assert (tmp_path / "t.py").exists()


def test_a_gapped_example_with_dynamic_dims_is_refused(tmp_path):
    x = torch.randn(6, 16)[:, :8]  # a slice: its row stride does not follow from its sizes
    torch._dynamo.mark_dynamic(x, 0, min=1, max=16)
    with pytest.raises(
        CaptureError,
        match=r"argument 'x' has dims marked dynamic but is a view with "
        r"gaps \(shape \[6, 8\], stride \[16, 1\]\).*pass a dense example",
    ):
        with precompile_build.capture(
            lambda x: x * 3, engine="frozen", **pair_paths(tmp_path)
        ) as f:
            f(x)
    assert not list(tmp_path.iterdir())


def test_conditions_with_float_size_math_are_checked_per_call(tmp_path):
    def f(x, y):
        return x * 2 if x.shape[1] >= 0.75 * y.shape[1] else x + 1

    x, y = marked(2, 6, 4, hi=32, dims=(1,)), marked(2, 7, 4, hi=33, dims=(1,))
    fn = capture_and_load(tmp_path / "pair", f, x, y)
    a, b = torch.randn(2, 9, 4), torch.randn(2, 10, 4)
    torch.testing.assert_close(fn(a, b), f(a, b))
    from precompile_runtime import CallError

    with pytest.raises(
        CallError, match=r"argument 'x' dim 1\), .*argument 'y' dim 1\) break the condition"
    ):
        fn(torch.randn(2, 3, 4), b)
