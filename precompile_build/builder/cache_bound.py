"""The capture cache's bound: `cache-max-size`, least recently used entries evicted.

Every build that captured or reused a target adds or touches its entry
(``<cache dir>/<key>/``, and its ``<key>.lock``), so a project edited often grows the
cache by an entry per target per edit. After each build, :func:`bound` removes the
least recently used entries until the cache holds at most ``cache-max-size`` bytes:
never one this build used, never one whose lock another build holds (it is being
looked up or written), each with its ``.lock`` file; lock files whose entry is gone
(a capture that failed) go too. "Used" is the entry folder's mtime: set when the
entry is written, and again at each reuse (:func:`used`). The line it returns (the
cache's size, entries, bound, what was removed) ends the build's summary.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from . import capture_cache
from .progress import human_size


def _is_key(name: str) -> bool:
    return len(name) == 64 and all(c in "0123456789abcdef" for c in name)


def _bytes(entry: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(entry):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def entries(root: Path) -> list[tuple[float, str, int]]:
    """``(last used, key, bytes)`` of each entry under ``root``, least recently used first."""
    out = []
    try:
        names = os.listdir(root)
    except OSError:
        return []
    for name in names:
        path = root / name
        if _is_key(name) and path.is_dir() and not path.is_symlink():
            try:
                out.append((path.stat().st_mtime, name, _bytes(path)))
            except OSError:
                continue
    return sorted(out)


def used(root: Path, key: str) -> None:
    """Mark entry ``key`` as used now (its folder's mtime): a reuse keeps it longest."""
    try:
        os.utime(root / key)
    except OSError:
        pass


def _take(root: Path, key: str) -> Optional[Any]:
    """Entry ``key``'s lock, taken without waiting; None when another build holds it."""
    import filelock

    lock = capture_cache.lock(root, key)
    try:
        lock.acquire(timeout=0)
    except (filelock.Timeout, OSError):
        return None
    return lock


def _remove(root: Path, key: str, lock: Any, entry: bool) -> None:
    """With ``lock`` (the entry's, taken): the entry (when ``entry``), then the lock file."""
    try:
        if entry:
            capture_cache.discard(root / key)
        (root / f"{key}.lock").unlink(missing_ok=True)
    finally:
        lock.release()


def bound(root: Path, max_bytes: Optional[int], keep: Iterable[str]) -> str:
    """Evict least recently used entries until the cache at ``root`` holds at most
    ``max_bytes`` (None: no bound), and say what it holds.

    Args:
        root: the capture cache directory.
        max_bytes: `cache-max-size` in bytes, or None.
        keep: the keys this build used (never removed).
    Returns:
        the summary's line: ``precompile: capture cache DIR: 1.2 GiB in 14 entries
        (at most 10.0 GiB; removed 3 least recently used, 310.0 MiB)``.
    Raises:
        OSError: ``root`` cannot be listed (the cache is an optimisation: the caller
            says so and goes on).
    """
    keep = set(keep)
    found = entries(root)
    total = sum(b for _, _, b in found)
    removed, freed = 0, 0
    for _, key, size in found:
        if max_bytes is None or total <= max_bytes:
            break
        lock = None if key in keep else _take(root, key)
        if lock is None:  # this build's, or in use by another build
            continue
        _remove(root, key, lock, entry=True)
        total, removed, freed = total - size, removed + 1, freed + size
    now = time.time()
    for name in os.listdir(root):  # the locks of entries that are gone (failed captures)
        key = name.removesuffix(".lock")
        if not name.endswith(".lock") or not _is_key(key) or key in keep or (root / key).exists():
            continue
        try:
            old = now - os.lstat(root / name).st_mtime > 60  # not one a build has just made
        except OSError:
            continue
        lock = _take(root, key) if old else None
        if lock is not None:
            _remove(root, key, lock, entry=False)
    count = len(found) - removed
    line = (
        f"precompile: capture cache {root}: {human_size(total)} in {count} "
        f"entr{'y' if count == 1 else 'ies'}"
    )
    bits = [f"at most {human_size(max_bytes)}" if max_bytes is not None else "no size bound"]
    if removed:
        bits.append(f"removed {removed} least recently used, {human_size(freed)}")
    return f"{line} ({'; '.join(bits)})"
