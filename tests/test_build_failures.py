"""Capture scripts that fail: required targets fail the build (target, reason, log
tail, no wheel left); optional ones are left out with a warning and recorded."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from _build_helpers import (
    PYC,
    build,
    check_record,
    make_project,
    manifest_of,
    target_toml,
    wheel_names,
)

from precompile_build.builder import runner
from precompile_build.builder.runner import CaptureWarning
from precompile_build.errors import CaptureError, ScriptFailed
from precompile_build.wheels.inspect_cmd import format_report, inspect_report

pytestmark = pytest.mark.usefixtures("build_env")

CASES = {
    "raise": ("exited with status 1", "RuntimeError: boom from capture script"),
    "exit": ("exited with status 3", "fixture capture of double (mode exit)"),
    "segv": ("killed by signal SIGSEGV (11)", "fixture capture of double (mode segv)"),
    "source-only": ("wrote only double.py, not double.cache", "mode source-only"),
    "cache-only": ("wrote only double.cache, not double.py", "mode cache-only"),
    "badhash": ("code_hash mismatch", "mode badhash"),
    "nothing": ("wrote neither half of the pair", "mode nothing"),
    "spam": ("exited with status 1", "last words before failing"),
}


@pytest.mark.parametrize("mode", sorted(CASES))
def test_required_failure_fails_build(tmp_path, monkeypatch, mode):
    reason, log_line = CASES[mode]
    root = make_project(tmp_path, target_toml(mode=mode))
    with pytest.raises(CaptureError) as e:
        build(root, monkeypatch)
    msg = str(e.value)
    assert msg.startswith("Capture of target 'double' failed: ")
    assert reason in msg and log_line in msg and "last 40 lines of its log (whole log: " in msg
    assert len(msg) < 40 * 420 + 2000  # megabytes of output are not all in the message
    assert list((tmp_path / "dist").iterdir()) == []
    assert not (root / "simplepkg" / "_precompiled").exists()


def test_the_error_comes_from_the_process_not_from_what_it_printed(tmp_path, monkeypatch):
    """The script's process reports the exception that ended it; a traceback it only
    printed is output, not its error. The error carries its data as fields."""
    root = make_project(tmp_path, target_toml(mode="faketrace"))
    with pytest.raises(ScriptFailed) as e:
        build(root, monkeypatch)
    assert str(e.value).splitlines()[0] == "Capture of target 'double' failed: exited with status 3"
    assert "PrintedError: only printed" in str(e.value)  # in the log tail
    assert (e.value.target, e.value.detail) == ("double", "exited with status 3")
    assert e.value.seconds > 0


def test_hang_times_out_and_kills_the_tree(tmp_path, monkeypatch):
    pid_file = tmp_path / "child.pid"
    root = make_project(
        tmp_path,
        "[tool.precompile.targets.double]\n"
        'script = "capture/pair.py"\ntimeout = 3\n'
        f'args = ["--mode", "hang", "--pid-file", "{pid_file}"]\n',
    )
    start = time.monotonic()
    with pytest.raises(CaptureError, match=r"'double' failed: timed out after 3 s"):
        build(root, monkeypatch)
    assert time.monotonic() - start < 30
    child = int(pid_file.read_text())
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{child}/stat") as f:
            if f.read().split(")")[1].split()[0] == "Z":
                break
        time.sleep(0.1)
    else:
        pytest.fail(f"child process {child} of the hung script is still alive")
    assert list((tmp_path / "dist").iterdir()) == []


def test_cuda_target_on_host_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "cuda_available", lambda: False)
    root = make_project(tmp_path, target_toml(extra='device = "cuda"'))
    with pytest.raises(CaptureError, match="'double' failed: needs CUDA .* no CUDA GPU"):
        build(root, monkeypatch)
    assert list((tmp_path / "dist").iterdir()) == []


def test_the_scripts_error_line_is_in_the_reason_whole(tmp_path, monkeypatch):
    """The first line of the script's exception (a CaptureError's text) is part of the
    reason, whole: log lines are cut at 400 characters, before the advice at its end."""
    root = make_project(tmp_path, target_toml(mode="longerror"))
    with pytest.raises(CaptureError) as e:
        build(root, monkeypatch)
    first = str(e.value).splitlines()[0]
    assert first.startswith(
        "Capture of target 'double' failed: exited with status 1: "
        "CaptureError: target 'double': detail detail "
    ), first
    assert first.endswith("ADVICE AT THE END"), first


@pytest.mark.parametrize("mode", ["raise", "segv", "badhash", "cuda"])
def test_optional_failure_is_left_out(tmp_path, monkeypatch, mode):
    monkeypatch.setattr(runner, "cuda_available", lambda: False)
    extra = 'required = false\ndevice = "cuda"' if mode == "cuda" else "required = false"
    root = make_project(
        tmp_path,
        target_toml("ok") + target_toml("bad", mode="ok" if mode == "cuda" else mode, extra=extra),
    )
    with pytest.warns(CaptureWarning, match="optional target 'bad' left out") as got:
        whl = build(root, monkeypatch)
    (warning,) = [str(w.message) for w in got if issubclass(w.category, CaptureWarning)]
    if mode == "raise":  # the error's first line and the kept log, as for a required target
        assert (
            "left out of the wheel: exited with status 1: RuntimeError: boom from capture "
            "script (whole log: "
        ) in warning, warning
    if mode != "cuda":
        log = warning.split("(whole log: ")[1].rstrip(")")
        assert "fixture capture of bad" in Path(log).read_text(), log
    else:
        assert "whole log" not in warning, warning  # it never ran: no log
    assert [n for n in wheel_names(whl) if "_precompiled" in n] == sorted(
        [
            "simplepkg/_precompiled/manifest.json",
            "simplepkg/_precompiled/ok.cache",
            "simplepkg/_precompiled/ok.py",
            "simplepkg/_precompiled/ok" + PYC,
        ]
    )
    check_record(whl)
    bad = manifest_of(whl)["targets"]["bad"]
    assert (bad["status"], bad["required"], bad["variants"]) == ("failed", False, [])
    assert {
        "raise": "exited with status 1: RuntimeError: boom from capture script",
        "segv": "SIGSEGV",
        "badhash": "code_hash",
        "cuda": "needs CUDA",
    }[mode] in bad["reason"]
    text = format_report(inspect_report(str(whl)))  # `inspect` says so too, not "FAILED"
    assert f"target bad (optional): left out of the wheel at build: {bad['reason']}" in text, text
    assert "FAILED" not in text, text


def test_cuda_graphs_of_an_auto_target_is_dropped_on_a_cpu_build_host(tmp_path, monkeypatch, capfd):
    """One pyproject built on a CPU host and on a GPU host, then merged: on the CPU
    host `cuda-graphs` does not apply; the build says so and captures without it
    (the fixture script fails as the capture API would if the option reached it)."""
    monkeypatch.setattr(runner, "cuda_available", lambda: False)
    root = make_project(tmp_path, target_toml(extra='device = "auto"\ncuda-graphs = true'))
    whl = build(root, monkeypatch)
    assert (
        "precompile: double: cuda-graphs = true does not apply to a CPU capture (device = "
        '"auto" on a build host without CUDA): captured without it'
    ) in capfd.readouterr().err
    assert manifest_of(whl)["targets"]["double"]["status"] == "ok"


def test_strict_makes_optional_required(tmp_path, monkeypatch):
    root = make_project(tmp_path, target_toml(mode="exit", extra="required = false"))
    with pytest.raises(CaptureError, match="exited with status 3"):
        build(root, monkeypatch, config_settings={"precompile.strict": "true"})


def test_script_environment(tmp_path, monkeypatch):
    """The env contract: paths absolute, device, CUDA hidden for cpu, target env."""
    root = make_project(tmp_path)
    script = root / "capture" / "env.py"
    script.write_text(
        "import json, os, sys\n"
        "keys = ['PRECOMPILE_TARGET', 'PRECOMPILE_ARTIFACT_PATH', 'PRECOMPILE_CACHE_PATH',\n"
        "        'PRECOMPILE_DEVICE', 'CUDA_VISIBLE_DEVICES', 'EXTRA']\n"
        "print('ENV=' + json.dumps({k: os.environ.get(k) for k in keys}"
        " | {'cwd': os.getcwd(), 'argv': sys.argv[1:]}))\n"
        "sys.exit(5)\n"
    )
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml")
        .read_text()
        .replace(
            'script = "capture/pair.py"',
            'script = "capture/env.py"\nargs = ["a b", "c"]\ndevice = "cpu"\n'
            'env = { EXTRA = "yes" }',
        )
    )
    with pytest.raises(CaptureError) as e:
        build(root, monkeypatch)
    import json

    env = json.loads(str(e.value).split("ENV=")[1].splitlines()[0])
    assert env["PRECOMPILE_TARGET"] == "double" and env["PRECOMPILE_DEVICE"] == "cpu"
    assert env["CUDA_VISIBLE_DEVICES"] == "" and env["EXTRA"] == "yes"
    assert os.path.isabs(env["PRECOMPILE_ARTIFACT_PATH"])
    assert env["PRECOMPILE_ARTIFACT_PATH"].endswith("double.py")
    assert env["PRECOMPILE_CACHE_PATH"].endswith("double.cache")
    assert env["cwd"] == str(root.resolve()) and env["argv"] == ["a b", "c"]
    assert not os.path.exists(os.path.dirname(env["PRECOMPILE_ARTIFACT_PATH"]))  # cleaned


def test_progress_line(tmp_path, monkeypatch, capfd):
    build(make_project(tmp_path), monkeypatch)
    err = capfd.readouterr().err
    assert "precompile: double: ok on cpu in " in err and "source 185 B, cache" in err


def test_a_tracer_fallback_of_a_capture_is_said_in_the_build_line(tmp_path, monkeypatch, capfd):
    """``tracer = "auto"`` falling back to make_fx is said by the build, not only in the
    capture log (a temp file the build removes)."""
    root = make_project(tmp_path, target_toml(mode="fallbackwarn"))
    build(root, monkeypatch)
    err = capfd.readouterr().err
    assert (
        "precompile: double: warning: target 'double': torch.export failed (RuntimeError: x); "
        "traced with make_fx"
    ) in err


def test_python_state_warning_of_a_capture_is_shown_by_the_build(tmp_path, monkeypatch, capfd):
    """The capture API's PythonStateWarning goes to the script's log, in a temp dir the
    build removes: the build repeats it."""
    root = make_project(tmp_path, target_toml(mode="pywarn"))
    build(root, monkeypatch)
    err = capfd.readouterr().err
    assert (
        "precompile: double: warning: target 'double': the function drew from random "
        "while it was captured; Python code runs once, at capture"
    ) in err
