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

and, for the frozen engine, the capture's seconds by step (:func:`timed`): ``trace``,
``eager_call``, ``compile`` (Inductor), ``first_run`` (the first run of the compiled
code: kernel loads and Triton's autotuning) and ``validate``.

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
from pathlib import Path
from typing import Any, Iterator, Optional

STATS_ENV = "PRECOMPILE_STATS_PATH"
"""Environment variable naming the capture's stats file (set by the build)."""


STEPS = ("trace", "eager_call", "compile", "first_run", "validate")
"""The capture steps :func:`timed` measures, in the order they run."""


def record(**numbers: float) -> None:
    """Merge ``numbers`` (name -> bytes as int, or seconds as float) into the stats
    file named by ``PRECOMPILE_STATS_PATH``; does nothing without it. An unwritable
    file is skipped: the numbers are a report, never a reason to fail a capture."""
    path = os.environ.get(STATS_ENV)
    if not path:
        return
    try:
        old = json.loads(Path(path).read_text()) if os.path.exists(path) else {}
        old.update({k: v for k, v in numbers.items() if v is not None})
        Path(path).write_text(json.dumps(old, sort_keys=True))
    except (OSError, ValueError, TypeError):
        pass


@contextlib.contextmanager
def timed(step: str) -> Iterator[None]:
    """Record the wall seconds of the block as ``<step>_s`` (one of :data:`STEPS`),
    also when it raises."""
    start = time.perf_counter()
    try:
        yield
    finally:
        record(**{f"{step}_s": round(time.perf_counter() - start, 3)})


@contextlib.contextmanager
def cuda_peaks(device: str) -> Iterator[dict]:
    """Measure the GPU peaks of one capture (``device`` ``"cuda"``; other devices:
    nothing). Inside, call ``box["eager"]()`` (a context manager) around the capture's
    eager call; on exit ``box`` holds ``gpu_bytes`` (the peak allocated by this
    process during the capture: the model's weights included) and
    ``eager_gpu_bytes`` (the peak during the eager call), which are also
    :func:`record`-ed. Resets torch.cuda's peak memory statistics."""
    box: dict[str, Any] = {"eager": contextlib.nullcontext}
    if device != "cuda":
        yield box
        return
    import torch

    torch.cuda.reset_peak_memory_stats()  # the capture's own peak, not the script's before it
    before = {"peak": torch.cuda.max_memory_allocated()}

    @contextlib.contextmanager
    def eager():
        before["peak"] = max(before["peak"], torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()  # from here on: the eager call's peak
        try:
            yield
        finally:
            box["eager_gpu_bytes"] = torch.cuda.max_memory_allocated()

    box["eager"] = eager
    try:
        yield box
    finally:
        box["gpu_bytes"] = max(before["peak"], torch.cuda.max_memory_allocated())
        record(gpu_bytes=box["gpu_bytes"], eager_gpu_bytes=box.get("eager_gpu_bytes"))


def maxrss_bytes(ru_maxrss: int) -> int:
    """``ru_maxrss`` in bytes (Linux reports KiB, macOS bytes)."""
    return ru_maxrss if sys.platform == "darwin" else ru_maxrss * 1024


def read(stats_path: Path, host_bytes: Optional[int]) -> tuple[Optional[dict], Optional[dict]]:
    """The target's ``(peaks, breakdown)``: peaks ``{"host_bytes", "gpu_bytes",
    "eager_gpu_bytes"}`` (those measured), breakdown ``{step: seconds}`` for the
    :data:`STEPS` timed; None where nothing was measured."""
    peaks: dict[str, int] = {}
    if host_bytes:
        peaks["host_bytes"] = int(host_bytes)
    try:
        stats = json.loads(Path(stats_path).read_text())
    except (OSError, ValueError):
        stats = {}
    for key in ("gpu_bytes", "eager_gpu_bytes"):
        if isinstance(stats.get(key), int):
            peaks[key] = stats[key]
    breakdown = {s: float(stats[f"{s}_s"]) for s in STEPS if isinstance(stats.get(f"{s}_s"), (int, float))}
    return peaks or None, breakdown or None


def describe_breakdown(breakdown: Optional[dict]) -> str:
    """``trace 5.1 s, compile 30.2 s, ...`` ("" for None)."""
    if not breakdown:
        return ""
    return ", ".join(f"{s.replace('_', ' ')} {breakdown[s]:.1f} s" for s in STEPS if s in breakdown)


def describe(peaks: Optional[dict], human_size) -> str:
    """``peak host 1.2 GiB, GPU 16.1 GiB (1.05x eager's 15.3 GiB)`` ("" for None)."""
    if not peaks:
        return ""
    parts = []
    if "host_bytes" in peaks:
        parts.append(f"host {human_size(peaks['host_bytes'])}")
    if "gpu_bytes" in peaks:
        gpu = f"GPU {human_size(peaks['gpu_bytes'])}"
        if peaks.get("eager_gpu_bytes"):
            gpu += (f" ({peaks['gpu_bytes'] / peaks['eager_gpu_bytes']:.2f}x eager's "
                    f"{human_size(peaks['eager_gpu_bytes'])})")
        parts.append(gpu)
    return "peak " + ", ".join(parts)


def short(peaks: Optional[dict], human_size) -> str:
    """The summary table's cell: ``1.2 GiB`` (host) or ``1.2 GiB/16.1 GiB`` (host/GPU)."""
    if not peaks:
        return "-"
    cells = [human_size(peaks[k]) for k in ("host_bytes", "gpu_bytes") if k in peaks]
    return "/".join(cells) or "-"
