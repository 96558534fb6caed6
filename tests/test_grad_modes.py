"""The caller's grad mode and deterministic algorithms, per served call.

A pair returns results without autograd history. A trace that ran under the caller's
``torch.no_grad()`` is refused when called with grad enabled where an input or
parameter requires grad (eager's result would carry the gradient, the served one
would silently cut it); a function that turns grad off in its own body returns the
same whatever the caller's mode and is served. Captured with the eager engine (the
driver is the same code for both engines) except the issue's own case, which runs
the frozen kernels too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import precompile_build  # noqa: E402
from precompile_runtime.errors import CallError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from _pairs import load_pair_at, pair_paths  # noqa: E402

nn = torch.nn


def _capture(tmp_path, fn, *args, engine="eager", grad=True, **kw):
    with torch.set_grad_enabled(grad):
        with precompile_build.capture(fn, engine=engine, **pair_paths(tmp_path), **kw) as f:
            f(*args)
    return load_pair_at(tmp_path)


def apply(m, x):
    return m(x)


@pytest.mark.parametrize("engine", ["eager", "frozen"])
def test_a_no_grad_capture_called_with_grad_is_refused_naming_the_mode(tmp_path, engine):
    """The issue's case: `(f(m, x).sum() + (m(x) ** 2).sum()).backward()` left the
    weight gradients off eager's, silently; now refused, and served under no_grad."""
    torch.manual_seed(0)
    m, x = nn.Linear(4, 4), torch.randn(3, 4)
    f = _capture(tmp_path, apply, m, x, engine=engine, grad=False)
    with pytest.raises(
        CallError,
        match=r"called with grad enabled and parameter/buffer m.weight requiring "
        r"grad, but captured under torch.no_grad\(\).*Call it under torch.no_grad\(\)",
    ):
        (f(m, x).sum() + (m(x) ** 2).sum()).backward()
    assert m.weight.grad is None  # refused before anything ran
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx():
            torch.testing.assert_close(f(m, x), m(x))
    # grad enabled but nothing requires grad: eager's result has no history either
    m.requires_grad_(False)
    torch.testing.assert_close(f(m, x), m(x))
    # an input that requires grad is named too
    m2 = nn.Linear(4, 4).requires_grad_(False)
    with pytest.raises(CallError, match="tensor input #0 requiring grad"):
        f(m2, torch.randn(3, 4, requires_grad=True))


def self_contained(m, x):
    with torch.no_grad():
        return m(x).relu()


class Decorated(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    @torch.no_grad()
    def forward(self, x):
        return self.fc(x) * 2


@torch.no_grad()
def decorated(m, x):
    return m(x) * 2


def set_off(m, x):
    torch.set_grad_enabled(False)
    try:
        return m(x) - 1
    finally:
        torch.set_grad_enabled(True)


def in_inference(m, x):
    with torch.inference_mode():
        return m(x) + 1


@pytest.mark.parametrize(
    "fn",
    [self_contained, decorated, set_off, in_inference],
    ids=["with-no_grad", "decorated", "set_grad_enabled", "inference_mode"],
)
def test_a_function_that_turns_grad_off_itself_is_served_in_any_mode(tmp_path, fn):
    """The example project's `with torch.no_grad():` forward, and its siblings (a
    `@torch.no_grad()` function, `torch.set_grad_enabled(False)`, `torch.inference_mode()`):
    their result does not depend on the caller's mode."""
    m, x = nn.Linear(4, 4), torch.randn(3, 4)
    # (Dynamo's guards refuse a decorated function's closure: the recorder checks this one)
    f = _capture(tmp_path, fn, m, x, grad=False)
    assert not f.metadata["ambient"].get("grad_off")
    want = fn(m, x)
    assert not want.requires_grad
    torch.testing.assert_close(f(m, x), want)  # grad enabled, parameters require grad
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), want)


def test_a_module_captured_as_the_function_with_a_no_grad_forward_is_served(tmp_path):
    m, x = Decorated(), torch.randn(3, 4)
    f = _capture(tmp_path, m, x, grad=False)
    assert not f.metadata["ambient"].get("grad_off")
    torch.testing.assert_close(f(x), m(x))


class WithRotary(nn.Module):
    """A layer whose helper is `@torch.no_grad()` (as transformers' rotary embeddings
    are): the rest of the model stays differentiable."""

    def __init__(self):
        super().__init__()
        self.fc, self.rot = nn.Linear(4, 4), Decorated()

    def forward(self, x):
        return self.fc(x) * self.rot(x)


def test_a_called_layers_no_grad_does_not_make_the_function_self_contained(tmp_path):
    m, x = WithRotary(), torch.randn(3, 4)
    f = _capture(tmp_path, apply, m, x, grad=False)
    assert f.metadata["ambient"].get("grad_off") is True
    assert apply(m, x).requires_grad  # eager's result carries the gradient of fc
    with pytest.raises(
        CallError, match="called with grad enabled and parameter/buffer m.fc.weight"
    ):
        f(m, x)
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), m(x))


def test_torch_helpers_that_turn_grad_off_do_not_count(tmp_path):
    """A torch helper decorated with no_grad (nn.init) inside the body is not the
    body turning grad off: the capture under no_grad is still checked."""

    def init_then_apply(m, x, w):
        nn.init.ones_(w)
        return m(x) * w

    m, x, w = nn.Linear(4, 4), torch.randn(3, 4), torch.empty(4)
    f = _capture(tmp_path, init_then_apply, m, x, w, grad=False)
    assert f.metadata["ambient"].get("grad_off") is True
    with pytest.raises(CallError, match="called with grad enabled"):
        f(m, x, w)


def test_a_capture_with_grad_is_not_checked_for_grad_mode(tmp_path):
    m, x = nn.Linear(4, 4), torch.randn(3, 4)
    f = _capture(tmp_path, apply, m, x, grad=True)
    assert "grad_off" not in f.metadata["ambient"]
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), m(x))
    torch.testing.assert_close(f(m, x), m(x).detach())


def test_deterministic_algorithms_are_recorded(tmp_path):
    """Recorded at capture; a CUDA capture made without them is refused under them
    (tests/test_gpu_* cover the call); a CPU pair serves in either setting."""
    m, x = nn.Linear(4, 4), torch.randn(3, 4)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    (tmp_path / "a").mkdir()
    try:
        f = _capture(tmp_path / "a", apply, m, x, grad=False)
    finally:
        torch.use_deterministic_algorithms(before)
    assert f.metadata["ambient"].get("deterministic") is True
    g = _capture(tmp_path, apply, m, x, grad=False)
    assert "deterministic" not in g.metadata["ambient"]
    torch.use_deterministic_algorithms(True)
    try:
        with torch.no_grad():
            torch.testing.assert_close(g(m, x), m(x))
    finally:
        torch.use_deterministic_algorithms(before)


def test_a_cuda_capture_without_deterministic_algorithms_is_refused_under_them(tmp_path):
    """The check itself, on a CPU pair whose recorded device is rewritten to cuda (no
    GPU needed: the refusal comes before anything runs)."""
    m, x = nn.Linear(4, 4), torch.randn(3, 4)
    _capture(tmp_path, apply, m, x, grad=False)
    src = (tmp_path / "t.py").read_text()
    ns: dict = {"__name__": "pair"}
    exec(compile(src, "t.py", "exec"), ns)
    ns["_NOT_DETERMINISTIC"] = ns["_MODES_CHECKED"] = True
    f = ns["load"](None)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with (
            torch.no_grad(),
            pytest.raises(
                CallError,
                match=r"called with torch.use_deterministic_algorithms"
                r"\(True\), but captured without it",
            ),
        ):
            f(m, x)
    finally:
        torch.use_deterministic_algorithms(before)
    with torch.no_grad():
        torch.testing.assert_close(f(m, x), m(x))
