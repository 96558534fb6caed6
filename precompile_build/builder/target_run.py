"""One target of a build, from its device to its result: the world it needs, the
capture cache's key and entry under the entry's lock (a verified entry reused, else
the capture run and stored), or the capture alone with the cache off.
"""

from __future__ import annotations

import time
from typing import Any, Optional

from ..config.settings import TargetSettings
from . import cache_bound, capture_cache, ranks
from .build_state import BuildState, Cancelled
from .capture_run import capture, fail_or_skip, pair_sizes
from .results import CaptureResult
from .script import imports_changes

__all__ = ["run_one"]


def run_one(b: BuildState, target: TargetSettings, device: Optional[str]) -> CaptureResult:
    """Capture (or reuse) ``target`` on ``device`` (None: `cuda` on a host without CUDA).

    Returns:
        its :class:`~.results.CaptureResult` (``failed``: an optional target left out).
    Raises:
        ScriptFailed: a required target failed.
        Cancelled: the build stopped before or while it ran.
    """
    required = target.required or b.settings.strict
    if device is None:
        reason = 'needs CUDA (device = "cuda") but this build host has no CUDA GPU'
        if required:
            reason += (
                "; build on a GPU host, or set `required = false` to leave it "
                "out of wheels built elsewhere"
            )
        return fail_or_skip(b, target, required, "cuda", reason, None, 0.0)
    start = time.monotonic()
    world, problem = ranks.plan(target, device, b.settings.distributed, len(b.gpus))
    if problem is not None:
        return fail_or_skip(b, target, required, device, problem, None, 0.0)
    if b.cache_root is None:
        return capture(b, target, device, b.cache_off, None, start, world)
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
            raise Cancelled(target.name)
    except OSError as e:
        return capture(b, target, device, f"cache unavailable: {e}", None, start, world)
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
        result = capture(b, target, device, why, key, start, world)
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


def _acquire(b: BuildState, target: TargetSettings, lock: Any) -> bool:
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
    b: BuildState,
    target: TargetSettings,
    device: str,
    key: str,
    meta: dict[str, Any],
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
        f"({pair_sizes(r)}), reused (key {key[:12]}…)"
    )
    return r
