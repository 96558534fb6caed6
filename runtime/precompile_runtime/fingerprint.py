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
- ``compute_capability``: ``9.0`` for sm_90, the GPU the kernels were tuned and
  validated on; a cubin for another SM is never run. A variant built with
  `cuda-archs` also has ``cuda_binaries`` (``"compute_80 sm_80 sm_90a sm_120a"``):
  then this field names where it was tuned, and the host matches when one of those
  binaries runs on it (:mod:`precompile_runtime.arch_select`).

``cpu_isa`` is a requirement, not an equality: the instruction-set level the CPU
kernels were compiled for, as space-separated words (the frozen engine records
Inductor's vector ISA and the ``-march`` level it pinned, e.g. ``avx512 avx512_vnni
x86-64-v4``). Each word is a level of :data:`ISA_REQUIRES` or a CPU flag name as
``/proc/cpuinfo`` spells it (``amx_tile``); this host must have every flag they
need (:func:`isa_mismatch`), read from ``/proc/cpuinfo`` without importing the
compiler. ``gpu_name`` and the torch engine's ``engine_key`` are informational: no
load compares them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
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

# The CPU flags (as /proc/cpuinfo names them) that each word of a ``cpu_isa``
# record needs: Inductor's vector ISAs (``str(pick_vec_isa())``, with the flags its
# ``build_arch_flags()`` passes to the compiler), ATen's capabilities (the torch
# engine) and the x86-64 micro-architecture levels the frozen engine pins with
# ``-march``. A word not listed here is a cpuinfo flag name and needs itself.
_X86_64_V2 = ("cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3")
_X86_64_V3 = (*_X86_64_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave")
_X86_64_V4 = (*_X86_64_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
ISA_REQUIRES = {
    "avx2": ("avx2", "fma", "f16c"),
    "avx512": ("avx512f", "avx512dq", "avx512vl", "avx512bw", "fma"),
    "amx": ("amx_tile", "avx512f"),
    "amx_tile": ("amx_tile", "amx_bf16", "amx_int8"),
    "x86-64": (),
    "x86-64-v2": _X86_64_V2,  # (each level needs the one below)
    "x86-64-v3": _X86_64_V3,
    "x86-64-v4": _X86_64_V4,
    # the platform field already ties these to their architecture
    "none": (),
    "default": (),
    "invalid_vec_isa": (),
    "asimd": (),
    "vsx": (),
    "zvector": (),
}
CPUINFO_ENV = "PRECOMPILE_CPUINFO"
"""Read CPU flags from this file instead of ``/proc/cpuinfo`` (same format); for
tests that simulate another CPU."""


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
        "python": "{}.{}".format(*sys.version_info[:2]),
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
    """CPU feature flags of this host: the ``flags`` (x86) or ``Features`` (arm) line
    of ``/proc/cpuinfo`` (or of the file ``$PRECOMPILE_CPUINFO``); an empty set where
    unreadable (not Linux)."""
    return set(_read_flags(os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo"))


@functools.lru_cache(maxsize=4)
def _read_flags(path: str) -> frozenset[str]:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")) and ":" in line:
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def isa_mismatch(cpu_isa: str | None, flags: set[str] | None = None) -> str | None:
    """Why this host cannot run CPU kernels compiled for ``cpu_isa``, or None.

    Args:
        cpu_isa: a fingerprint's ``cpu_isa``: space-separated words, each a level of
            :data:`ISA_REQUIRES` or a ``/proc/cpuinfo`` flag name; None/empty: no
            requirement.
        flags: this host's CPU flags (default: :func:`cpu_flags`).
    Returns:
        ``"cpu_isa: built for 'avx512 amx_tile', this CPU lacks amx_tile, ..."``;
        None when every needed flag is there. Unreadable flags with a requirement
        count as a mismatch: a kernel for instructions the host may lack never runs.
    """
    if cpu_isa is not None and not isinstance(cpu_isa, str):
        return f"cpu_isa: built for {cpu_isa!r}, not a list of CPU features this runtime can check"
    words = (cpu_isa or "").split()
    needed = list(dict.fromkeys(f for w in words for f in ISA_REQUIRES.get(w.lower(), (w,))))
    if not needed:
        return None
    flags = cpu_flags() if flags is None else flags
    if not flags:
        return (
            f"cpu_isa: built for {cpu_isa!r}, and this host's CPU flags cannot be read "
            "(/proc/cpuinfo) to check it"
        )
    missing = [f for f in needed if f not in flags]
    if missing:
        return f"cpu_isa: built for {cpu_isa!r}, this CPU lacks {', '.join(missing)}"
    return None


def mismatches(recorded: dict[str, Any], host: dict[str, Any]) -> list[str]:
    """Every reason ``recorded`` (a variant's fingerprint) cannot run on ``host``.

    Returns:
        a list of ``"field: built for X, this host has Y"`` strings; empty = match.
    """
    from .arch_select import mismatch as arch_mismatch

    out = []
    for key in EXACT_FIELDS:
        if key == "compute_capability" and recorded.get("cuda_binaries"):
            problem = arch_mismatch(recorded, host.get(key))  # `cuda-archs`: arch_select.py
            if problem:
                out.append(problem)
        elif recorded.get(key) != host.get(key):
            out.append(f"{key}: built for {recorded.get(key)!r}, this host has {host.get(key)!r}")
    if recorded.get("device_type") == "cpu":
        isa = isa_mismatch(recorded.get("cpu_isa"))
        if isa:
            out.append(isa)
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
