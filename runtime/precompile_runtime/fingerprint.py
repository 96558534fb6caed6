"""Host fingerprints: what a variant's frozen kernels are tied to, and matching.

A fingerprint is a flat dict of strings (or None). Fields in :data:`EXACT_FIELDS`
must be equal between the capture host and this host for a variant to be used:

- ``torch``: the full version with its local build label (``2.13.0+cpu``,
  ``2.11.0+cu130``); compiled kernels call into libtorch's C++ ABI and inductor's
  generated wrapper, neither stable across releases.
- ``cuda`` / ``hip``: the toolkit torch was built with; cubins and the runtime differ.
- ``triton``: cubins and launch metadata come from one triton release.
- ``python``: ``major.minor``; CPU kernels are CPython extension modules.
- ``platform``: ``sysconfig.get_platform()``; native code is OS and arch specific.
- ``device_type``: ``cpu`` or ``cuda``.
- ``compute_capability``: ``9.0`` for sm_90; a cubin for another SM is never run.

``cpu_isa`` (the vector ISA the CPU kernels were compiled for, e.g. ``avx512``)
must be *supported* by this host (not equal). ``gpu_name`` is informational.
"""

from __future__ import annotations

import hashlib
import json
import platform as _platform
import sys
import sysconfig
from typing import Any

EXACT_FIELDS = (
    "torch",
    "cuda",
    "hip",
    "triton",
    "python",
    "platform",
    "device_type",
    "compute_capability",
)
INFO_FIELDS = ("gpu_name", "cpu_isa", "engine_key")

# CPU flags (from /proc/cpuinfo) each inductor vector ISA needs.
_ISA_FLAGS = {
    "avx512": ("avx512f", "avx512dq", "avx512vl", "avx512bw"),
    "avx2": ("avx2", "fma"),
    "amx": ("amx_tile", "avx512f"),
}


def _triton_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    for dist in ("triton", "pytorch-triton"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def host_fingerprint(device_type: str, device_index: int | None = None) -> dict[str, Any]:
    """The fingerprint of this host for ``device_type`` (``"cpu"`` or ``"cuda"``).

    Args:
        device_type: ``"cpu"`` or ``"cuda"``.
        device_index: the CUDA device to describe (default: current device).
    Returns:
        dict with every field of :data:`EXACT_FIELDS` and ``gpu_name``; values are
        strings or None. Imports torch; does not import triton (reads its version
        from package metadata).
    """
    import torch

    fp: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "triton": None,
        "python": "%d.%d" % sys.version_info[:2],
        "platform": sysconfig.get_platform(),
        "device_type": device_type,
        "compute_capability": None,
        "gpu_name": None,
    }
    if device_type == "cuda":
        fp["triton"] = _triton_version()
        if torch.cuda.is_available():
            idx = torch.cuda.current_device() if device_index is None else device_index
            major, minor = torch.cuda.get_device_capability(idx)
            fp["compute_capability"] = f"{major}.{minor}"
            fp["gpu_name"] = torch.cuda.get_device_name(idx)
    return fp


def variant_id(fp: dict[str, Any]) -> str:
    """12 hex characters naming a variant: a hash of its exact-match fields."""
    key = {k: fp.get(k) for k in EXACT_FIELDS}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def cpu_flags() -> set[str]:
    """CPU feature flags of this host from /proc/cpuinfo (empty set where unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def mismatches(recorded: dict[str, Any], host: dict[str, Any]) -> list[str]:
    """Every reason ``recorded`` (a variant's fingerprint) cannot run on ``host``.

    Returns:
        a list of ``"field: built for X, this host has Y"`` strings; empty = match.
    """
    out = []
    for key in EXACT_FIELDS:
        if recorded.get(key) != host.get(key):
            out.append(f"{key}: built for {recorded.get(key)!r}, this host has {host.get(key)!r}")
    isa = recorded.get("cpu_isa")
    if isa and isa in _ISA_FLAGS and recorded.get("device_type") == "cpu":
        flags = cpu_flags()
        if flags:  # unreadable cpuinfo (non-Linux): trust the platform field
            missing = [f for f in _ISA_FLAGS[isa] if f not in flags]
            if missing:
                out.append(
                    f"cpu_isa: built for {isa!r}, this CPU lacks {', '.join(missing)}"
                )
    return out


def describe(fp: dict[str, Any]) -> str:
    """A one-line human summary, e.g. ``cuda sm_9.0 (NVIDIA H200), torch 2.11.0+cu130``."""
    if fp.get("device_type") == "cuda":
        dev = f"cuda sm_{fp.get('compute_capability')} ({fp.get('gpu_name')})"
    else:
        dev = f"cpu {fp.get('cpu_isa') or ''}".strip()
    return f"{dev}, torch {fp.get('torch')}, python {fp.get('python')}, {fp.get('platform')}"


def machine() -> str:
    """``platform.machine()``; kept here so callers need not import platform."""
    return _platform.machine()
