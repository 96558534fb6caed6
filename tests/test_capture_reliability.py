"""What the capture says about the function itself: an error the function
raises eagerly too is the function's, not a tracer's; Python state the call changes
is warned about (PythonStateWarning), naming the object."""

from __future__ import annotations

import re
import sys
import traceback

import pytest

torch = pytest.importorskip("torch")

import precompile_build  # noqa: E402
from precompile_build.errors import CaptureError  # noqa: E402


def _capture(tmp_path, fn, *args, name="t", **kw):
    src, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    with precompile_build.capture(fn, artifact_path=src, cache_path=cache, target=name, **kw) as f:
        out = f(*args)
    return src, cache, out


# -- item 5: the function's own error -------------------------------------------------


def float_targets(logits, y):
    return torch.nn.functional.cross_entropy(logits, y)  # class indices must be integers


class Mismatched(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.proj(x)  # x has 5 features


@pytest.mark.parametrize("case", ["cross_entropy", "shapes"])
@pytest.mark.parametrize("tracer", ["auto", "make_fx"])
def test_an_error_the_function_raises_eagerly_is_the_functions(tmp_path, case, tracer):
    """F.cross_entropy with float class targets (the issue), and a sibling: a Linear
    fed the wrong feature count. Both fail eagerly too: the capture says it is the
    function's error, chained to the function's own exception (its traceback, ending
    in the user's line, is printed first), not "tracing failed ... try another tracer"."""
    if case == "cross_entropy":
        fn, args, line = (
            float_targets,
            (torch.randn(2, 3), torch.tensor([1.0, 0.0])),
            "cross_entropy(logits, y)",
        )
        # torch's own words (2.13/2.14.1: "expected target dtype to be Long ..."; 2.11:
        # "expected scalar type Long but found Float")
        said = r"expected (target dtype to be|scalar type) Long"
    else:
        fn, args, line = (
            (lambda m, x: m(x)),
            (Mismatched(), torch.randn(2, 5)),
            "return self.proj(x)",
        )
        said = r"mat1 and mat2 shapes cannot be multiplied"
    with pytest.raises(
        CaptureError,
        match=rf"target 't': the function itself raises RuntimeError: {said}.*"
        r"also when called eagerly.*not a tracing problem",
    ) as info:
        _capture(tmp_path, fn, *args, tracer=tracer)
    assert "try another tracer" not in str(info.value)
    own = info.value.__cause__
    assert isinstance(own, RuntimeError) and own.__context__ is None  # no tracer error before it
    frames = traceback.extract_tb(own.__traceback__)
    assert any(line in (f.line or "") for f in frames), [f.line for f in frames]
    assert not (tmp_path / "t.py").exists() and not (tmp_path / "t.cache").exists()


def test_a_tracer_failure_of_a_function_that_runs_eagerly_is_still_the_tracers(tmp_path):
    """The eager call works (a data-dependent branch export cannot trace): the
    tracers' own error stands."""

    def branchy(x):
        if x.sum() > 0:
            return x * 2
        return x - 1

    with pytest.raises(CaptureError, match=r"tracing failed on a data-dependent branch") as info:
        _capture(tmp_path, branchy, torch.ones(3), tracer="export")
    assert "the function itself raises" not in str(info.value)


# -- item 1: Python state the call changes --------------------------------------------

LOG: list = []
CALLS = 0
SCALE = 2.0


class Settings:
    def __init__(self):
        self.steps = 0


SETTINGS = Settings()


def appends(x):
    LOG.append(x.shape[0])
    return x * 2


def bumps_a_global(x):
    global CALLS
    CALLS += 1
    return x * 2


def sets_an_attribute(x):
    SETTINGS.steps += 1
    return x * 2


def counter():
    count = 0

    def step(x):
        nonlocal count
        count += 1
        return x * 2

    return step


class CountingModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.proj(x)


def _warned(tmp_path, fn, *args, **kw) -> list[str]:
    import warnings

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        _capture(tmp_path, fn, *args, **kw)
    return [
        str(w.message) for w in rec if issubclass(w.category, precompile_build.PythonStateWarning)
    ]


@pytest.mark.parametrize("engine", ["eager", "frozen"])
@pytest.mark.parametrize(
    "case, said, line",
    [
        (
            "list",
            r"the global `LOG` of module test_capture_reliability: 0 items before the capture, "
            r"(\d+) items after",
            "LOG.append(x.shape[0])",
        ),
        (
            "global",
            r"the global `CALLS` of module test_capture_reliability: 0 before the capture, (\d+) after",
            "CALLS += 1",
        ),
        (
            "attribute",
            r"attribute `steps` of the global `SETTINGS` of module test_capture_reliability: 0 "
            r"before the capture, (\d+) after",
            "SETTINGS.steps += 1",
        ),
        (
            "closure",
            r"the closure variable `count` of counter.<locals>.step: 0 before the capture, (\d+) after",
            "count += 1",
        ),
        (
            "module",
            r"attribute `calls` of the module CountingModule \(argument 0\): 0 before the capture, "
            r"(\d+) after",
            "self.calls += 1",
        ),
    ],
)
def test_python_state_the_call_changes_is_warned_with_its_line(
    tmp_path, monkeypatch, engine, case, said, line
):
    """A module-level list appended to, a global counter, an attribute of a plain
    object, a closure counter, and (a sibling) a counter on the user's own module:
    each named, with the line that changes it and the value it has after the capture
    (the trace, which may run the function more than once, and the real call ran)."""
    import linecache

    global CALLS
    monkeypatch.setattr(SETTINGS, "steps", 0)
    monkeypatch.setattr(sys.modules[__name__], "CALLS", 0)
    LOG.clear()
    fn, args = {
        "list": (appends, (torch.ones(2),)),
        "global": (bumps_a_global, (torch.ones(2),)),
        "attribute": (sets_an_attribute, (torch.ones(2),)),
        "closure": (counter(), (torch.ones(2),)),
        "module": (lambda m, x: m(x), (CountingModule(), torch.ones(2, 3))),
    }[case]
    (text,) = _warned(tmp_path, fn, *args, engine=engine)
    said = re.search(
        rf"target 't': the function changed Python state while it was captured: {said}", text
    )
    after = {
        "list": lambda: len(LOG),
        "global": lambda: CALLS,
        "attribute": lambda: SETTINGS.steps,
        "closure": lambda: fn.__closure__[fn.__code__.co_freevars.index("count")].cell_contents,
        "module": lambda: args[0].calls,
    }[case]()
    assert said and int(said.group(1)) == after >= 2, text
    at = re.search(r"\(at (.*):(\d+)\)", text)
    assert (
        at
        and at.group(1) == __file__
        and linecache.getline(__file__, int(at.group(2))).strip() == line
    ), text
    assert "never when the pair is served" in text


def reads_state(x):
    return x * SCALE + len(LOG)


class Plain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(3, 3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(torch.relu(self.proj(x)))


@pytest.mark.parametrize("case", ["reads", "module", "training"])
def test_a_call_that_changes_no_python_state_is_not_warned(tmp_path, case):
    """Reading globals, a module with a dropout and a ReLU (torch's own modules and
    RNG), a training step (backward, .grad): no PythonStateWarning."""
    if case == "reads":
        fn, args = reads_state, (torch.ones(2),)
    elif case == "module":
        fn, args = (lambda m, x: m(x)), (Plain().eval(), torch.ones(2, 3))
    else:

        def step(m, x):
            loss = m(x).sum()
            loss.backward()
            return loss.detach()

        fn, args = step, (Plain().train(), torch.ones(2, 3))
    assert _warned(tmp_path, fn, *args) == []


# -- item 2: the name an edited editable install calls instead of the stale pair ------


@pytest.mark.parametrize(
    "how, recorded",
    [
        ("module function", {"module": "test_capture_reliability", "qualname": "reads_state"}),
        ("class attribute", {"module": "test_capture_reliability", "qualname": "Steps.double"}),
        ("lambda", None),
        ("nested", None),
    ],
)
def test_the_capture_records_the_functions_importable_name(tmp_path, how, recorded):
    """The cache envelope's ``meta["function"]``: set where importing the module and
    following the qualname gives the captured function itself, else absent."""
    from precompile_runtime import envelope

    def nested(x):
        return x * 2

    fn = {
        "module function": reads_state,
        "class attribute": Steps.double,
        "lambda": lambda x: x * 2,
        "nested": nested,
    }[how]
    _, cache, _ = _capture(tmp_path, fn, torch.ones(2), engine="eager")
    assert envelope.loads(cache.read_bytes()).meta.get("function") == recorded


class Steps:
    @staticmethod
    def double(x):
        return x * 2
