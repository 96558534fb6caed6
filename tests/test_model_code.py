"""What model code does inside a captured function: tensor constants the
trace makes, torch.cond, buffers reassigned in forward, the eager fallback option
and torch.distributed. Each pair is captured here and loaded in this process
(frozen kernels from the cache, or the eager engine's graph)."""

from __future__ import annotations

import pytest

import precompile_build
from precompile_build.errors import CaptureError
from precompile_runtime import no_compilation

torch = pytest.importorskip("torch")

GLOBAL_W = torch.ones(3)


def _capture_and_load(tmp_path, fn, *args, engine="frozen"):
    """Capture ``fn(*args)`` into tmp_path and return (eager result, loaded callable)."""
    from _pairs import load_pair

    src, cache = tmp_path / "t.py", tmp_path / "t.cache"
    with precompile_build.capture(fn, engine=engine, artifact_path=src, cache_path=cache) as f:
        want = f(*args)
    loaded = load_pair(src, cache)
    assert loaded.uses_kernels == (engine == "frozen")

    def serve(*a, **kw):  # serving compiles nothing: the compiler's entry points raise
        with no_compilation():
            return loaded(*a, **kw)

    serve.metadata = loaded.metadata
    return want, serve


def _add_literal(x):
    return x + torch.tensor(2.0)


def _set_column(x):
    y = x.clone()
    y[:, 0] = 1.0
    return y


@pytest.mark.parametrize("engine", ["frozen", "eager"])
@pytest.mark.parametrize(
    "fn", [_add_literal, _set_column], ids=["tensor-literal", "setitem-scalar"]
)
def test_tensor_constants_made_by_the_function_are_served(tmp_path, fn, engine):
    x = torch.randn(2, 3)
    want, loaded = _capture_and_load(tmp_path, fn, x, engine=engine)
    assert len(loaded.metadata["constants"]) == 1  # carried in the source half
    torch.testing.assert_close(loaded(x), want)
    x2 = torch.randn(2, 3)  # the constant is no input: a new x, the same constant
    torch.testing.assert_close(loaded(x2), fn(x2))


def test_executing_a_cuda_pairs_source_touches_no_gpu(tmp_path):
    """The constants of a CUDA capture are placed at the first call, not when the
    source runs: load_packaged's fallback on a host without CUDA execs the source and
    gets a callable whose calls are refused with a CallError, not a RuntimeError."""
    from precompile_runtime import CallError

    _capture_and_load(tmp_path, _add_literal, torch.randn(2, 3), engine="eager")
    head, sep, rest = (tmp_path / "t.py").read_text().partition("# ---- the captured ATen graph")
    assert "'constants': [{" in head
    ns: dict = {"__name__": "pair"}  # the same pair as if captured on CUDA
    exec(compile(head.replace("'cpu'", "'cuda'") + sep + rest, "t.py", "exec"), ns)
    fn = ns["load"](None)
    assert ns["_CONSTS"] == {}  # nothing placed yet
    if not torch.cuda.is_available():
        with pytest.raises(CallError, match=r"device cpu \(captured cuda\)"):
            fn(torch.randn(2, 3))


def test_closed_over_tensors_are_still_refused(tmp_path):
    w = torch.randn(3)

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.full((3,), 2.0)  # a plain attribute, not a buffer

        def forward(self, x):
            return x * self.scale

    deep = torch.nn.Sequential(
        torch.nn.Sequential(torch.nn.Sequential(torch.nn.Sequential(Scaled())))
    )
    cases = [
        (lambda x: x + w, "closure variable 'w'"),
        (lambda x: x + GLOBAL_W, "global 'GLOBAL_W'"),
        (Scaled(), r"Scaled\.scale"),
        (lambda m, x: m(x), r"Sequential\.0\.0\.0\.0\.scale"),
    ]
    for i, (fn, where) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        with pytest.raises(CaptureError, match=rf"not an input \({where}.*register_buffer"):
            _capture_and_load(
                tmp_path / str(i), fn, *((deep,) if i == 3 else ()), torch.randn(2, 3)
            )
        assert not list((tmp_path / str(i)).iterdir())  # nothing written


# expected: torch.export fails on the case, make_fx traces it
@pytest.mark.filterwarnings("ignore::precompile_build.errors.TracerFallbackWarning")
def test_a_tensor_written_in_place_that_is_not_an_input_is_refused(tmp_path):
    hidden = [[[[[[torch.zeros(3)]]]]]]  # deeper than the search for closed-over tensors

    def bump(x):
        hidden[0][0][0][0][0][0].add_(1)
        return x + 1

    with pytest.raises(
        CaptureError,
        match=r"writes in place to a tensor that is not an input "
        r"\(_tensor_constant0\).*register_buffer",
    ):
        _capture_and_load(tmp_path, bump, torch.randn(3), engine="eager")


@pytest.mark.parametrize("engine", ["frozen", "eager"])
def test_torch_cond_is_served_with_both_branches(tmp_path, engine):
    def fn(x):
        return torch.cond(x.sum() > 0, lambda x: x.sin(), lambda x: x.cos(), (x,))

    x = torch.ones(2, 3)
    want, loaded = _capture_and_load(tmp_path, fn, x, engine=engine)
    torch.testing.assert_close(loaded(x), want)
    torch.testing.assert_close(loaded(-x), (-x).cos())  # the other branch, at serve time


def test_a_tensor_made_inside_a_cond_branch_is_refused(tmp_path):
    def fn(x):
        return torch.cond(x.sum() > 0, lambda x: x + torch.tensor(2.0), lambda x: x.cos(), (x,))

    with pytest.raises(
        CaptureError,
        match=r"the branch/body true_graph_0 of a control-flow operator "
        r"reads the tensor _tensor_constant0 .* pass it in the operands",
    ):
        _capture_and_load(tmp_path, fn, torch.ones(2, 3), engine="eager")


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.steps = self.steps + 1  # reassigned, not mutated in place
        return x * self.steps


@pytest.mark.parametrize("engine", ["frozen", "eager"])
def test_a_reassigned_buffer_is_updated_like_eager(tmp_path, engine):
    model, x = _Counter(), torch.ones(2)
    _, loaded = _capture_and_load(tmp_path, lambda m, x: m(x), model, x, engine=engine)
    served, eager = _Counter(), _Counter()
    got = [loaded(served, x)[0].item() for _ in range(3)]
    want = [eager(x)[0].item() for _ in range(3)]
    assert got == want == [1.0, 2.0, 3.0]
    assert served.steps.item() == eager.steps.item() == 3


def test_a_buffer_reassigned_with_another_shape_is_refused(tmp_path):
    class Grow(_Counter):
        def forward(self, x):
            self.steps = torch.cat([self.steps.view(1), self.steps.view(1)])
            return x

    with pytest.raises(CaptureError, match=r"reassigns buffer 'steps' with a value of shape \[2\]"):
        _capture_and_load(tmp_path, lambda m, x: m(x), Grow(), torch.ones(2))


def test_a_tensor_constant_with_a_dynamic_dim(tmp_path):
    x = torch.randn(4, 3)
    torch._dynamo.mark_dynamic(x, 0, min=1, max=16)
    _, loaded = _capture_and_load(tmp_path, _add_literal, x)
    for n in (1, 7):
        xn = torch.randn(n, 3)
        torch.testing.assert_close(loaded(xn), xn + 2.0)


class _Configured(torch.nn.Module):
    """Settings that are not parameters: a head count, an eps, an activation function
    (as transformers' configs set them on each layer)."""

    def __init__(self, heads=2, eps=1e-5, act=torch.nn.functional.gelu):
        super().__init__()
        self.heads, self.eps, self.act = heads, eps, act
        self.proj = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8, eps=eps)

    def forward(self, x):
        b, n = x.shape
        h = self.proj(x).view(b, self.heads, n // self.heads).softmax(-1).reshape(b, n)
        return self.act(self.norm(h))


def _copy_of(model, **settings):
    other = _Configured(**settings).eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("engine", ["frozen", "eager"])
@pytest.mark.parametrize(
    "settings, named",
    [
        # an attribute the trace read is named by the assumed-state check (assumed_state.py)
        ({"heads": 4}, r"m: heads was 2 at capture, now 4"),
        ({"eps": 1e-3}, r"eps was 1e-05 at capture, now 0.001"),  # also the LayerNorm's own eps
        # a function is no plain value: the settings check names it
        (
            {"act": torch.nn.functional.relu},
            r"m has other settings than the captured model "
            r"\(captured '[^']*act=\S*gelu",
        ),
    ],
)
def test_a_model_with_other_settings_and_the_same_parameters_is_refused(
    tmp_path, engine, settings, named
):
    """Equal parameters, another config: the frozen code has the captured settings
    built in, so the call is refused (naming the first difference), not served wrong."""
    from precompile_runtime import CallError

    model, x = _Configured().eval(), torch.randn(3, 8)
    want, serve = _capture_and_load(tmp_path, lambda m, x: m(x), model, x, engine=engine)
    torch.testing.assert_close(serve(model, x), want)
    torch.testing.assert_close(serve(_copy_of(model), x), want)  # same settings: served
    other = _copy_of(model, **settings)
    assert not torch.allclose(other(x), want, atol=1e-6)  # eager really differs
    with pytest.raises(CallError, match=named):
        serve(other, x)


class _Counting(torch.nn.Module):
    """A forward that counts its calls in a public attribute: state, not a setting."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.drop = torch.nn.Dropout(0)
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        self.calls += 1
        return self.drop(self.proj(x))


# expected: the case changes Python state while it is captured
@pytest.mark.filterwarnings("ignore::precompile_build.errors.PythonStateWarning")
def test_settings_that_are_state_or_equal_numbers_are_not_refused(tmp_path):
    """No false refusals: an attribute the function itself changes (a call counter) is
    state, not a setting; ``Dropout(0)`` and ``Dropout(0.0)`` are one setting."""
    model, x = _Counting().eval(), torch.randn(2, 4)
    want, serve = _capture_and_load(tmp_path, lambda m, x: m(x), model, x, engine="eager")
    torch.testing.assert_close(serve(model, x), want)  # the captured model, counter moved on
    fresh = _Counting().eval()
    fresh.load_state_dict(model.state_dict())
    fresh.drop.p = 0.0
    torch.testing.assert_close(serve(fresh, x), want)
    assert serve.metadata["module_state"] == [[".:calls"]]
