"""Which compiled GPU binary a host runs: the rules for multi-architecture pairs.

A pair built with `cuda-archs` carries, per Triton kernel, binaries named the way
ptxas names its targets: ``sm_80`` (a cubin), ``sm_90a`` (an architecture-specific
cubin: Triton compiles 9.0 and above this way), ``compute_80`` (PTX). The
fingerprint lists them all in ``cuda_binaries``. A host of compute capability
``M.m`` runs, in this order of preference:

1. a cubin for exactly ``M.m``;
2. a cubin for a lower minor of the same major that is not architecture-specific
   (binary compatible: an sm_80 cubin runs on sm_86 and sm_89), the highest one;
3. PTX for ``M.m`` or any lower capability that is not architecture-specific,
   the highest: the driver JIT-compiles it at load, which is a compile at load
   (refused under ``PRECOMPILE_NO_COMPILE=1`` and strict mode, a
   :class:`PtxJitWarning` otherwise);
4. nothing: the variant does not match this host.

Among several matching variants (``merge`` of wheels from several build hosts)
the one whose ``compute_capability``, the GPU it was tuned and validated on, is
this host's wins over one cross-compiled for it, then the order above.

``PRECOMPILE_TEST_FORCE_PTX=1`` (tests only) prefers PTX over cubins wherever PTX
can run, so that a GPU test can check the PTX path on a GPU that has its cubin.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Optional

FORCE_PTX_ENV = "PRECOMPILE_TEST_FORCE_PTX"
_NAME = re.compile(r"^(sm|compute)_([0-9]{2,3})(a?)$")

EXACT, LOWER_MINOR, PTX = 0, 1, 2
"""How a binary serves a host (lower is better): :func:`serves`."""
KIND_WORDS = {EXACT: "a cubin for this architecture", LOWER_MINOR: "a cubin of a lower minor",
              PTX: "PTX the driver JIT-compiles at load"}


class PtxJitWarning(UserWarning):
    """A variant serves this GPU through PTX only: the driver compiles it at load."""


def parse(name: str) -> Optional[tuple[int, int, bool, bool]]:
    """``"sm_86"`` -> ``(8, 6, False, False)``: (major, minor, architecture-specific,
    PTX); ``"compute_80"`` -> ``(8, 0, False, True)``; ``"sm_100a"`` -> ``(10, 0,
    True, False)``. None for a name of another form."""
    m = _NAME.match(name or "")
    if not m:
        return None
    cc = int(m.group(2))
    return cc // 10, cc % 10, bool(m.group(3)), m.group(1) == "compute"


def capability(text: Optional[str]) -> Optional[tuple[int, int]]:
    """``"8.6"`` -> ``(8, 6)``; None for None or a malformed value."""
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return None


def serves(name: str, host: tuple[int, int]) -> Optional[int]:
    """How the binary ``name`` serves a host of capability ``host``: EXACT,
    LOWER_MINOR or PTX (see the module docstring), or None when it cannot run there."""
    p = parse(name)
    if p is None:
        return None
    major, minor, specific, ptx = p
    if ptx:
        return PTX if not specific and (major, minor) <= host else None
    if (major, minor) == host:
        return EXACT
    if not specific and major == host[0] and minor < host[1]:
        return LOWER_MINOR
    return None


def _force_ptx() -> bool:
    return os.environ.get(FORCE_PTX_ENV, "").strip() == "1"


def best(names: Iterable[str], host: tuple[int, int]) -> Optional[str]:
    """The name among ``names`` a host of capability ``host`` runs (the order of the
    module docstring; with PRECOMPILE_TEST_FORCE_PTX=1, PTX first), or None."""
    ranked = []
    for name in names:
        kind = serves(name, host)
        if kind is None:
            continue
        if _force_ptx():
            kind = -1 if kind == PTX else kind
        major, minor = parse(name)[:2]  # type: ignore[index]
        ranked.append((kind, -major, -minor, name))
    return min(ranked)[3] if ranked else None


def pick(choices: list[dict], host: tuple[int, int]) -> Optional[dict]:
    """The kernel binary to load on a device of capability ``host``.

    Args:
        choices: a kernel entry's ``archs`` (each with ``sm``: its binary's name).
        host: the device's ``(major, minor)``.
    Returns:
        the chosen dict, or None when none runs on that device.
    """
    name = best([c["sm"] for c in choices], host)
    return next((c for c in choices if c["sm"] == name), None)


def variant_kind(fp: dict, host_cc: Optional[str]) -> Optional[int]:
    """How a multi-architecture variant serves the host (EXACT, LOWER_MINOR, PTX) or
    None when it cannot; for a variant without ``cuda_binaries``: EXACT when its
    ``compute_capability`` equals the host's, else None."""
    host = capability(host_cc)
    names = (fp.get("cuda_binaries") or "").split()
    if not names or host is None:
        return EXACT if fp.get("compute_capability") == host_cc else None
    chosen = best(names, host)
    return serves(chosen, host) if chosen is not None else None


def rank(fp: dict, host_cc: Optional[str]) -> tuple:
    """Sort key among matching variants (lowest wins): tuned on this host's
    architecture, then :func:`variant_kind`."""
    kind = variant_kind(fp, host_cc)
    return (fp.get("compute_capability") != host_cc, 9 if kind is None else kind)


def mismatch(fp: dict, host_cc: Optional[str]) -> Optional[str]:
    """Why a variant's GPU binaries cannot run on a host of capability ``host_cc``
    (a ``"compute_capability: ..."`` line of the loader's mismatch report), or None."""
    if variant_kind(fp, host_cc) is not None:
        return None
    names = (fp.get("cuda_binaries") or "").split()
    if not names:
        return f"compute_capability: built for {fp.get('compute_capability')!r}, this host has {host_cc!r}"
    return (f"compute_capability: built for {' '.join(names)} (tuned on "
            f"{fp.get('compute_capability')}), none of which runs on this host's {host_cc!r}")


def best_variant(matches: list[dict], host_cc: Optional[str]) -> dict:
    """The variant to load among those whose fingerprint matches this host: a CUDA
    one over a CPU one (a GPU host serves on its GPU), then :func:`rank`, then the
    manifest's order."""
    def key(item):
        i, v = item
        cuda = (v.get("device") or v["fingerprint"].get("device_type") or "cpu") == "cuda"
        return (not cuda, rank(v["fingerprint"], host_cc) if cuda else (), i)

    return min(enumerate(matches), key=key)[1]


def check_jit_at_load(ctx: str, variant: dict, host_cc: Optional[str], strict: bool) -> None:
    """Refuse or warn when ``variant`` serves this GPU through PTX only, a driver
    JIT compile at load.

    Raises:
        HostMismatchError: strict mode, or the serving guard is on
            (``PRECOMPILE_NO_COMPILE=1``): the message names the binaries and how to
            get a cubin for this GPU.
    Warns:
        PtxJitWarning: otherwise.
    """
    import warnings

    from ._guard import guard_active
    from .errors import HostMismatchError

    fp = variant.get("fingerprint") or {}
    if (variant.get("device") or fp.get("device_type")) != "cuda" or variant_kind(fp, host_cc) != PTX:
        return
    text = (f"{ctx}: this GPU (compute capability {host_cc}) has no cubin in the variant "
            f"built for {fp.get('cuda_binaries')}; the driver would JIT-compile its PTX at load, "
            f"a compile. Add \"{host_cc}\" to `cuda-archs` and rebuild to ship a cubin for it")
    if strict or guard_active():
        why = "strict mode" if strict else "PRECOMPILE_NO_COMPILE=1"
        raise HostMismatchError(f"{text}. Refused under {why}.")
    warnings.warn(text + ".", PtxJitWarning, stacklevel=4)
