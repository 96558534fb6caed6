"""`fallback = "eager"` on a target: a compiler (Inductor) crash falls back to the
eager engine, visible in the build summary, the manifest and `inspect`; without it
the capture fails with a message that names the option (issue 18, item 5)."""

from __future__ import annotations

import json

import pytest

from _build_helpers import _clean_env, host_fp_json, make_project  # noqa: F401
from precompile_build.cli import main

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
    assert "fallback from frozen: target 'crash': Inductor failed: InductorError" in capsys.readouterr().out
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
    from precompile_build.errors import ConfigError
    from precompile_build.settings import load_settings

    root = make_project(tmp_path, CRASH + 'fallback = "eagre"\n')
    with pytest.raises(ConfigError, match=r"`tool.precompile.targets.crash.fallback` must be one of "
                                          r"'none', 'eager', not 'eagre'"):
        load_settings(root)
