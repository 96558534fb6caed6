"""What the targets of one build share, and the capture cache planned for it.

:class:`BuildState` holds the settings, the device slots, the progress output, the
events that stop the build and the capture cache's root and digests;
:func:`plan_cache` turns the cache on for the build where it can be;
:class:`Cancelled` is a target the build stopped before it had a result.
"""

from __future__ import annotations

import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..config.settings import Settings
from ..errors import CaptureError
from . import capture_cache
from .progress import Progress
from .slots import Slots

__all__ = ["BuildState", "Cancelled", "plan_cache"]


class Cancelled(Exception):
    """The build stopped before this target ran (another required target failed: it is
    not started) or while it ran (Ctrl-C: it was killed); it has no result."""

    def __init__(self, name: str, started: bool = False):
        super().__init__(name)
        self.started = started


@dataclass
class BuildState:
    """What the targets of one build share."""

    settings: Settings
    work: Path
    verbose: bool
    slots: Slots
    progress: Progress
    gpus: list[str] = field(default_factory=list)
    """The usable GPUs' CUDA_VISIBLE_DEVICES entries (a world's real ranks need one each)."""
    abort: threading.Event = field(default_factory=threading.Event)
    """Set on Ctrl-C: running scripts are killed."""
    stop_new: threading.Event = field(default_factory=threading.Event)
    """Set when a required target failed (and on abort): targets still waiting for a
    slot or a cache lock are not started; running captures finish and are reported."""
    cache_root: Optional[Path] = None
    """None: the cache is off for this build (``cache_off`` says why)."""
    cache_off: str = "cache off"
    fingerprints: dict[str, Any] = field(default_factory=dict)
    package_sha256: str = ""
    package_files: dict[str, str] = field(default_factory=dict)
    """The package's files and their sha256s (what ``package_sha256`` covers)."""
    used_keys: set[str] = field(default_factory=set)
    """The capture cache entries this build looked up (kept by cache_bound.py)."""


def plan_cache(b: BuildState, devices: set[str]) -> None:
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
