"""The typed hand-offs of the builder: a target's result, a script's run, a pair's
check, a summary row.

Control flow reads their fields (``status``, ``outcome``, ``origin``), never the words
of a reason: a reason is what a line on stderr or an error message shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional, Union

from .pairs import PairInfo

__all__ = [
    "CaptureResult",
    "Origin",
    "Outcome",
    "PairCheck",
    "RowResult",
    "ScriptRun",
    "Status",
    "SummaryRow",
]

Status = Literal["ok", "failed"]
"""A target's result: ``ok`` (its pair goes into the wheel) or ``failed`` (an optional
target left out)."""

Origin = Literal["captured", "reused"]
"""Where an ``ok`` target's pair came from: its script ran in this build, or the
capture cache held it."""

Outcome = Literal["ok", "failed", "cancelled"]
"""How a capture script's run ended: exit status 0, a failure (``reason`` says which),
or stopped because the build was stopped."""

RowResult = Literal["captured", "reused", "left out", "failed", "cancelled", "not started"]
"""A target's result as the summary table says it."""


@dataclass
class CaptureResult:
    """Outcome of one target."""

    name: str
    status: Status
    """`ok` or `failed` (an optional target left out; `reason` says why)."""
    required: bool
    device: str
    """Resolved device: `cpu` or `cuda`."""
    seconds: float = 0.0
    """Wall seconds this build spent on the target (a reused pair: the lookup)."""
    reason: Optional[str] = None
    source_path: Optional[Path] = None
    cache_path: Optional[Path] = None
    info: Optional[PairInfo] = None
    device_index: Optional[Union[int, str]] = None
    """The ``CUDA_VISIBLE_DEVICES`` entry the capture ran on (an int when numeric);
    None for CPU captures. A reused pair keeps the one it was captured on."""
    origin: Origin = "captured"
    """`captured` (the script ran in this build) or `reused` (from the capture cache)."""
    why: Optional[str] = None
    """Why it was captured: `no entry`, `changed since the last capture (key …): the
    script …` (:func:`.capture_cache.what_changed`), `imports changed: ...`,
    `entry corrupt: ...`, `cache off`, ... (shown, never parsed)."""
    cache_key: Optional[str] = None
    """The capture cache key (sha256 hex); None with the cache off."""
    capture_seconds: Optional[float] = None
    """Seconds the capture itself took (for a reused pair, when it was captured)."""
    peak_memory: Optional[dict[str, Any]] = None
    """The capture's peaks in bytes (:func:`.capture_stats.read`: ``host_bytes``, and for
    CUDA captures of the frozen engine ``gpu_bytes`` and ``eager_gpu_bytes``); None
    for a reused pair or where nothing was measured."""
    capture_breakdown: Optional[dict[str, Any]] = None
    """Seconds per step (:data:`.capture_stats.STEPS`: the script's setup before its
    capture, then the frozen engine's trace, eager call, compile, first run, validate);
    None where not measured."""
    log_path: Optional[Path] = None
    """A left-out target's whole log, kept after the build (as for a failed required
    target: ``<tmp>/precompile-build-logs/NAME-<pid>.log``); None when it has none."""
    distributed: Optional[dict[str, Any]] = None
    """A `world-size` target's record (:func:`.ranks.record`: world size, mesh, `real`
    or `fake`, backend, ranks captured, validated); None for other targets."""


class ScriptRun(NamedTuple):
    """What :func:`.script.run_script` gives back about one capture script's run."""

    outcome: Outcome
    reason: Optional[str]
    """Why it failed, for the messages (None unless ``outcome`` is ``failed``); a
    reason from another rank than 0 begins ``rank R``."""
    source: Path
    cache: Path
    log: Path
    """The log of the rank that failed first, else rank 0's."""
    peaks: Optional[dict[str, Any]] = None
    """Rank 0's peaks (:func:`.capture_stats.read`), or None."""
    breakdown: Optional[dict[str, Any]] = None
    """Rank 0's seconds per step (:func:`.capture_stats.read`), or None."""


class PairCheck(NamedTuple):
    """What :func:`.script.check_pair` found of the pair a script wrote: its
    :class:`PairInfo` when it is usable, else the reason it is not."""

    info: Optional[PairInfo]
    reason: Optional[str] = None

    @property
    def ok(self) -> bool:
        """Whether the pair is usable (``info`` is set)."""
        return self.info is not None


class SummaryRow(NamedTuple):
    """One row of the end-of-build table (:func:`.progress.summary`)."""

    name: str
    where: str
    """The device it ran on (``cuda:1``), or ``-`` when none was resolved."""
    result: RowResult
    seconds: Optional[float] = None
    size: Optional[int] = None
    """Bytes of the pair (an ``ok`` target's), else None."""
    peaks: Optional[dict[str, Any]] = None
