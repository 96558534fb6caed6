"""One target's capture: its script run in a device slot, the pair it wrote checked
(a world's other ranks' too), the build's lines about it, and a failure raised or the
optional target left out.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Optional, Union

from ..config.settings import TargetSettings
from ..errors import ScriptFailed
from ..process import stats as capture_stats
from . import arch_report, ranks
from .build_state import BuildState, Cancelled
from .hints import hints
from .pairs import PairInfo, read_source_metadata
from .progress import human_size
from .results import CaptureResult
from .script import (
    LOG_TAIL_LINES,
    check_pair,
    error_line,
    log_file,
    log_tail,
    rank_pair,
    run_script,
    stats_file,
)

__all__ = ["capture", "fail_or_skip", "pair_sizes"]


def _index(gpu: Optional[str]) -> Optional[Union[int, str]]:
    return int(gpu) if gpu is not None and gpu.isdigit() else gpu


def pair_sizes(r: CaptureResult) -> str:
    assert r.source_path is not None and r.cache_path is not None and r.info is not None
    fallback = (r.info.meta.get("fallback") or {}).get("reason")
    return (
        f"{r.info.engine}"
        + (f" (fallback: {fallback})" if fallback else "")
        + f"; source {human_size(r.source_path.stat().st_size)}, "
        f"cache {human_size(r.cache_path.stat().st_size)}" + arch_report.build_line(r.info.meta)
    )  # `cuda-archs`: what was left out and why


def capture(
    b: BuildState,
    target: TargetSettings,
    device: str,
    why: str,
    key: Optional[str],
    start: float,
    world: Optional[ranks.WorldPlan] = None,
) -> CaptureResult:
    """Run the script in a device slot (a world's real ranks on the CUDA: a GPU each)
    and validate its pair (and the other ranks')."""
    required = target.required or b.settings.strict
    ok, gpu = b.slots.acquire(device, b.stop_new, count=world.processes if world is not None else 1)
    if not ok:
        raise Cancelled(target.name)
    where = device if gpu is None else f"cuda:{gpu}"
    b.progress.started(target.name, where, log_file(b.work, target))
    run_start = time.monotonic()
    info = None
    try:
        run = run_script(b.settings, target, device, gpu, b.work, b.verbose, b.abort, world)
        src, cache, log_path = run.source, run.cache, run.log
        peaks, breakdown = run.peaks, run.breakdown
        reason = run.reason
        if run.outcome == "failed":
            error = error_line(log_path)  # the script's exception: CaptureError: ...
            reason = f"{run.reason}: {error}" if error else str(run.reason)
            reason += hints(error, target.script)  # a missing module, a file shadowing one
        elif run.outcome == "ok":
            info, reason = check_pair(src, cache)
            if reason is None and world is not None:
                reason = _check_world(b, target, world, src, info)
        if run.outcome != "cancelled" and reason is not None and required:
            b.stop_new.set()  # before the slot is free: no other target starts now
    finally:
        b.slots.release(device, gpu)
        b.progress.finished(target.name)
    seconds = time.monotonic() - run_start
    if run.outcome == "cancelled":
        raise Cancelled(target.name, started=True)
    if reason is not None:
        return fail_or_skip(b, target, required, where, reason, log_path, seconds)
    r = CaptureResult(
        target.name,
        "ok",
        target.required,
        device,
        seconds=time.monotonic() - start,
        source_path=src,
        cache_path=cache,
        info=info,
        device_index=_index(gpu),
        origin="captured",
        why=why,
        cache_key=key,
        capture_seconds=seconds,
        peak_memory=peaks,
        capture_breakdown=breakdown,
        distributed=ranks.record(world, info.meta) if world is not None and info else None,
    )
    _say_captured(b, target, r, where, log_path, world)
    return r


def _say_captured(
    b: BuildState,
    target: TargetSettings,
    r: CaptureResult,
    where: str,
    log_path: Path,
    world: Optional[ranks.WorldPlan],
) -> None:
    """The build's lines for a pair captured in this build: the target's line (sizes,
    what was measured, why it was captured), the capture's warnings, max-autotune's
    choices that could not be frozen, a world's record."""
    measured = "".join(
        f"; {m}"
        for m in (
            capture_stats.describe_breakdown(r.capture_breakdown),
            capture_stats.describe(r.peak_memory, human_size),
        )
        if m
    )
    b.progress.say(
        f"precompile: {target.name}: ok on {where} in {r.capture_seconds or 0.0:.1f} s "
        f"({pair_sizes(r)}{measured}), captured (why: {r.why})"
    )
    for line in _capture_warnings(log_path):  # the log is in a temp dir: say them here
        b.progress.say(f"precompile: {target.name}: warning: {line}")
    # max-autotune's fastest choices that could not be frozen (engines/autotune.py)
    for line in capture_stats.replaced_choices(stats_file(log_path)):
        b.progress.say(f"precompile: {target.name}: max-autotune: {line}")
    if r.distributed is not None and world is not None:
        collectives = r.info.meta.get("collectives") if r.info is not None else None
        b.progress.say(
            f"precompile: {target.name}: {ranks.describe(r.distributed)} ({world.why})"
            + (
                ""
                if collectives
                else "; note: the captured call has no DTensor parameter and runs no collective, "
                "so the pair does not depend on the world"
            )
        )


def _check_world(
    b: BuildState,
    target: TargetSettings,
    world: ranks.WorldPlan,
    src: Path,
    info: Optional[PairInfo],
) -> Optional[str]:
    """Rank 0's pair was captured in the declared world, and (real) every other
    rank's pair computes what it does; returns the failure reason, or None."""
    assert info is not None
    problem = ranks.world_problem(info.meta, world)
    if problem is not None:
        return problem
    rank0 = (src.read_bytes(), info.meta)
    for rank in range(1, world.processes):
        r_src, r_cache = rank_pair(b.work, target, rank)
        checked = check_pair(r_src, r_cache)
        if not checked.ok:
            return f"rank {rank} {checked.reason}"
        data = r_src.read_bytes()
        reason = ranks.rank_difference(
            rank0, (data, read_source_metadata(data, what=str(r_src))), rank
        )
        if reason is not None:
            return reason
    return None


def _capture_warnings(log_path: Optional[Path]) -> list[str]:
    """The capture API's warnings that a script printed to its log (PythonStateWarning:
    Python randomness frozen into the pair; TracerFallbackWarning: ``auto`` traced with
    make_fx), each once."""
    try:
        text = Path(log_path).read_text(encoding="utf-8", errors="replace") if log_path else ""
    except OSError:
        return []
    found = [
        ln.split(f"{cat}: ", 1)[1].strip()
        for ln in text.splitlines()
        for cat in ("PythonStateWarning", "TracerFallbackWarning")
        if f"{cat}: " in ln
    ]
    return list(dict.fromkeys(found))


def fail_or_skip(
    b: BuildState,
    target: TargetSettings,
    required: bool,
    device: str,
    reason: str,
    log_path: Optional[Path],
    seconds: float,
) -> CaptureResult:
    if required:
        tail = ""
        if log_path is not None:
            kept: Optional[Path] = _keep_log(log_path, target.name)
            tail = f"\nlast {LOG_TAIL_LINES} lines of its log (whole log: {kept}):\n" + log_tail(
                log_path
            )
        raise ScriptFailed(reason, target=target.name, log_tail=tail, seconds=seconds)
    kept = _keep_log(log_path, target.name) if log_path is not None else None
    b.progress.say(
        f"precompile: {target.name}: left out ({reason}"
        + (f"; whole log: {kept})" if kept else ")")
    )
    return CaptureResult(
        target.name,
        "failed",
        False,
        device.split(":")[0],
        seconds=seconds,
        reason=reason,
        log_path=kept,
    )


def _keep_log(log_path: Path, name: str) -> Path:
    """Copy a failed capture's log out of the build's temp dir (removed when the build
    ends) to ``<tmp>/precompile-build-logs/NAME-<pid>.log``; returns where it is."""
    import tempfile

    dest = Path(tempfile.gettempdir()) / "precompile-build-logs" / f"{name}-{os.getpid()}.log"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_path, dest)
    except OSError:
        return log_path
    return dest
