"""What a capture measured about itself: its peak memory and where its seconds went.

The build runs each capture script in a subprocess (script.py). Per target, the peak
memory comes back in bytes:

- ``host_bytes``: the script process's peak resident set size (its own or of a
  process it waited for, whichever is larger: ``wait4``'s ``ru_maxrss``), read by the
  build when the script exits;
- for CUDA captures of the frozen engine, ``gpu_bytes`` (``torch.cuda.
  max_memory_allocated`` during the capture, the weights it holds included) and
  ``eager_gpu_bytes`` (the same during the capture's own eager call of the
  function): their ratio is what validation added over what the model needs. The
  capture writes them (:func:`record`) to the JSON file the build names in
  ``PRECOMPILE_STATS_PATH`` (nothing is written without it); :func:`read` gets them.

and the script's ``setup`` seconds, from the build starting the script to its first
capture (interpreter start, imports, the script building its model and inputs: the
script's time, not the capture's; :func:`capture_began`, any engine), then, for the
frozen engine, the capture's seconds by step (:func:`timed`): ``trace``,
``eager_call``, ``compile`` (Inductor), ``first_run`` (the first run of the compiled
code: kernel loads and Triton's autotuning) and ``validate``; for CUDA captures also
each step's GPU peak (``<step>_gpu_bytes``, the weights included): the step that set
``gpu_bytes`` is the one to look at when a capture needs more than its eager call.

With the frozen engine's autotuning (engines/autotune.py) also ``autotune_s``: the
seconds of ``compile`` and ``first_run`` spent autotuning (max-autotune's choice among
implementations, Triton's config tuning), shown as part of those steps, and
``autotune_replaced``: one line per selection whose fastest choice could not be
frozen and was replaced by the best-timed one that can (:func:`record_tuning`), which
the build line says.

None of them go into the pair (they vary from build to build); the build line, the
summary table, the manifest variant's ``peak_memory`` and ``capture_breakdown`` (left
out of reproducible builds, like ``capture_seconds``) and ``inspect`` show them.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from ..config import capture_env

STATS_ENV = capture_env.STATS_PATH
"""Environment variable naming the capture's stats file (set by the build)."""


STARTED_ENV = capture_env.SCRIPT_STARTED
"""Environment variable: ``"<time> <pid>"``, the wall-clock time (``time.time()``,
seconds) at which the build started the capture script, and the script's process id
(processes the script starts inherit it: they record no setup)."""

STEPS = ("setup", "trace", "eager_call", "compile", "first_run", "validate")
"""The script's setup (:func:`capture_began`), then the capture steps :func:`timed`
measures, in the order they run."""

_began = False  # capture_began has recorded this process's setup

VALIDATE_PARTS = ("validate_graph", "validate_frozen", "validate_reference")
"""Parts of ``validate`` (per case: the graph in its own dtypes, the frozen kernels,
the wide reference) whose GPU peaks are recorded too (their seconds are in
``validate``'s)."""


def record(**numbers: Any) -> None:
    """Merge ``numbers`` (name -> bytes as int, seconds as float, or a list of lines) into the stats
    file named by ``PRECOMPILE_STATS_PATH``; does nothing without it. Processes of one
    script (ranks, workers) may record at once: each merge holds a lock file beside
    it, and the file is replaced whole, so none loses another's numbers and a reader
    never sees a part. An unwritable file, or a lock not had in 10 s, is skipped: the
    numbers are a report, never a reason to fail a capture."""
    import filelock

    from precompile_runtime.envelope import write_atomic

    path = os.environ.get(STATS_ENV)
    if not path:
        return
    try:
        with filelock.FileLock(path + ".lock", timeout=10):
            old = json.loads(Path(path).read_text()) if os.path.exists(path) else {}
            old.update({k: v for k, v in numbers.items() if v is not None})
            write_atomic(path, json.dumps(old, sort_keys=True).encode())
    except (OSError, ValueError, TypeError, filelock.Timeout):
        pass


def record_tuning(report: Any) -> None:
    """Record an ``engines.autotune.Report``: ``autotune_s`` (its seconds, when there
    were any) and ``autotune_replaced`` (its replacements' lines, when there were any)."""
    numbers: dict[str, Any] = {}
    if report.seconds > 0:
        numbers["autotune_s"] = round(report.seconds, 3)
    if report.replaced:
        numbers["autotune_replaced"] = [r.line() for r in report.replaced]
    if numbers:
        record(**numbers)


def replaced_choices(stats_path: Path) -> list[str]:
    """The ``autotune_replaced`` lines a capture recorded (:func:`record_tuning`), or []."""
    try:
        lines = json.loads(Path(stats_path).read_text()).get("autotune_replaced")
    except (OSError, ValueError, AttributeError):
        return []
    return [str(x) for x in lines] if isinstance(lines, list) else []


def capture_began() -> None:
    """Record ``setup_s``: the seconds from the build starting this script
    (``PRECOMPILE_SCRIPT_STARTED``) to its first capture. Called as each capture
    begins; only the first capture of the script's own process records (not a rank or
    worker it started). Nothing outside a build (no variable, or not ``"<time> <pid>"``),
    nor when the clock went back (a negative setup)."""
    global _began  # noqa: PLW0603 - once per process: only its first capture records (tests reset it)
    if _began:
        return
    _began = True
    try:
        started, pid = os.environ.get(STARTED_ENV, "").split()
        setup = time.time() - float(started)
        mine = int(pid) == os.getpid()
    except ValueError:
        return
    if mine and setup >= 0:
        record(setup_s=round(setup, 3))


class _StepPeaks:
    """torch.cuda's one peak counter, shared by a capture and its steps: at each step's
    start and end the counter's peak is folded into the capture's (``total``) and into
    every open step's, then reset, so each step reads its own peak."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.total = 0
        self.open: dict[str, int] = {}  # step -> its peak so far
        self.done: dict[str, int] = {}  # step -> its peak

    def fold(self) -> None:
        peak = self.cuda.max_memory_allocated()
        self.total = max(self.total, peak)
        for step in self.open:
            self.open[step] = max(self.open[step], peak)
        self.cuda.reset_peak_memory_stats()  # from here: at least what is allocated now


_gpu: Optional[_StepPeaks] = None  # the CUDA capture being measured (cuda_peaks), if any


@contextlib.contextmanager
def timed(step: str) -> Iterator[None]:
    """Record the wall seconds of the block as ``<step>_s`` (``step``: one of
    :data:`STEPS` after ``setup``, or of :data:`VALIDATE_PARTS`), also when it raises; inside
    :func:`cuda_peaks` also its GPU peak in bytes as ``<step>_gpu_bytes`` (steps may
    nest; a step run more than once keeps its highest peak)."""
    gpu = _gpu
    if gpu is not None:
        gpu.fold()
        gpu.open[step] = 0
    start = time.perf_counter()
    try:
        yield
    finally:
        numbers: dict[str, float] = {f"{step}_s": round(time.perf_counter() - start, 3)}
        if gpu is not None and step in gpu.open:
            gpu.fold()
            peak = max(gpu.open.pop(step), gpu.done.get(step, 0))  # a part runs once per case
            numbers[f"{step}_gpu_bytes"] = gpu.done[step] = peak
        record(**numbers)


@contextlib.contextmanager
def cuda_peaks(device: str) -> Iterator[dict]:
    """Measure the GPU peaks of one capture (``device`` ``"cuda"``; other devices, or
    inside another :func:`cuda_peaks`: nothing). On exit the yielded dict holds
    ``gpu_bytes`` (the peak allocated by this process during the capture: the model's
    weights included; not what it allocated before), ``eager_gpu_bytes`` (the peak
    during the :func:`timed` step ``eager_call``, when there was one) and ``steps``
    (``{step: peak bytes}`` of the :func:`timed` steps inside), which are also
    :func:`record`-ed. Resets torch.cuda's peak memory statistics."""
    global _gpu  # noqa: PLW0603 - the capture's peaks, one per process, for timed() to read
    box: dict[str, Any] = {}
    if device != "cuda" or _gpu is not None:
        yield box
        return
    import torch

    gpu = _gpu = _StepPeaks(torch.cuda)
    torch.cuda.reset_peak_memory_stats()  # the capture's own peak, not the script's before it
    try:
        yield box
    finally:
        _gpu = None
        gpu.fold()
        box.update(
            gpu_bytes=gpu.total, eager_gpu_bytes=gpu.done.get("eager_call"), steps=dict(gpu.done)
        )
        record(gpu_bytes=gpu.total, eager_gpu_bytes=box["eager_gpu_bytes"])


def maxrss_bytes(ru_maxrss: int) -> int:
    """``ru_maxrss`` in bytes (Linux reports KiB, macOS bytes)."""
    return ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024


def read(stats_path: Path, host_bytes: Optional[int]) -> tuple[Optional[dict], Optional[dict]]:
    """The target's ``(peaks, breakdown)``: peaks ``{"host_bytes", "gpu_bytes",
    "eager_gpu_bytes", "gpu_steps": {step: bytes}}`` (those measured), breakdown
    ``{step: seconds}`` for the :data:`STEPS` recorded (``setup`` and the timed steps),
    and ``autotune`` (seconds within ``compile`` and ``first_run``) where recorded;
    None where nothing was measured."""
    peaks: dict[str, Any] = {}
    if host_bytes:
        peaks["host_bytes"] = int(host_bytes)
    try:
        stats = json.loads(Path(stats_path).read_text())
    except (OSError, ValueError):
        stats = {}
    for key in ("gpu_bytes", "eager_gpu_bytes"):
        if isinstance(stats.get(key), int):
            peaks[key] = stats[key]
    steps = {
        s: stats[f"{s}_gpu_bytes"]
        for s in STEPS + VALIDATE_PARTS
        if isinstance(stats.get(f"{s}_gpu_bytes"), int)
    }
    if steps and "gpu_bytes" in peaks:
        peaks["gpu_steps"] = steps
    breakdown = {
        s: float(stats[f"{s}_s"]) for s in STEPS if isinstance(stats.get(f"{s}_s"), (int, float))
    }
    if breakdown and isinstance(stats.get("autotune_s"), (int, float)):
        breakdown["autotune"] = float(stats["autotune_s"])  # part of compile and first_run
    return peaks or None, breakdown or None


def describe_breakdown(breakdown: Optional[dict]) -> str:
    """``script setup 12.0 s, trace 5.1 s, compile 30.2 s, ...`` ("" for None), then
    `` (autotuning 25.0 s of compile and first run)`` where the breakdown has it."""
    if not breakdown:
        return ""
    names = {"setup": "script setup"}
    text = ", ".join(
        f"{names.get(s, s.replace('_', ' '))} {breakdown[s]:.1f} s" for s in STEPS if s in breakdown
    )
    if breakdown.get("autotune"):
        text += f" (autotuning {breakdown['autotune']:.1f} s of compile and first run)"
    return text


def peak_step(peaks: Optional[dict]) -> Optional[str]:
    """The capture step whose GPU peak is the capture's (``peaks["gpu_steps"]``; a part
    of validate rather than validate), or None (not measured, or the peak fell between
    steps)."""
    peaks = peaks or {}
    steps = peaks.get("gpu_steps") or {}
    at_peak = [
        s for s in STEPS + VALIDATE_PARTS if s in steps and steps[s] >= peaks.get("gpu_bytes", 0)
    ]
    return at_peak[-1] if at_peak else None


_STEP_NAMES = {
    "validate_graph": "validation's graph run",
    "validate_frozen": "validation's frozen run",
    "validate_reference": "validation's reference",
}


def describe(peaks: Optional[dict], human_size) -> str:
    """``peak host 1.2 GiB, GPU 16.1 GiB in validation's reference (1.05x eager's
    15.3 GiB)`` ("" for None; ``in <step>`` where the per-step peaks say which step
    set it)."""
    if not peaks:
        return ""
    parts = []
    if "host_bytes" in peaks:
        parts.append(f"host {human_size(peaks['host_bytes'])}")
    if "gpu_bytes" in peaks:
        gpu = f"GPU {human_size(peaks['gpu_bytes'])}"
        step = peak_step(peaks)
        if step:
            gpu += f" in {_STEP_NAMES.get(step, step.replace('_', ' '))}"
        if peaks.get("eager_gpu_bytes"):
            gpu += (
                f" ({peaks['gpu_bytes'] / peaks['eager_gpu_bytes']:.2f}x eager's "
                f"{human_size(peaks['eager_gpu_bytes'])})"
            )
        parts.append(gpu)
    return "peak " + ", ".join(parts)


def short(peaks: Optional[dict], human_size) -> str:
    """The summary table's cell: ``1.2 GiB`` (host) or ``1.2 GiB/16.1 GiB`` (host/GPU)."""
    if not peaks:
        return "-"
    cells = [human_size(peaks[k]) for k in ("host_bytes", "gpu_bytes") if k in peaks]
    return "/".join(cells) or "-"
