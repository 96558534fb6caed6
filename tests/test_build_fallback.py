"""`fallback = "eager"` on a target: a compiler (Inductor) crash falls back to the
eager engine, visible in the build summary, the manifest and `inspect`; without it
the capture fails with a message that names the option."""

from __future__ import annotations

import json

import pytest
from _build_helpers import make_project

from precompile_build.cli import main

pytestmark = pytest.mark.usefixtures("build_env")

pytest.importorskip("torch")

CRASH = '[tool.precompile.targets.crash]\nscript = "capture/inductor_crash.py"\ntimeout = 300\n'


def test_compiler_crash_falls_back_to_eager_when_the_target_says_so(tmp_path, capsys):
    root = make_project(tmp_path, CRASH + 'fallback = "eager"\n')
    out = tmp_path / "out"
    assert main(["capture", "--project", str(root), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "eager (fallback: target 'crash': Inductor failed: InductorError" in err
    (variant,) = json.loads((out / "manifest.json").read_text())["targets"]["crash"]["variants"]
    assert variant["engine"] == "eager"
    assert variant["fallback"]["from"] == "frozen" and "KeyError" in variant["fallback"]["reason"]
    assert main(["inspect", str(out)]) == 0
    assert (
        "fallback from frozen: target 'crash': Inductor failed: InductorError"
        in capsys.readouterr().out
    )
    ns: dict = {"__name__": "pair"}
    exec(compile((out / "crash.py").read_text(), "crash.py", "exec"), ns)
    import torch

    x = torch.randn(2, 3)
    torch.testing.assert_close(ns["load"](None)(x), (x * 2).softmax(-1))


def test_compiler_crash_without_the_option_names_it(tmp_path, capsys):
    root = make_project(tmp_path, CRASH)
    assert main(["capture", "--project", str(root), "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert "upstream torch bug, not your code" in err
    assert 'set `fallback = "eager"` in its [tool.precompile.targets.crash] table' in err


def test_fallback_values_are_checked(tmp_path):
    from precompile_build.config.settings import load_settings
    from precompile_build.errors import ConfigError

    root = make_project(tmp_path, CRASH + 'fallback = "eagre"\n')
    with pytest.raises(
        ConfigError,
        match=r"`tool.precompile.targets.crash.fallback` must be one of "
        r"'none', 'eager', not 'eagre'",
    ):
        load_settings(root)


# expected: the case changes Python state while it is captured
@pytest.mark.filterwarnings("ignore::precompile_build.errors.PythonStateWarning")
def test_the_fallback_judges_the_frozen_engines_trace_by_the_one_real_call(tmp_path, monkeypatch):
    """The eager fallback serves the trace the frozen engine made and judges it by the
    real call that already ran (before, it traced again after the real call, ran no
    eager-call check, and a stateful call's trace saw the state after the call): a
    branch hidden from the trace is refused, and the function runs for real once."""
    import torch

    import precompile_build
    from precompile_build.capturing.tracing import trace_call
    from precompile_build.engines import frozen
    from precompile_build.errors import CaptureError, CompilerFailed

    def crash(*a, **k):
        raise CompilerFailed("target 't': Inductor failed: KeyError: 'buf1' (simulated)")

    monkeypatch.setattr(frozen, "_compile", crash)
    calls = []

    def hidden_branch(x):
        calls.append(1)
        if not torch.compiler.is_compiling() and x.sum() > 0:
            return x * 2
        return x - 1

    x = torch.ones(3)
    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with pytest.raises(
        CaptureError,
        match=r"the traced graph's value 0 differs from what the eager call "
        r"returned at capture",
    ):
        with precompile_build.capture(
            hidden_branch, engine="frozen", fallback="eager", target="t", **paths
        ) as f:
            f(x)
    assert not paths["artifact_path"].exists()

    def doubled_softmax(x):
        calls.append(1)
        return (x * 2).softmax(-1)

    calls.clear()
    trace_call(doubled_softmax, (x,), {}, target="t")
    one_trace = len(calls)  # the runs of one trace (the one-pass export runs the code twice)
    calls.clear()
    with precompile_build.capture(
        doubled_softmax, engine="frozen", fallback="eager", target="t", **paths
    ) as f:
        assert torch.equal(f(x), (x * 2).softmax(-1))
    assert (
        len(calls) == one_trace + 1
    )  # one trace, then the real call: the fallback traced nothing again
    assert f.engine == "eager" and "KeyError: 'buf1'" in paths["artifact_path"].read_text()
