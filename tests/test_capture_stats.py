"""Peak memory per target: the capture script's peak RSS (``wait4``) and,
for CUDA captures, the GPU peaks the capture records (process/stats.py), in the build
line, the summary table, the manifest and ``inspect``."""

from __future__ import annotations

import json
import os

import pytest
from _build_helpers import make_project, target_toml
from typeguard import check_type

from precompile_build.builder import runner
from precompile_build.builder.progress import human_size
from precompile_build.config.settings import load_settings
from precompile_build.process import stats as capture_stats
from precompile_build.wheels.inspect_cmd import format_report, inspect_report
from precompile_build.wheels.manifest import assemble
from precompile_runtime.manifest import Manifest

pytestmark = pytest.mark.usefixtures("build_env")

GIB = 1 << 30


def _gpu_project(tmp_path):
    # a stand-in for a CUDA capture: records the numbers a frozen CUDA capture records
    # (capture_stats.cuda_peaks), holds 64 MiB of host memory, then writes the pair
    script = tmp_path / "proj" / "capture" / "gpu.py"
    root = make_project(
        tmp_path, target_toml("fwd", script="capture/gpu.py", extra='device = "cuda"')
    )
    script.write_text(
        "import runpy, sys, time\n"
        "from precompile_build.process import stats as capture_stats\n"
        "time.sleep(0.3)\n"  # the script's own setup (imports, building a model)
        "capture_stats.capture_began()\n"  # as a capture does when it begins
        # a process the script starts (a rank, a worker) captures 2 s later: not the setup
        "import subprocess\n"
        "subprocess.run([sys.executable, '-c', 'import time; time.sleep(2); from precompile_build.process "
        "import stats as capture_stats; capture_stats.capture_began()'], check=True)\n"
        f"capture_stats.record(gpu_bytes={5 * GIB}, eager_gpu_bytes={4 * GIB}, trace_s=1.25, validate_s=2.5)\n"
        "held = bytearray(64 << 20)\n"
        "sys.argv[0] = 'capture/pair.py'\nrunpy.run_path('capture/pair.py', run_name='__main__')\n"
    )
    return root


def test_peaks_reach_the_build_line_the_table_the_manifest_and_inspect(
    tmp_path, monkeypatch, capfd
):
    monkeypatch.setattr(runner, "cuda_available", lambda: True)
    monkeypatch.setattr(runner, "gpu_ids", lambda: ["0"])
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    root = _gpu_project(tmp_path)
    (r,) = runner.run_captures(load_settings(root, {"precompile.cache": "off"}), tmp_path / "work")
    assert r.peak_memory["gpu_bytes"] == 5 * GIB and r.peak_memory["eager_gpu_bytes"] == 4 * GIB
    assert 64 << 20 < r.peak_memory["host_bytes"] < 4 * GIB  # the script's own RSS
    err = capfd.readouterr().err
    line = next(ln for ln in err.splitlines() if "fwd: ok on cuda:0" in ln)
    setup = r.capture_breakdown.pop("setup")  # from the build starting the script to its capture
    assert 0.3 <= setup < r.capture_seconds - 2, (
        setup,
        r.capture_seconds,
    )  # the script's, not its child's
    assert f"; script setup {setup:.1f} s, trace 1.2 s, validate 2.5 s; peak host " in line
    assert "GPU 5.0 GiB (1.25x eager's 4.0 GiB)" in line
    assert r.capture_breakdown == {"trace": 1.25, "validate": 2.5}
    r.capture_breakdown["setup"] = setup
    table = err.split("precompile: summary\n")[1].splitlines()
    assert table[0].split()[-2:] == ["peak", "host/GPU"] and table[1].endswith("/5.0 GiB")
    files = assemble("simplepkg", [r])
    check_type(json.loads(files["manifest.json"]), Manifest)  # the writer keeps to the schema
    (variant,) = json.loads(files["manifest.json"])["targets"]["fwd"]["variants"]
    assert (
        variant["peak_memory"] == r.peak_memory
        and variant["capture_breakdown"] == r.capture_breakdown
    )
    out = tmp_path / "out"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
    report = inspect_report(str(out), host=lambda d: {})
    assert report["targets"]["fwd"]["variants"][0]["peak_memory"] == r.peak_memory
    text = format_report(report)
    assert (
        "    capture: " in text
        and f"(script setup {setup:.1f} s, trace 1.2 s, validate 2.5 s); peak host" in text
    )
    assert "GPU 5.0 GiB (1.25x eager's 4.0 GiB)" in text


def test_reproducible_builds_leave_the_peaks_out(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "cuda_available", lambda: True)
    monkeypatch.setattr(runner, "gpu_ids", lambda: ["0"])
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    root = _gpu_project(tmp_path)
    (r,) = runner.run_captures(load_settings(root, {"precompile.cache": "off"}), tmp_path / "work")
    doc = json.loads(assemble("simplepkg", [r])["manifest.json"])
    check_type(doc, Manifest)
    (variant,) = doc["targets"]["fwd"]["variants"]
    assert not {"peak_memory", "capture_breakdown", "capture_seconds"} & set(variant)


def test_the_scripts_setup_ends_where_its_first_capture_begins(tmp_path, monkeypatch):
    # a real capture records the seconds since the build started the script, once per
    # process (a second capture's setup would count the first capture's seconds)
    import time

    import torch

    import precompile_build

    stats = tmp_path / "stats.json"
    monkeypatch.setenv(capture_stats.STATS_ENV, str(stats))
    monkeypatch.setattr(capture_stats, "_began", False)
    for i, started in enumerate((time.time() - 5, time.time() - 100)):
        monkeypatch.setenv(capture_stats.STARTED_ENV, f"{started!r} {os.getpid()}")
        with precompile_build.capture(
            lambda x: x * 2 + 1,
            engine="eager",
            target=f"t{i}",
            artifact_path=tmp_path / f"t{i}.py",
            cache_path=tmp_path / f"t{i}.cache",
        ) as f:
            f(torch.ones(3))
        setup = json.loads(stats.read_text())["setup_s"]
        assert 5 <= setup < 60, setup
    _, breakdown = capture_stats.read(stats, None)
    assert breakdown == {"setup": setup}
    stats.unlink()
    for value in (
        None,
        "not a time",
        f"{time.time()!r} {os.getpid() + 1}",
        f"{time.time() + 60!r} {os.getpid()}",
    ):
        # outside a build, set by hand, another process's (the script's, inherited), a clock gone back
        monkeypatch.setattr(capture_stats, "_began", False)
        if value is None:
            monkeypatch.delenv(capture_stats.STARTED_ENV)
        else:
            monkeypatch.setenv(capture_stats.STARTED_ENV, value)
        capture_stats.capture_began()
        assert not stats.exists(), value


def test_processes_recording_at_once_keep_each_others_numbers(tmp_path, monkeypatch):
    # ranks or workers of one script record into the one stats file at the same time
    import subprocess
    import sys

    stats = tmp_path / "stats.json"
    monkeypatch.setenv(capture_stats.STATS_ENV, str(stats))
    code = (
        "import sys\nfrom precompile_build.process import stats as capture_stats\n"
        "for i in range(40):\n    capture_stats.record(**{f'r{sys.argv[1]}_{i}_s': float(i)})\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(r)]) for r in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    got = json.loads(stats.read_text())
    assert got == {f"r{r}_{i}_s": float(i) for r in range(4) for i in range(40)}


class _FakeCuda:
    """torch.cuda's allocated-bytes counters, driven by hand."""

    def __init__(self):
        self.now = self.peak = 0

    def alloc(self, n):
        self.now += n
        self.peak = max(self.peak, self.now)

    def free(self, n):
        self.now -= n

    def max_memory_allocated(self, device=None):
        return self.peak

    def reset_peak_memory_stats(self, device=None):
        self.peak = self.now


def _fake_cuda(monkeypatch, tmp_path):
    import torch

    cuda = _FakeCuda()
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", cuda.max_memory_allocated)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", cuda.reset_peak_memory_stats)
    monkeypatch.setenv(capture_stats.STATS_ENV, str(tmp_path / "stats.json"))
    return cuda


def test_a_cuda_capture_records_its_own_peak_and_each_steps(tmp_path, monkeypatch):
    # the model was built in fp32 and cast (a 2 GiB peak before the capture); the
    # capture's peak is its own, each step's is recorded, and the one that set it is named
    cuda = _fake_cuda(monkeypatch, tmp_path)
    cuda.alloc(2 * GIB)
    cuda.free(GIB)
    with capture_stats.cuda_peaks("cuda") as box:
        with capture_stats.timed("trace"):
            cuda.alloc(GIB // 8)
            cuda.free(GIB // 8)
        with capture_stats.timed("eager_call"):
            cuda.alloc(GIB // 4)
            cuda.free(GIB // 4)
        with capture_stats.timed("validate"):
            for extra in (GIB // 2, GIB // 4):  # two cases: the part keeps its highest
                with capture_stats.timed("validate_reference"):
                    cuda.alloc(extra)
                    cuda.free(extra)
    assert box["gpu_bytes"] == GIB + GIB // 2 and box["eager_gpu_bytes"] == GIB + GIB // 4
    assert box["steps"] == {
        "trace": GIB + GIB // 8,
        "eager_call": GIB + GIB // 4,
        "validate_reference": GIB + GIB // 2,
        "validate": GIB + GIB // 2,
    }
    peaks, breakdown = capture_stats.read(tmp_path / "stats.json", None)
    assert peaks["gpu_steps"]["validate_reference"] == GIB + GIB // 2 and set(breakdown) == {
        "trace",
        "eager_call",
        "validate",
    }
    assert capture_stats.describe(peaks, human_size) == (
        "peak GPU 1.5 GiB in validation's reference (1.20x eager's 1.2 GiB)"
    )


def test_a_peak_between_steps_counts_but_names_no_step(tmp_path, monkeypatch):
    cuda = _fake_cuda(monkeypatch, tmp_path)
    cuda.alloc(GIB)
    with capture_stats.cuda_peaks("cuda") as box:
        with capture_stats.timed("trace"):
            pass
        cuda.alloc(GIB)
        cuda.free(GIB)
        with capture_stats.timed("compile"):
            pass
    assert box["gpu_bytes"] == 2 * GIB and box["eager_gpu_bytes"] is None
    peaks, _ = capture_stats.read(tmp_path / "stats.json", None)
    assert capture_stats.peak_step(peaks) is None
    assert capture_stats.describe(peaks, human_size) == "peak GPU 2.0 GiB"
