"""Run the capture scripts of a build, side by side, reusing cached captures.

Per selected target: resolve its device; then, on a thread of its own,
:func:`.target_run.run_one`: with the capture cache on, its key and, under the key's
file lock, a verified entry reused or the script run (:mod:`.capture_run`, :mod:`.script`)
in a device slot (:mod:`.slots`), its pair validated and stored. What the targets share
is a :class:`.build_state.BuildState`. Status lines, live progress and the summary table
go to stderr (:mod:`.progress`). Results come back in config order, whatever order the
captures finished in.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import warnings
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from pathlib import Path
from typing import Any, Optional, Union, cast

from ..config.settings import Settings, TargetSettings
from ..errors import CaptureError, ScriptFailed
from ..programs import path as program_path
from . import cache_bound
from .build_state import BuildState, Cancelled, plan_cache
from .progress import Progress, summary
from .results import CaptureResult, SummaryRow
from .slots import Slots
from .target_run import run_one

__all__ = [
    "CaptureResult",
    "CaptureWarning",
    "artifacts_for",
    "cuda_available",
    "gpu_ids",
    "require_torch",
    "resolve_device",
    "run_captures",
]


class CaptureWarning(UserWarning):
    """An optional target was left out of the wheel."""


_cuda_cache: Optional[int] = None


def cuda_available() -> bool:
    """Whether this build host has a usable CUDA GPU (cached per process).

    ``nvidia-smi -L`` listing a GPU counts; where nvidia-smi is missing but
    ``/dev/nvidiactl`` exists, asks ``torch.cuda.device_count()`` in a subprocess.
    ``CUDA_VISIBLE_DEVICES`` set to ``""`` or ``-1`` means no.
    """
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return _gpu_count() > 0


def gpu_ids() -> list[str]:
    """``CUDA_VISIBLE_DEVICES`` values of the usable GPUs, one per GPU: the entries
    of an inherited ``CUDA_VISIBLE_DEVICES``, else ``0..N-1``; [] without CUDA."""
    if not cuda_available():
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    return [str(i) for i in range(_gpu_count())]


def _gpu_count() -> int:
    global _cuda_cache  # noqa: PLW0603 - a process-wide cache, probed once
    if _cuda_cache is None:
        _cuda_cache = _probe_cuda()
    return _cuda_cache


def _probe_cuda() -> int:
    """Number of CUDA GPUs of this host (0 when none or unknown)."""
    cmd = None
    if shutil.which("nvidia-smi"):
        cmd = ["nvidia-smi", "-L"]
    elif os.path.exists("/dev/nvidiactl"):
        cmd = [sys.executable, program_path("cuda_count")]
    if cmd is None:
        return 0
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if proc.returncode != 0:
        return 0
    if cmd[0] == "nvidia-smi":
        return sum(1 for ln in proc.stdout.splitlines() if ln.startswith("GPU "))
    try:
        return int(proc.stdout.split()[-1])
    except (IndexError, ValueError):
        return 0


def resolve_device(device: str) -> Optional[str]:
    """`cpu`/`cuda` for a configured device; None for `cuda` on a host without CUDA."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        return None
    return device


def require_torch() -> None:
    """Raise CaptureError unless torch can be imported by the build's interpreter
    (``sys.executable``, which also runs the capture scripts). Does not import torch."""
    import importlib.util

    try:
        found = importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise CaptureError(
            "Failed to run the captures: torch is not installed where the build runs "
            f"({sys.executable}), and the capture scripts need it. Add torch to "
            "`build-system.requires` in pyproject.toml, pinned to the torch the artifacts "
            'are for (e.g. "torch==2.13.0"; an unpinned one takes the newest release), or '
            "install torch into this environment and build without isolation "
            "(`python -m build --no-isolation`, `pip wheel --no-build-isolation .`)"
        )


def artifacts_for(results: Any) -> Optional[str]:
    """One line naming the torch, CUDA, Triton and Python the captured pairs are
    for (per device when they differ); None when nothing was captured."""
    seen: dict[str, str] = {}
    for r in results:
        if getattr(r, "status", None) != "ok" or r.info is None:
            continue
        fp = r.info.fingerprint
        desc = f"torch {fp.get('torch') or '?'}"
        if fp.get("device_type") == "cpu":  # (the torch's own CUDA and Triton serve no CPU pair)
            desc += ", CPU"
        else:
            desc += f", CUDA {fp.get('cuda') or 'none'}"
            if fp.get("hip"):
                desc += f", HIP {fp['hip']}"
            desc += f", Triton {fp.get('triton') or 'none'}"
            if fp.get("compute_capability"):
                desc += f", sm {fp['compute_capability']}"
        desc += f", Python {fp.get('python') or '?'}, {fp.get('platform') or '?'}"
        seen.setdefault(r.device, desc)
    if not seen:
        return None
    parts = (
        [next(iter(seen.values()))]
        if len(set(seen.values())) == 1
        else [f"{d}: {v}" for d, v in sorted(seen.items())]
    )
    return (
        "precompile: the artifacts are for "
        + "; ".join(parts)
        + " (another torch: pin it in `build-system.requires`, or build with "
        "--no-isolation where it is installed)"
    )


def run_captures(
    settings: Settings, work: Path, *, verbose: Optional[bool] = None
) -> list[CaptureResult]:
    """Run every selected target, independent ones at the same time.

    Args:
        settings: resolved settings; ``selected`` names the targets, ``jobs`` how
            many run at once, ``cache``/``cache_dir`` the capture cache.
        work: fresh temp directory for pairs and logs (``work/logs/NAME.log``).
        verbose: default ``settings.verbose``: stream script output to stderr.
    Returns:
        one :class:`CaptureResult` per selected target, in config order. A failed
        optional target is ``failed`` and warned about (:class:`CaptureWarning`).
    Raises:
        CaptureError: torch is not importable here (:func:`require_torch`), or a
            required target (any target with ``strict``) failed: the
            first in config order. Captures already running finish (their pairs go
            to the capture cache) and targets not yet started are not started; the
            summary shows each target's outcome. The message names the target, the
            reason and the last lines of its log.
    """
    verbose = settings.verbose if verbose is None else verbose
    work = Path(work)
    names = settings.selected
    if names:
        require_torch()
    devices = {n: resolve_device(settings.targets[n].device) for n in names}
    gpus = gpu_ids() if "cuda" in devices.values() else []
    with Progress(live=False if verbose else None) as progress:
        b = BuildState(settings, work, verbose, Slots(settings.jobs, gpus), progress, gpus)
        targets = {n: _for_device(settings.targets[n], devices[n], progress) for n in names}
        plan_cache(b, {d for d in devices.values() if d})
        with ThreadPoolExecutor(
            max_workers=max(1, len(names)), thread_name_prefix="precompile-capture"
        ) as pool:
            futures = {n: pool.submit(run_one, b, targets[n], devices[n]) for n in names}
            try:
                pending = set(futures.values())
                while pending:
                    done, pending = wait_all(pending, return_when=FIRST_EXCEPTION)
                    if any(f.exception() is not None for f in done):
                        b.stop_new.set()  # the running ones finish and are reported
            except BaseException:
                b.stop_new.set()
                b.abort.set()
                raise
        outcomes = {n: (f.exception() or f.result()) for n, f in futures.items()}
        progress.say(summary([_row(n, devices[n], outcomes[n]) for n in names]))
        if b.cache_root is not None:  # `cache-max-size`: evict, then say the cache's size
            try:
                progress.say(cache_bound.bound(b.cache_root, settings.cache_max_size, b.used_keys))
            except OSError as e:
                progress.say(f"precompile: capture cache {b.cache_root} not bounded: {e}")
        line = artifacts_for(o for o in outcomes.values() if isinstance(o, CaptureResult))
        if line and not any(
            isinstance(o, BaseException) for o in outcomes.values()
        ):  # a failed build has none
            progress.say(line)
    for n in names:
        if isinstance(outcomes[n], BaseException) and not isinstance(outcomes[n], Cancelled):
            raise outcomes[n]  # type: ignore[misc]
    results = cast("list[CaptureResult]", [outcomes[n] for n in names])  # the failures raised above
    for r in results:
        if r.status != "ok":  # warned here, in the calling thread
            warnings.warn(
                f"optional target {r.name!r} left out of the wheel: {r.reason}"
                + (f" (whole log: {r.log_path})" if r.log_path else ""),
                CaptureWarning,
                stacklevel=2,
            )
    return results


def _for_device(
    target: TargetSettings, device: Optional[str], progress: Progress
) -> TargetSettings:
    """The target as captured on ``device``: `cuda-graphs` does not apply to a CPU
    capture (a `device = "auto"` target on a build host without CUDA, as in a CPU
    build of a project also built on a GPU host), so it is dropped with a note,
    before anything runs, and the pair records nothing of it."""
    if target.cuda_graphs and device == "cpu":
        progress.say(
            f"precompile: {target.name}: cuda-graphs = true does not apply to a "
            'CPU capture (device = "auto" on a build host without CUDA): '
            "captured without it; a CUDA build host's variant keeps it"
        )
        return dataclasses.replace(target, cuda_graphs=False)
    return target


def _row(name: str, device: Optional[str], out: Union[CaptureResult, BaseException]) -> SummaryRow:
    if isinstance(out, Cancelled):
        return SummaryRow(name, device or "-", "cancelled" if out.started else "not started")
    if isinstance(out, BaseException):
        seconds = out.seconds if isinstance(out, ScriptFailed) else None
        return SummaryRow(name, device or "-", "failed", seconds)
    where = out.device
    if out.device == "cuda" and out.device_index is not None:
        where = f"cuda:{out.device_index}"
    if out.status != "ok":
        return SummaryRow(name, where, "left out", out.seconds, None, out.peak_memory)
    assert out.source_path is not None and out.cache_path is not None
    size = out.source_path.stat().st_size + out.cache_path.stat().st_size
    return SummaryRow(name, where, out.origin, out.seconds, size, out.peak_memory)
