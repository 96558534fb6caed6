"""Capture cache (hits, a miss per key component, corrupt entries, off, two builds at
once, clean), parallel captures (order, devices, fail fast) and progress output."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _build_helpers import build, check_record, make_project, target_toml

from precompile_build.builder import capture_cache, progress, runner
from precompile_build.cli import main
from precompile_build.config.settings import load_settings
from precompile_build.errors import CaptureError, ConfigError

pytestmark = pytest.mark.usefixtures("build_env")

REPO = Path(__file__).resolve().parents[1]


def _cache_dir() -> Path:
    return Path(os.environ["PRECOMPILE_BUILD_CACHE_DIR"])


def _entries() -> list[Path]:
    d = _cache_dir()
    return sorted(p for p in d.iterdir() if p.is_dir() and len(p.name) == 64) if d.exists() else []


def _built(root, monkeypatch, capfd, tag, cs=None):
    """Build; return (wheel, whether the script ran, stderr)."""
    mark = root.parent / f"ran-{tag}"
    monkeypatch.setenv("FIXTURE_MARK", str(mark))
    whl = build(root, monkeypatch, out=root.parent / f"dist-{tag}", config_settings=cs)
    return whl, mark.exists(), capfd.readouterr().err


def test_hit_reuses_and_wheel_is_identical(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    root = make_project(tmp_path)
    whl1, ran1, err1 = _built(root, monkeypatch, capfd, "1")
    assert ran1 and "ok on cpu in" in err1 and "captured (why: no entry)" in err1
    (entry,) = _entries()
    assert sorted(p.name for p in entry.iterdir()) == ["double.cache", "double.py", "entry.json"]
    whl2, ran2, err2 = _built(root, monkeypatch, capfd, "2")
    assert not ran2 and f"reused (key {entry.name[:12]}…)" in err2
    assert whl1.read_bytes() == whl2.read_bytes()
    check_record(whl2)
    assert "precompile: summary" in err2 and "reused" in err2.split("summary")[1]


def _edit_script(root):
    (root / "capture" / "pair.py").write_text((root / "capture" / "pair.py").read_text() + "\n#\n")


def _edit_package(root):
    (root / "simplepkg" / "helpers.py").write_text("X = 1\n")


EXTRA = 'env = { KNOB = "1" }\ncache-env = ["FIXTURE_KNOB"]'


def _edit_config(root):
    _set_toml(root, target_toml(extra=EXTRA).replace('"ok"]', '"ok", "--factor", "3"]'))


def _set_toml(root, text):
    py = root / "pyproject.toml"
    py.write_text(py.read_text().split("# --- precompile ---")[0] + "# --- precompile ---\n" + text)


def _edit_env(root):
    _set_toml(root, target_toml(extra=EXTRA.replace('"1"', '"2"')))


def _edit_cache_env(monkeypatch):
    monkeypatch.setenv("FIXTURE_KNOB", "2")


def _edit_fingerprint(monkeypatch):
    real = capture_cache.host_fingerprints

    def other(devices, memo_dir=None):
        return {d: fps + ['{"torch": "9.9.9"}'] for d, fps in real(devices, memo_dir).items()}

    monkeypatch.setattr(capture_cache, "host_fingerprints", other)


MISSES = {
    "script": _edit_script,
    "package": _edit_package,
    "config": _edit_config,
    "env": _edit_env,
    "cache-env": _edit_cache_env,
    "fingerprint": _edit_fingerprint,
}
# what the build line says changed (was: `no entry` for each)
SAID = {
    "script": "the script capture/pair.py",
    "package": "the package's files (simplepkg/helpers.py added)",
    "config": "the target's args",
    "env": "the target's env",
    "cache-env": "the cache-env variables (FIXTURE_KNOB)",
    "fingerprint": "the host fingerprint",
}


@pytest.mark.parametrize("what", sorted(MISSES))
def test_each_key_component_misses(tmp_path, monkeypatch, capfd, what):
    root = make_project(tmp_path, target_toml(extra=EXTRA))
    monkeypatch.setenv("FIXTURE_KNOB", "1")
    _, ran, err = _built(root, monkeypatch, capfd, "1")
    assert ran and "captured (why: no entry)" in err  # nothing earlier to compare with
    assert not _built(root, monkeypatch, capfd, "2")[1]  # unchanged: a hit
    (first,) = _entries()
    edit = MISSES[what]
    edit(monkeypatch) if what in ("cache-env", "fingerprint") else edit(root)
    _, ran, err = _built(root, monkeypatch, capfd, "3")
    said = f"captured (why: changed since the last capture (key {first.name[:12]}…): {SAID[what]})"
    assert ran and said in err, err
    assert len(_entries()) == 2


def test_the_line_names_the_package_files_that_changed(tmp_path, monkeypatch, capfd):
    """An edit of the package's module and a removed one are named (at most three,
    then a count); a build of another package's target of the same name is no
    earlier capture of this one."""
    root = make_project(tmp_path)
    (root / "simplepkg" / "a.py").write_text("A = 1\n")
    assert _built(root, monkeypatch, capfd, "1")[1]
    (root / "simplepkg" / "__init__.py").write_text("# edited\n")
    (root / "simplepkg" / "a.py").unlink()
    for n in "bcd":
        (root / "simplepkg" / f"{n}.py").write_text("")
    _, ran, err = _built(root, monkeypatch, capfd, "2")
    assert (
        ran
        and (
            "the package's files (simplepkg/__init__.py changed, simplepkg/b.py added, "
            "simplepkg/c.py added and 2 more))"
        )
        in err
    ), err
    real = capture_cache.what_changed
    monkeypatch.setattr(
        capture_cache,
        "what_changed",
        lambda root, c, package, files: real(root, c, "otherpkg", files),
    )
    (root / "simplepkg" / "e.py").write_text("")
    _, ran, err = _built(root, monkeypatch, capfd, "3")
    assert ran and "captured (why: no entry)" in err, err


@pytest.mark.parametrize("what", ["timeout", "required", "_precompiled", "__pycache__"])
def test_changes_outside_the_key_still_hit(tmp_path, monkeypatch, capfd, what):
    root = make_project(tmp_path, target_toml())
    assert _built(root, monkeypatch, capfd, "1")[1]
    if what in ("timeout", "required"):
        _set_toml(
            root,
            target_toml().replace("timeout = 60", "timeout = 61")
            if what == "timeout"
            else target_toml(extra="required = false"),
        )
    else:
        (root / "simplepkg" / what).mkdir(exist_ok=True)
        (root / "simplepkg" / what / "junk.pyc").write_bytes(b"junk")
    assert not _built(root, monkeypatch, capfd, "2")[1]


def _flip_cache(entry):
    p = entry / "double.cache"
    data = bytearray(p.read_bytes())
    data[-1] ^= 1
    p.write_bytes(bytes(data))


def _bad_json(entry):
    (entry / "entry.json").write_text("{not json")


def _drop_source(entry):
    (entry / "double.py").unlink()


def _consistent_but_invalid(entry):
    """sha256s in entry.json match, yet the pair is invalid (code_hash mismatch)."""
    src = entry / "double.py"
    src.write_text(src.read_text() + "\n# edited\n")
    meta = json.loads((entry / "entry.json").read_text())
    meta["files"]["source"].update(capture_cache._file_meta(src))
    (entry / "entry.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage, said",
    [
        (_flip_cache, "double.cache: size/sha256"),
        (_bad_json, "JSONDecodeError"),
        (_drop_source, "No such file"),
        (_consistent_but_invalid, "code_hash mismatch"),
    ],
)
def test_corrupt_entry_is_discarded_and_recaptured(tmp_path, monkeypatch, capfd, damage, said):
    root = make_project(tmp_path)
    whl1, _, _ = _built(root, monkeypatch, capfd, "1")
    (entry,) = _entries()
    damage(entry)
    whl2, ran, err = _built(root, monkeypatch, capfd, "2")
    assert ran and "captured (why: entry corrupt: " in err and said in err
    assert f"discarded cache entry {entry.name[:12]}…" in err
    check_record(whl2)
    # the recaptured entry replaced the bad one and is reused next time
    assert not _built(root, monkeypatch, capfd, "3")[1]


@pytest.mark.parametrize("how", ["config", "env"])
def test_cache_off(tmp_path, monkeypatch, capfd, how):
    root = make_project(tmp_path)
    cs = {"precompile.cache": "off"} if how == "config" else None
    if how == "env":
        monkeypatch.setenv("PRECOMPILE_CACHE", "off")
    monkeypatch.setattr(capture_cache, "host_fingerprints", None)  # never called
    for tag in "12":
        _, ran, err = _built(root, monkeypatch, capfd, tag, cs)
        assert ran and "captured (why: cache off)" in err
    assert not _cache_dir().exists() or _entries() == []


_BUILD = """
import sys
from precompile_build import backend
print(backend.build_wheel(sys.argv[1]))
"""


def test_two_concurrent_builds(tmp_path, monkeypatch):
    """Two processes build the same project (two checkouts, one cache) at once:
    one captures, the other waits for the entry lock and reuses; wheels identical."""
    toml = target_toml(mode="frozen").replace('"frozen"]', '"frozen", "--sleep", "2"]')
    roots = [make_project(tmp_path / n, toml) for n in "ab"]
    env = dict(
        os.environ,
        SOURCE_DATE_EPOCH="1700000000",
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "runtime")]),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILD, str(r.parent / "dist")],
            cwd=r,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in roots
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    whls = [r.parent / "dist" / o[0].strip().splitlines()[-1] for r, o in zip(roots, outs)]
    assert whls[0].read_bytes() == whls[1].read_bytes()
    errs = "".join(o[1] for o in outs)
    assert errs.count("captured (why: no entry)") == 1 and errs.count("reused (key") == 1
    assert "waiting for another build" in errs
    assert len(_entries()) == 1 and not list(_cache_dir().glob(".tmp-*"))


def test_parallel_order_and_overlap(tmp_path, monkeypatch, capfd):
    """The first target sleeps longer and finishes last; results, manifest and wheel
    do not depend on that (same bytes as a one-at-a-time build)."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    toml = target_toml("slow").replace('"ok"]', '"ok", "--sleep", "1.5"]') + target_toml("fast")
    root = make_project(tmp_path, toml)
    s = load_settings(root, {"precompile.jobs": "2", "precompile.cache": "off"})
    start = time.monotonic()
    results = runner.run_captures(s, tmp_path / "work")
    assert [r.name for r in results] == ["slow", "fast"]
    err = capfd.readouterr().err
    assert err.index("fast: ok on cpu") < err.index("slow: ok on cpu")  # ran side by side
    assert time.monotonic() - start < 1.5 + 2.5
    whl2 = build(
        root,
        monkeypatch,
        out=tmp_path / "d2",
        config_settings={"precompile.jobs": "2", "precompile.cache": "off"},
    )
    capfd.readouterr()
    whl1 = build(
        root,
        monkeypatch,
        out=tmp_path / "d1",
        config_settings={"precompile.jobs": "1", "precompile.cache": "off"},
    )
    assert whl1.read_bytes() == whl2.read_bytes()
    err = capfd.readouterr().err
    assert err.index("slow: ok on cpu") < err.index("fast: ok on cpu")  # jobs = 1: in order


def test_cuda_targets_get_one_gpu_each(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(runner, "cuda_available", lambda: True)
    monkeypatch.setattr(runner, "gpu_ids", lambda: ["0", "1"])
    script = tmp_path / "proj" / "capture" / "cvd.py"
    toml = "".join(
        target_toml(n, script="capture/cvd.py", extra='device = "cuda"') for n in ("a", "b", "c")
    )
    root = make_project(tmp_path, toml)
    script.write_text(  # record the GPU it got, then run the fixture
        "import os, runpy, sys, time\n"
        "open(os.environ['PRECOMPILE_ARTIFACT_PATH'] + '.cvd', 'w')\n"
        "print('CVD=' + os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
        "time.sleep(0.5)\n"
        "sys.argv[0] = 'capture/pair.py'\nrunpy.run_path('capture/pair.py', run_name='__main__')\n"
    )
    s = load_settings(root, {"precompile.cache": "off"})
    results = runner.run_captures(s, tmp_path / "work")
    assert sorted(r.device_index for r in results[:2]) == [0, 1]
    assert results[2].device_index in (0, 1)
    for r in results:
        log = (tmp_path / "work" / "logs" / f"{r.name}.log").read_text()
        assert f"CVD={r.device_index}" in log
    table = capfd.readouterr().err.split("precompile: summary")[1]
    assert "cuda:0" in table and "cuda:1" in table
    from precompile_build.wheels.manifest import assemble

    doc = json.loads(assemble("simplepkg", results)["manifest.json"])
    assert {doc["targets"][n]["variants"][0]["capture_device"] for n in "ab"} == {0, 1}


def test_required_failure_lets_the_running_finish_and_reports_each(tmp_path, monkeypatch, capfd):
    """A failed required target fails the build, but the captures already running
    finish and the summary shows each outcome (was: a sibling showed "cancelled");
    the one that succeeded is in the capture cache, so the next build reuses it. With
    one slot, a target not yet started is not started."""
    pid_file = tmp_path / "child.pid"
    toml = (
        target_toml("slow").replace('"ok"]', '"ok", "--sleep", "1.5"]')
        + target_toml("hang", mode="hang")
        .replace('"hang"]', f'"hang", "--pid-file", "{pid_file}"]')
        .replace("timeout = 60", "timeout = 2")
        + target_toml("bad", mode="exit")
    )
    root = make_project(tmp_path, toml)
    start = time.monotonic()
    with pytest.raises(CaptureError, match="'hang' failed: timed out after 2 s"):
        build(root, monkeypatch, config_settings={"precompile.jobs": "3"})
    assert time.monotonic() - start < 30
    assert list((tmp_path / "dist").iterdir()) == []
    err = capfd.readouterr().err
    rows = {
        ln.split()[0]: ln.split()[2]
        for ln in err.split("precompile: summary\n")[1].splitlines()[1:]
        if not ln.startswith("precompile:")
    }  # the table's rows, not the line after it
    assert rows == {"slow": "captured", "hang": "failed", "bad": "failed"}
    assert len(_entries()) == 1  # slow's pair, kept for the next build
    toml1 = target_toml("bad", mode="exit") + target_toml("slow")
    root = make_project(tmp_path / "one", toml1)
    with pytest.raises(CaptureError, match="'bad' failed"):
        build(
            root, monkeypatch, config_settings={"precompile.jobs": "1", "precompile.cache": "off"}
        )
    rows = {
        ln.split()[0]: " ".join(ln.split()[2:4])
        for ln in capfd.readouterr().err.split("precompile: summary\n")[1].splitlines()[1:]
    }
    assert rows["bad"].startswith("failed") and rows["slow"] == "not started"


def test_progress_lines_and_summary(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(progress, "INTERVAL", 0.3)
    root = make_project(tmp_path, target_toml().replace('"ok"]', '"ok", "--sleep", "1.5"]'))
    whl = build(root, monkeypatch)
    err = capfd.readouterr().err
    assert "precompile: double on cpu: running " in err and "| sleeping 1.5 s" in err
    assert "\r" not in err and "\x1b[" not in err  # no terminal: plain lines only
    table = err.split("precompile: summary\n")[1].splitlines()
    assert table[0].split() == [
        "target",
        "device",
        "result",
        "seconds",
        "bytes",
        "peak",
        "host/GPU",
    ]
    row = table[1].split()
    assert row[:3] == ["double", "cpu", "captured"] and float(row[3]) >= 1.5
    assert whl.exists()


@pytest.mark.parametrize(
    "tail, shown",
    [
        # torch's FutureWarning: its second line is the warned source line, not output
        (
            "/x/torch/export/_trace.py:1234: FutureWarning: `torch.export.export_for_training` is "
            "deprecated\n  return cls.__new__(cls, *args)\n",
            "FutureWarning: `torch.export.export_for_training` is deprecated",
        ),
        # a warning whose message has more lines, then its source line
        (
            "step 3\n/x/m.py:9: UserWarning: first line\nsecond line\n  warnings.warn(msg)\n",
            "UserWarning: first line",
        ),
        # output after a warning is the capture's again
        ("/x/m.py:9: UserWarning: w\n  warnings.warn(w)\ncompiling kernels\n", "compiling kernels"),
        ("a\n  indented output of the script\n", "indented output of the script"),
    ],
)
def test_a_status_line_shows_a_warning_as_one_line(tmp_path, tail, shown):
    log = tmp_path / "t.log"
    log.write_text(tail)
    assert progress.last_log_line(log) == shown


def test_progress_redraws_in_place_on_a_terminal():
    out = io.StringIO()
    p = progress.Progress(out, live=True)
    p.started("forward", "cuda:0", Path("/nonexistent.log"))
    p.say("precompile: hello")
    p.say("precompile: again")
    assert out.getvalue().startswith("precompile: hello\nprecompile: forward on cuda:0: running")
    assert "\x1b[1F\x1b[J" in out.getvalue()


def test_clean_command(tmp_path, monkeypatch, capfd):
    root = make_project(tmp_path)
    _built(root, monkeypatch, capfd, "1")
    d = _cache_dir()
    (d / "keep.txt").write_text("not ours")
    assert main(["clean", "--cache-dir", str(d)]) == 0
    assert "removed 1 capture cache entry" in capfd.readouterr().out
    assert sorted(p.name for p in d.iterdir()) == ["keep.txt"]
    assert _built(root, monkeypatch, capfd, "2")[1]  # captured again
    (d / "keep.txt").unlink()
    assert main(["clean"]) == 0  # PRECOMPILE_BUILD_CACHE_DIR
    assert not d.exists()


def test_clean_refuses_a_directory_that_is_not_a_capture_cache(tmp_path, capfd):
    # a project folder passed by mistake: its lock files and folders are not ours
    (tmp_path / "poetry.lock").write_text("x")
    (tmp_path / "fingerprints").mkdir()
    (tmp_path / ("a" * 64)).mkdir()
    assert main(["clean", "--cache-dir", str(tmp_path)]) != 0
    assert (
        "is not a precompile-build capture cache (no CACHEDIR.TAG of ours); nothing removed"
        in capfd.readouterr().err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a" * 64, "fingerprints", "poetry.lock"]


def test_clean_resolves_the_directory_like_the_build(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("PRECOMPILE_BUILD_CACHE_DIR", "~/cc")
    assert main(["clean"]) == 0
    assert f"from {tmp_path / 'cc'}" in capfd.readouterr().out


# ---------------------------------------------------------------------- settings


def test_settings_defaults_and_overrides(tmp_path, monkeypatch):
    root = make_project(tmp_path, target_toml(extra='cache-env = ["A", "B", "A"]'))
    s = load_settings(root, {}, {})
    assert (s.cache, s.cache_dir, s.jobs) == (True, None, None)
    assert s.targets["double"].cache_env == ("A", "B")
    s = load_settings(
        root,
        {"precompile.cache": "off", "precompile.jobs": "3", "precompile.cache-dir": "c"},
        {"PRECOMPILE_JOBS": "auto"},
    )
    assert (s.cache, s.cache_dir, s.jobs) == (False, root / "c", None)
    s = load_settings(root, {}, {"PRECOMPILE_CACHE": "on", "PRECOMPILE_BUILD_CACHE_DIR": "/x"})
    assert (s.cache, s.cache_dir) == (True, Path("/x"))
    _set_toml(
        root, '[tool.precompile]\ncache = false\ncache-dir = "~/pc"\njobs = 2\n' + target_toml()
    )
    s = load_settings(root, {}, {})
    assert (s.cache, s.cache_dir, s.jobs) == (False, Path.home() / "pc", 2)
    from precompile_build.config.settings import default_cache_dir

    assert default_cache_dir().name == "precompile-build"


@pytest.mark.parametrize(
    "toml, cs, env, match",
    [
        ("[tool.precompile]\njobs = 0\n", {}, {}, r"`tool.precompile.jobs` must be \"auto\""),
        ('[tool.precompile]\njobs = "2"\n', {}, {}, "`tool.precompile.jobs`"),
        ("[tool.precompile]\njobs = true\n", {}, {}, "`tool.precompile.jobs`"),
        ('[tool.precompile]\ncache = "off"\n', {}, {}, "`tool.precompile.cache` must be a boolean"),
        ("[tool.precompile]\ncache-dir = 3\n", {}, {}, "`tool.precompile.cache-dir`"),
        ('[tool.precompile]\ncachedir = "x"\n', {}, {}, "did you mean `tool.precompile.cache-dir`"),
        ("", {"precompile.jobs": "many"}, {}, "config setting `precompile.jobs`: it must be"),
        ("", {}, {"PRECOMPILE_JOBS": "-1"}, "environment variable PRECOMPILE_JOBS"),
        ("", {}, {"PRECOMPILE_CACHE": "maybe"}, "PRECOMPILE_CACHE: 'maybe' is not a boolean"),
        ("", {"precompile.cahce": "off"}, {}, "did you mean `precompile.cache`"),
    ],
)
def test_settings_errors(tmp_path, toml, cs, env, match):
    root = make_project(tmp_path, toml + target_toml())
    with pytest.raises(ConfigError, match=match):
        load_settings(root, cs, env)


@pytest.mark.parametrize("value", ['"A"', "[1]", '["1A"]', '["A=B"]', '[""]'])
def test_cache_env_must_be_names(tmp_path, value):
    root = make_project(tmp_path, target_toml(extra=f"cache-env = {value}"))
    with pytest.raises(ConfigError, match=r"`tool.precompile.targets.double.cache-env` must"):
        load_settings(root, {}, {})


def test_fingerprint_memo_on_disk(tmp_path, monkeypatch):
    """A rebuild with nothing changed reads the host fingerprint from the cache's memo
    (no torch import: seconds on a GPU host); the memo key changes with what determines
    the fingerprint (here: the interpreter's torch version)."""
    from importlib import metadata

    capture_cache._fp_memo.clear()
    first = capture_cache.host_fingerprints(["cpu"], memo_dir=tmp_path)
    (memo,) = (tmp_path / "fingerprints").iterdir()
    capture_cache._fp_memo.clear()
    monkeypatch.setattr(capture_cache.subprocess, "run", None)  # no subprocess: must read the memo
    assert capture_cache.host_fingerprints(["cpu"], memo_dir=tmp_path) == first
    monkeypatch.undo()
    capture_cache._fp_memo.clear()
    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda d: "9.9.9" if d == "torch" else real_version(d))
    capture_cache.host_fingerprints(["cpu"], memo_dir=tmp_path)
    assert len(list((tmp_path / "fingerprints").iterdir())) == 2  # a new key, computed again
    capture_cache._fp_memo.clear()


# -- the entry covers what the capture imported --------------------------------------

_DEP_CAPTURE = """import torch
import precompile_build
import fixturedep
import helpers  # capture/helpers.py, beside this script

with precompile_build.capture(lambda x: x * fixturedep.FACTOR + helpers.OFFSET, engine="eager") as f:
    f(torch.ones(2))
"""


def _install_dep(deps: Path, version: str | None) -> None:
    """``fixturedep`` at ``version`` in ``deps`` (a directory on the path), or gone."""
    import shutil

    for p in list(deps.glob("fixturedep*")):
        shutil.rmtree(p)
    if version is None:
        return
    (deps / "fixturedep").mkdir(parents=True)
    (deps / "fixturedep" / "__init__.py").write_text(f"FACTOR = {version.split('.')[0]}\n")
    info = deps / f"fixturedep-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: fixturedep\nVersion: {version}\n")
    (info / "top_level.txt").write_text("fixturedep\n")


def test_an_imported_distribution_or_file_that_changed_is_captured_again(
    tmp_path, monkeypatch, capfd
):
    """A capture script importing a library (fixturedep, standing for transformers):
    built once, then with the library at another version the build captures again;
    with the library gone it fails like a build without the cache; a helper module
    beside the script that changed is captured again too."""
    deps = tmp_path / "deps"
    deps.mkdir()
    _install_dep(deps, "1.0")
    monkeypatch.syspath_prepend(str(deps))  # the build's view of the installed distributions
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(deps), os.environ.get("PYTHONPATH", "")]))
    root = make_project(tmp_path, target_toml(script="capture/dep.py"))
    (root / "capture" / "dep.py").write_text(_DEP_CAPTURE)
    (root / "capture" / "helpers.py").write_text("OFFSET = 0\n")
    _, _, err = _built(root, monkeypatch, capfd, "1")
    assert "captured (why: no entry)" in err, err
    (entry,) = _entries()
    recorded = json.loads((entry / "entry.json").read_text())["imports"]
    assert recorded["distributions"]["fixturedep"] == "1.0" and "torch" in recorded["distributions"]
    assert (
        "capture/helpers.py" in recorded["project_files"]
    )  # relative: another copy of the project compares it
    _, _, err = _built(root, monkeypatch, capfd, "2")
    assert "reused (key" in err, err
    _install_dep(deps, "2.0")
    _, _, err = _built(root, monkeypatch, capfd, "3")
    assert "captured (why: imports changed: fixturedep 1.0 -> 2.0)" in err, err
    (root / "capture" / "helpers.py").write_text("OFFSET = 1\n")
    _, _, err = _built(root, monkeypatch, capfd, "4")
    assert "captured (why: imports changed: capture/helpers.py changed)" in err, err
    _install_dep(deps, None)
    with pytest.raises(CaptureError, match="ModuleNotFoundError: No module named 'fixturedep'"):
        _built(root, monkeypatch, capfd, "5")


def test_a_capture_that_records_nothing_is_keyed_on_the_whole_environment(
    tmp_path, monkeypatch, capfd
):
    """A script that does not call precompile_build.capture (the fixture writes its
    pair by hand, as one using torch's own API would) records no imports: its entry
    holds every distribution installed where the script imports from (recorded in its
    process: a distribution only the build's process sees is none of its inputs), so
    installing one there captures again."""
    deps, backend_only = tmp_path / "deps", tmp_path / "backend-only"
    deps.mkdir()
    backend_only.mkdir()
    monkeypatch.syspath_prepend(str(backend_only))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(deps), os.environ.get("PYTHONPATH", "")]))
    root = make_project(tmp_path)
    _, ran, err = _built(root, monkeypatch, capfd, "1")
    assert ran and "captured (why: no entry)" in err
    (entry,) = _entries()
    assert json.loads((entry / "entry.json").read_text())["imports"]["environment"] is True
    assert not _built(root, monkeypatch, capfd, "2")[1]
    _install_dep(backend_only, "1.0")  # the build's process sees it, the script's does not
    assert not _built(root, monkeypatch, capfd, "3")[1]
    _install_dep(deps, "1.0")
    _, ran, err = _built(root, monkeypatch, capfd, "4")
    assert ran and "captured (why: imports changed: fixturedep not installed -> 1.0)" in err, err


# -- the record compared in the import context it was made in -------------------------

_OWN_CAPTURE = """import torch
import precompile_build
import fixturedep  # on the target's env PYTHONPATH only: the build's process does not see it
import helpers  # capture/helpers.py, beside this script
from simplepkg import ops  # the project's own package (the capture sees its egg-info too)

with precompile_build.capture(lambda x: ops.act(x) * fixturedep.FACTOR + helpers.OFFSET,
                              engine="eager") as f:
    f(torch.ones(2))
"""


def test_a_rebuild_reuses_a_capture_of_the_project_s_own_code(tmp_path, monkeypatch, capfd):
    """The capture imports the project's package, whose metadata setuptools writes into
    the project root (simplepkg.egg-info: the capture process sees it, the build's does
    not), and a library only the target's env PYTHONPATH has: an unchanged rebuild
    reuses (was: `imports changed: simplepkg 0.1.0 -> not installed`, every build),
    and so does a build of a copy of the project elsewhere (an unpacked sdist); the
    library upgraded there, an edit of the package's module without a version bump and
    an edit of the helper beside the script each capture again, saying why."""
    deps = tmp_path / "deps"
    deps.mkdir()
    _install_dep(deps, "1.0")
    seen = os.pathsep.join([str(deps), os.environ.get("PYTHONPATH", "")])  # + this tree's own
    toml = target_toml(script="capture/own.py", extra=f'env = {{ PYTHONPATH = "{seen}" }}')
    root = make_project(tmp_path / "a", toml)
    (root / "simplepkg" / "ops.py").write_text("def act(x):\n    return x + 1\n")
    (root / "capture" / "own.py").write_text(_OWN_CAPTURE)
    (root / "capture" / "helpers.py").write_text("OFFSET = 0\n")
    _, _, err = _built(root, monkeypatch, capfd, "1")
    assert "captured (why: no entry)" in err, err
    assert (root / "simplepkg.egg-info").is_dir()  # what the capture process saw
    (entry,) = _entries()
    recorded = json.loads((entry / "entry.json").read_text())["imports"]
    assert "simplepkg" not in recorded["distributions"]  # the package: keyed by content
    assert recorded["distributions"]["fixturedep"] == "1.0"
    assert list(recorded["project_files"]) == ["capture/helpers.py"]
    _, _, err = _built(root, monkeypatch, capfd, "2")
    assert f"reused (key {entry.name[:12]}…)" in err, err
    import shutil

    copy = shutil.copytree(root, tmp_path / "b" / "proj")
    _, _, err = _built(copy, monkeypatch, capfd, "3")
    assert f"reused (key {entry.name[:12]}…)" in err, err
    _install_dep(deps, "2.0")
    _, _, err = _built(root, monkeypatch, capfd, "4")
    assert "captured (why: imports changed: fixturedep 1.0 -> 2.0)" in err, err
    (root / "simplepkg" / "ops.py").write_text(
        "def act(x):\n    return x + 2\n"
    )  # version still 0.1.0
    _, _, err = _built(root, monkeypatch, capfd, "5")
    assert "captured (why: changed since the last capture (key" in err, err
    assert "the package's files (simplepkg/ops.py changed))" in err, err
    (root / "capture" / "helpers.py").write_text("OFFSET = 1\n")
    _, _, err = _built(root, monkeypatch, capfd, "6")
    assert "captured (why: imports changed: capture/helpers.py changed)" in err, err
