"""What the capture says about the function itself (issue 27): an error the function
raises eagerly too is the function's, not a tracer's; Python state the call changes
is warned about (PythonStateWarning), naming the object."""

from __future__ import annotations

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
        fn, args, line = float_targets, (torch.randn(2, 3), torch.tensor([1.0, 0.0])), "cross_entropy(logits, y)"
        said = r"expected target dtype to be Long"
    else:
        fn, args, line = (lambda m, x: m(x)), (Mismatched(), torch.randn(2, 5)), "return self.proj(x)"
        said = r"mat1 and mat2 shapes cannot be multiplied"
    with pytest.raises(CaptureError, match=rf"target 't': the function itself raises RuntimeError: {said}.*"
                       r"also when called eagerly.*not a tracing problem") as info:
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
