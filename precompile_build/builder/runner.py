"""Run the capture scripts of a build, side by side, reusing cached captures.

Per selected target: resolve its device; with the capture cache on, compute its
key and, under the key's file lock, reuse a verified entry or run the script
(:mod:`.script`) in a device slot (:mod:`.slots`), validate the pair and store it.
Status lines, live progress and the summary table go to stderr (:mod:`.progress`).
Results come back in config order, whatever order the captures finished in.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor
from concurrent.futures import wait as wait_all
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union, cast

from ..config.settings import Settings, TargetSettings
from ..errors import CaptureError, ScriptFailed
from ..process import stats as capture_stats
from ..programs import path as program_path
from . import arch_report, cache_bound, capture_cache, ranks
from .hints import hints
from .pairs import PairInfo, read_source_metadata
from .progress import Progress, human_size, summary
from .results import CaptureResult, SummaryRow
from .script import (
    LOG_TAIL_LINES,
    check_pair,
    error_line,
    imports_changes,
    log_file,
    log_tail,
    rank_pair,
    run_script,
    stats_file,
)
from .slots import Slots

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
    global _cuda_cache
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


def _index(gpu: Optional[str]) -> Optional[Union[int, str]]:
    return int(gpu) if gpu is not None and gpu.isdigit() else gpu


def _sizes(r: CaptureResult) -> str:
    assert r.source_path is not None and r.cache_path is not None and r.info is not None
    fallback = (r.info.meta.get("fallback") or {}).get("reason")
    return (
        f"{r.info.engine}"
        + (f" (fallback: {fallback})" if fallback else "")
        + f"; source {human_size(r.source_path.stat().st_size)}, "
        f"cache {human_size(r.cache_path.stat().st_size)}" + arch_report.build_line(r.info.meta)
    )  # `cuda-archs`: what was left out and why


class _Cancelled(Exception):
    """The build stopped before this target ran (another required target failed: it is
    not started) or while it ran (Ctrl-C: it was killed); it has no result."""

    def __init__(self, name: str, started: bool = False):
        super().__init__(name)
        self.started = started


@dataclass
class _Build:
    """What the targets of one build share."""

    settings: Settings
    work: Path
    verbose: bool
    slots: Slots
    progress: Progress
    gpus: list = field(default_factory=list)
    """The usable GPUs' CUDA_VISIBLE_DEVICES entries (a world's real ranks need one each)."""
    abort: threading.Event = field(default_factory=threading.Event)
    """Set on Ctrl-C: running scripts are killed."""
    stop_new: threading.Event = field(default_factory=threading.Event)
    """Set when a required target failed (and on abort): targets still waiting for a
    slot or a cache lock are not started; running captures finish and are reported."""
    cache_root: Optional[Path] = None
    """None: the cache is off for this build (``cache_off`` says why)."""
    cache_off: str = "cache off"
    fingerprints: dict = field(default_factory=dict)
    package_sha256: str = ""
    package_files: dict = field(default_factory=dict)
    """The package's files and their sha256s (what ``package_sha256`` covers)."""
    used_keys: set = field(default_factory=set)
    """The capture cache entries this build looked up (kept by cache_bound.py)."""


def _plan_cache(b: _Build, devices: set) -> None:
    """Turn the cache on for this build when the settings want it and the host
    fingerprint and package digest can be computed (else say why not)."""
    if not b.settings.cache or not devices:
        return
    try:  # cache_root is set last: a half-planned cache stays off
        root = capture_cache.cache_root(b.settings)
        capture_cache.check_root(root)  # a cache others can write is code in every wheel
        b.fingerprints = capture_cache.host_fingerprints(devices, memo_dir=root)
        b.package_files = capture_cache.package_files(b.settings.package_dir)
        b.package_sha256 = capture_cache.digest_of(b.package_files)
        b.cache_root = root
    except (CaptureError, OSError, ValueError, subprocess.SubprocessError) as e:
        b.cache_off = f"cache off: {e}".replace("\n", " ")
        b.progress.say(f"precompile: capture cache unavailable for this build ({e})")


def _run_one(b: _Build, target: TargetSettings, device: Optional[str]) -> CaptureResult:
    required = target.required or b.settings.strict
    if device is None:
        reason = 'needs CUDA (device = "cuda") but this build host has no CUDA GPU'
        if required:
            reason += (
                "; build on a GPU host, or set `required = false` to leave it "
                "out of wheels built elsewhere"
            )
        return _fail_or_skip(b, target, required, "cuda", reason, None, 0.0)
    start = time.monotonic()
    world, problem = ranks.plan(target, device, b.settings.distributed, len(b.gpus))
    if problem is not None:
        return _fail_or_skip(b, target, required, device, problem, None, 0.0)
    if b.cache_root is None:
        return _capture(b, target, device, b.cache_off, None, start, world)
    root = b.cache_root
    try:
        components = capture_cache.key_components(
            b.settings, target, device, b.fingerprints[device], b.package_sha256
        )
        if world is not None:  # how the ranks ran changes what the wheel records
            components["world"] = {
                "size": world.size,
                "mesh": [list(d) for d in world.mesh],
                "mode": world.mode,
            }
        key = capture_cache.cache_key(components)
        b.used_keys.add(key)
        lock = capture_cache.lock(root, key)
        if not _acquire(b, target, lock):
            raise _Cancelled(target.name)
    except OSError as e:
        return _capture(b, target, device, f"cache unavailable: {e}", None, start, world)
    try:
        found = capture_cache.fetch(  # the imports record: checked where the capture ran
            root,
            key,
            target.name,
            b.work / "reused" / target.name,
            changes=lambda recorded: imports_changes(b.settings, target, device, recorded),
        )
        if found.meta is not None:
            cache_bound.used(root, key)  # least recently used entries go first
            return _reused(b, target, device, key, found.meta, start, world)
        why = found.why
        if found.miss == "no entry":  # say what changed since the target's last capture, if any
            why = (
                capture_cache.what_changed(root, components, b.settings.package, b.package_files)
                or why
            )
        if found.miss == "entry corrupt":
            b.progress.say(
                f"precompile: {target.name}: discarded cache entry {key[:12]}…: {found.detail}"
            )
        result = _capture(b, target, device, why, key, start, world)
        if result.status == "ok":
            try:
                capture_cache.store(
                    root,
                    key,
                    target.name,
                    result.source_path,  # type: ignore[arg-type]
                    result.cache_path,  # type: ignore[arg-type]
                    result.info,  # type: ignore[arg-type]
                    seconds=result.capture_seconds or 0.0,
                    capture_device=result.device_index,
                    components=components,
                    project_root=b.settings.root,
                    package=b.settings.package,
                    package_files=b.package_files,
                )
            except OSError as e:
                b.progress.say(
                    f"precompile: {target.name}: could not write the capture "
                    f"cache entry in {root}: {e}"
                )
        return result
    finally:
        lock.release()


def _acquire(b: _Build, target: TargetSettings, lock: Any) -> bool:
    """Take the entry lock; say so when another build holds it. False on abort."""
    import filelock

    told = False
    while not b.stop_new.is_set():
        try:
            lock.acquire(timeout=0 if not told else 0.5)
            return True
        except filelock.Timeout:
            if not told:
                b.progress.say(
                    f"precompile: {target.name}: waiting for another build "
                    f"capturing the same inputs (lock {lock.lock_file})"
                )
                told = True
    return False


def _reused(
    b: _Build,
    target: TargetSettings,
    device: str,
    key: str,
    meta: dict,
    start: float,
    world: Optional[ranks.WorldPlan] = None,
) -> CaptureResult:
    reused = b.work / "reused" / target.name
    r = CaptureResult(
        target.name,
        "ok",
        target.required,
        device,
        seconds=time.monotonic() - start,
        source_path=reused / f"{target.name}.py",
        cache_path=reused / f"{target.name}.cache",
        info=meta["info"],
        device_index=meta.get("capture_device"),
        origin="reused",
        cache_key=key,
        capture_seconds=meta.get("capture_seconds"),
        distributed=ranks.record(world, meta["info"].meta) if world is not None else None,
    )
    b.progress.say(
        f"precompile: {target.name}: ok on {device} in {r.seconds:.1f} s "
        f"({_sizes(r)}), reused (key {key[:12]}…)"
    )
    return r


def _capture(
    b: _Build,
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
        raise _Cancelled(target.name)
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
        raise _Cancelled(target.name, started=True)
    if reason is not None:
        return _fail_or_skip(b, target, required, where, reason, log_path, seconds)
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
    measured = "".join(
        f"; {m}"
        for m in (
            capture_stats.describe_breakdown(breakdown),
            capture_stats.describe(peaks, human_size),
        )
        if m
    )
    b.progress.say(
        f"precompile: {target.name}: ok on {where} in {seconds:.1f} s "
        f"({_sizes(r)}{measured}), captured (why: {why})"
    )
    for line in _capture_warnings(log_path):  # the log is in a temp dir: say them here
        b.progress.say(f"precompile: {target.name}: warning: {line}")
    if (
        log_path is not None
    ):  # max-autotune's fastest choices that could not be frozen (engines/autotune.py)
        for line in capture_stats.replaced_choices(stats_file(log_path)):
            b.progress.say(f"precompile: {target.name}: max-autotune: {line}")
    if r.distributed is not None:
        b.progress.say(
            f"precompile: {target.name}: {ranks.describe(r.distributed)} ({world.why})"  # type: ignore
            + (
                ""
                if (info.meta.get("collectives") if info else None)
                else "; note: the captured call has no DTensor parameter and runs no collective, "
                "so the pair does not depend on the world"
            )
        )
    return r


def _check_world(
    b: _Build, target: TargetSettings, world: ranks.WorldPlan, src: Path, info: Optional[PairInfo]
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


def _fail_or_skip(
    b: _Build,
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
        b = _Build(settings, work, verbose, Slots(settings.jobs, gpus), progress, gpus)
        targets = {n: _for_device(settings.targets[n], devices[n], progress) for n in names}
        _plan_cache(b, {d for d in devices.values() if d})
        with ThreadPoolExecutor(
            max_workers=max(1, len(names)), thread_name_prefix="precompile-capture"
        ) as pool:
            futures = {n: pool.submit(_run_one, b, targets[n], devices[n]) for n in names}
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
        if isinstance(outcomes[n], BaseException) and not isinstance(outcomes[n], _Cancelled):
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
    if isinstance(out, _Cancelled):
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
