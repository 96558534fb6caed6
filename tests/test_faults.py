"""Faults during a build: Ctrl-C, SIGKILL half-way through a pair, and
reproducibility of real frozen-engine captures under SOURCE_DATE_EPOCH.

Every build here runs in a subprocess (a real frontend or the CLI), so the signals
reach real processes. The capture script is a file this module writes into its own
copy of tests/packages/simple: it writes the cache half, says so, then sleeps, so
the test can interrupt it exactly between the two halves of the pair.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _build_helpers import PYC, make_project

from precompile_runtime import envelope

pytestmark = pytest.mark.usefixtures("build_env")

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "packages"

HALF = '''"""Fault fixture: write the cache half, report, then sleep or die."""
import os, signal, sys, time
from pathlib import Path

with open(os.environ["PRECOMPILE_CACHE_PATH"], "wb") as f:
    f.write(b"PCBCACHE" + b"half of a pair " * 100)
    f.flush()
    os.fsync(f.fileno())
Path(os.environ["FAULT_PID"]).write_text(str(os.getpid()))
if sys.argv[1:] == ["--die"]:
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(600)
with open(os.environ["PRECOMPILE_ARTIFACT_PATH"], "w") as f:
    f.write("never reached")
'''


def _half_project(tmp_path: Path, *, die: bool = False) -> Path:
    args = '\nargs = ["--die"]' if die else ""
    root = make_project(
        tmp_path,
        '[tool.precompile.targets.double]\nscript = "capture/pair.py"\n'
        f'[tool.precompile.targets.half]\nscript = "capture/half.py"{args}\n'
        "timeout = 120\n",
    )
    (root / "capture" / "half.py").write_text(HALF)
    return root


def _env(tmp_path: Path, **extra) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(
            [str(REPO), str(REPO / "runtime")] + [p for p in [env.get("PYTHONPATH")] if p]
        ),
        FAULT_PID=str(tmp_path / "script.pid"),
        # no capture cache (being added to the backend): every capture runs for real,
        # and nothing is written to the per-user cache directory
        PRECOMPILE_CACHE="0",
        PRECOMPILE_BUILD_CACHE_DIR=str(tmp_path / "capture-cache"),
        **extra,
    )
    return env


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` -> its bytes (None for directories)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text():
            return int(path.read_text())
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(
                f"build ended before the capture script started ({proc.returncode}):"
                f"\n{out[-3000:]}\n{err[-3000:]}"
            )
        time.sleep(0.05)
    pytest.fail(f"no {path} after {timeout} s")


def _gone(pid: int, timeout: float = 15) -> bool:
    """Whether process ``pid`` ended (or is a zombie) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


def _reap(pid: int) -> None:
    """Kill a capture script a test left behind (by its id, never by name)."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------------ Ctrl-C


@pytest.fixture(scope="module")
def ctrl_c_build(tmp_path_factory):
    """`python -m build --no-isolation --wheel` of the fixture, interrupted the way a
    terminal's Ctrl-C does it (SIGINT to the whole foreground process group) while
    the second target's script sleeps between the two halves of its pair."""
    tmp_path = tmp_path_factory.mktemp("ctrlc")
    root = _half_project(tmp_path)
    before = _tree(root)
    out, tmp = tmp_path / "dist", tmp_path / "tmp"
    out.mkdir()
    tmp.mkdir()
    env = _env(tmp_path, TMPDIR=str(tmp), FIXTURE_FINGERPRINT=_fingerprint())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--wheel",
            "--outdir",
            str(out),
            str(root),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    script = _wait_for(tmp_path / "script.pid", proc)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        yield {
            "rc": proc.returncode,
            "log": stdout[-2000:] + stderr[-2000:],
            "script_gone": _gone(script),
            "wheels": os.listdir(out),
            "project_before": before,
            "project_after": _tree(root),
            "tmp_left": sorted(os.listdir(tmp)),
            "tmp": tmp,
        }
    finally:
        _reap(script)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def _fingerprint() -> str:
    import json

    from precompile_runtime.fingerprint import host_fingerprint

    return json.dumps(host_fingerprint("cpu"))


@pytest.mark.slow
def test_ctrl_c_during_python_m_build_leaves_nothing_in_project(ctrl_c_build):
    r = ctrl_c_build
    assert r["rc"] != 0, r["log"]
    assert "KeyboardInterrupt" in r["log"]
    assert r["wheels"] == []  # no wheel, no partial wheel
    assert r["project_after"] == r["project_before"]  # not a byte added, changed, removed


@pytest.mark.slow
def test_ctrl_c_during_python_m_build_ends_the_script_and_temp_dir(ctrl_c_build):
    """The frontend (pyproject_hooks' subprocess.run) SIGKILLs the backend on Ctrl-C, so
    the runner's own cleanup never runs: the capture script still dies with it (it asked
    for SIGKILL when its parent dies), and the killed build's temp dir, named after its
    pid, is removed by the next build (workdir.sweep_stale)."""
    from precompile_build.builder.workdir import sweep_stale

    r = ctrl_c_build
    assert r["script_gone"], "the capture script outlived the interrupted build"
    left = [n for n in r["tmp_left"] if n.startswith("precompile-build-")]
    assert r["tmp_left"] == left  # nothing but the build's own dir
    sweep_stale(str(r["tmp"]))
    assert os.listdir(r["tmp"]) == []


def test_ctrl_c_during_cli_capture_ends_everything(tmp_path):
    """Without a frontend in between, the runner's own Ctrl-C handling: the script's
    process group is ended, the temp dir removed, `error: interrupted`, status 1."""
    root = _half_project(tmp_path)
    before = _tree(root)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "precompile_build",
            "capture",
            "--project",
            str(root),
            "--out",
            str(root / "simplepkg" / "_precompiled"),
        ],
        env=_env(tmp_path, TMPDIR=str(tmp)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    script = _wait_for(tmp_path / "script.pid", proc)
    try:
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 1 and stderr.strip().splitlines()[-1] == "error: interrupted"
        assert _gone(script)
        assert _tree(root) == before and os.listdir(tmp) == []
    finally:
        _reap(script)


# ------------------------------------------------------------- SIGKILL mid-pair


def _precompiled_from_a_good_capture(root: Path, tmp_path: Path) -> dict:
    """Capture the good target into <pkg>/_precompiled/ (what an editable build leaves)."""
    dest = root / "simplepkg" / "_precompiled"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "precompile_build",
            "capture",
            "--project",
            str(root),
            "--targets",
            "double",
            "--out",
            str(dest),
        ],
        env=_env(tmp_path),
        check=True,
        capture_output=True,
    )
    assert sorted(os.listdir(dest)) == sorted(
        ["double.cache", "double.py", "double" + PYC, "manifest.json"]
    )
    return _tree(root)


def test_script_killed_after_cache_half_leaves_precompiled_untouched(tmp_path):
    """The script writes its cache half, then is SIGKILLed: the capture fails naming the
    signal, and the existing _precompiled/ is exactly as it was, with nothing beside it."""
    root = _half_project(tmp_path, die=True)
    before = _precompiled_from_a_good_capture(root, tmp_path)
    dest = root / "simplepkg" / "_precompiled"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "precompile_build",
            "capture",
            "--project",
            str(root),
            "--out",
            str(dest),
        ],
        env=_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert (
        "\nerror: Capture of target 'half' failed: killed by signal SIGKILL (9)\n" in proc.stderr
    ), proc.stderr
    assert _tree(root) == before
    assert sorted(os.listdir(root / "simplepkg")) == ["__init__.py", "_precompiled"]


def test_build_killed_mid_pair_leaves_precompiled_untouched(tmp_path):
    """The build itself is SIGKILLed (no cleanup can run) while a script has written
    only its cache half: _precompiled/ keeps its old content, no temp dir is left in
    the project; only the build's own temp dir (under TMPDIR) is left behind."""
    root = _half_project(tmp_path)
    before = _precompiled_from_a_good_capture(root, tmp_path)
    dest = root / "simplepkg" / "_precompiled"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "precompile_build",
            "capture",
            "--project",
            str(root),
            "--out",
            str(dest),
        ],
        env=_env(tmp_path, TMPDIR=str(tmp)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    script = _wait_for(tmp_path / "script.pid", proc)
    try:
        proc.kill()
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGKILL
        assert _tree(root) == before
        (left,) = os.listdir(tmp)  # the temp dir SIGKILL gave no chance to remove
        assert left.startswith("precompile-build-")
        halves = sorted(p.name for p in (tmp / left).rglob("pairs/half/*"))
        assert halves == ["half.cache"]  # the half pair lived only there
    finally:
        _reap(script)


# ------------------------------------------------------------ reproducibility

# Reproducibility of real frozen-engine captures. gcc is deterministic: two captures
# with the same Inductor cache path are byte-identical, every file. Across Inductor
# cache paths (TORCHINDUCTOR_CACHE_DIR, by default /tmp/torchinductor_$USER, so it
# differs between users), the frozen engine already drops the DWARF line tables that
# named the generated .cpp (frozen._reproducible_kernels), but a kernel with a bounds
# check (indirect indexing: an embedding) still embeds __FILE__, the .cpp's path in
# that cache, in its error message; Inductor takes no compiler flags that would map
# it (-ffile-prefix-map). So exactly the targets whose kernels contain the cache path
# differ, in both halves, and so does the manifest that records their sha256s.
NONDETERMINISTIC: set[str] = set()


def _path_dependent(out: Path, targets, inductor_dir: Path) -> set[str]:
    """The files that differ with the Inductor cache path: targets whose kernels name it."""
    named = {
        t
        for t in targets
        if any(
            str(inductor_dir).encode() in blob
            for blob in envelope.loads((out / f"{t}.cache").read_bytes()).blobs.values()
        )
    }
    return ({"manifest.json"} if named else set()) | {
        f"{t}{ext}" for t in named for ext in (".py", ".cache", PYC)
    }


def _capture_fcases(tmp_path: Path, name: str, inductor_dir: Path) -> Path:
    import shutil

    project, out = tmp_path / f"proj-{name}", tmp_path / f"out-{name}"
    shutil.copytree(FIXTURES / "fcases", project)
    shutil.rmtree(inductor_dir, ignore_errors=True)  # a cold compile, every time
    env = _env(
        tmp_path,
        SOURCE_DATE_EPOCH="1700000000",
        TORCHINDUCTOR_CACHE_DIR=str(inductor_dir),
        TRITON_CACHE_DIR=str(tmp_path / f"triton-{name}"),
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "precompile_build",
            "capture",
            "--project",
            str(project),
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _differing(a: Path, b: Path) -> set[str]:
    assert sorted(os.listdir(a)) == sorted(os.listdir(b))
    return {n for n in os.listdir(a) if (a / n).read_bytes() != (b / n).read_bytes()}


@pytest.mark.slow
def test_fcases_capture_reproducibility(tmp_path):
    import json

    pytest.importorskip("torch")
    same = tmp_path / "inductor-1"  # one path, emptied before each capture
    a = _capture_fcases(tmp_path, "a", same)
    b = _capture_fcases(tmp_path, "b", same)
    targets = json.loads((a / "manifest.json").read_text())["targets"]
    frozen = sorted(
        t for t, e in targets.items() if [v["engine"] for v in e["variants"]] == ["frozen"]
    )
    assert frozen and frozen == sorted(targets)  # every fcases target: real frozen kernels
    assert _differing(a, b) == NONDETERMINISTIC, (
        "two cold captures with one Inductor cache path differ"
    )

    other = tmp_path / "inductor-2-elsewhere"  # another Inductor cache path
    c = _capture_fcases(tmp_path, "c", other)
    expected = _path_dependent(a, frozen, same)
    # the targets with an embedding (its bounds check names the kernel file)
    assert expected == {
        "manifest.json",
        "tied_forward.py",
        "tied_forward.cache",
        "tied_forward" + PYC,
        "dyn_step.py",
        "dyn_step.cache",
        "dyn_step" + PYC,
    }
    assert _differing(a, c) == expected
    for target in frozen:
        ea = envelope.loads((a / f"{target}.cache").read_bytes())
        assert ea.engine == "frozen" and ea.blobs and all(n.endswith(".so") for n in ea.blobs)
