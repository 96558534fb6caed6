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
from collections.abc import Iterable
from typing import Any, Optional

from . import _arch_rules as _rules
from .errors import PtxJitWarning  # noqa: F401  (raised here; exported by the package)

# The rules themselves live in _arch_rules.py, which the source half of frozen Triton
# kernels carries verbatim (it picks each kernel's binary on its own): one
# implementation for the kernel's binary and for the variant.
FORCE_PTX_ENV = _rules._FORCE_PTX_ENV
EXACT, LOWER_MINOR, PTX = _rules._BINARY_EXACT, _rules._BINARY_LOWER_MINOR, _rules._BINARY_PTX
"""How a binary serves a host (lower is better): :func:`serves`."""

parse = _rules._binary_parse
serves = _rules._binary_serves


def capability(text: Optional[str]) -> Optional[tuple[int, int]]:
    """``"8.6"`` -> ``(8, 6)``; None for None or a malformed value."""
    try:
        major, minor = str(text).split(".")
        return int(major), int(minor)
    except (ValueError, AttributeError):
        return None


def best(names: Iterable[str], host: tuple[int, int]) -> Optional[str]:
    """The name among ``names`` a host of capability ``host`` runs (the order of the
    module docstring; with PRECOMPILE_TEST_FORCE_PTX=1, PTX first), or None."""
    force_ptx = _rules._binary_force_ptx(os.environ.get(_rules._FORCE_PTX_ENV))
    return _rules._binary_best(list(names), host, force_ptx)


def pick(choices: list[dict[str, Any]], host: tuple[int, int]) -> Optional[dict[str, Any]]:
    """The kernel binary to load on a device of capability ``host``.

    Args:
        choices: a kernel entry's ``archs`` (each with ``sm``: its binary's name).
        host: the device's ``(major, minor)``.
    Returns:
        the chosen dict, or None when none runs on that device.
    """
    force_ptx = _rules._binary_force_ptx(os.environ.get(_rules._FORCE_PTX_ENV))
    return _rules._binary_pick(choices, host, force_ptx)


def variant_kind(fp: dict[str, Any], host_cc: Optional[str]) -> Optional[int]:
    """How a multi-architecture variant serves the host (EXACT, LOWER_MINOR, PTX) or
    None when it cannot; for a variant without ``cuda_binaries``: EXACT when its
    ``compute_capability`` equals the host's, else None."""
    host = capability(host_cc)
    names = (fp.get("cuda_binaries") or "").split()
    if not names or host is None:
        return EXACT if fp.get("compute_capability") == host_cc else None
    chosen = best(names, host)
    return serves(chosen, host) if chosen is not None else None


def rank(fp: dict[str, Any], host_cc: Optional[str]) -> tuple[bool, int]:
    """Sort key among matching variants (lowest wins): tuned on this host's
    architecture, then :func:`variant_kind`."""
    kind = variant_kind(fp, host_cc)
    return (fp.get("compute_capability") != host_cc, 9 if kind is None else kind)


def mismatch(fp: dict[str, Any], host_cc: Optional[str]) -> Optional[str]:
    """Why a variant's GPU binaries cannot run on a host of capability ``host_cc``
    (a ``"compute_capability: ..."`` line of the loader's mismatch report), or None."""
    if variant_kind(fp, host_cc) is not None:
        return None
    names = (fp.get("cuda_binaries") or "").split()
    if not names:
        return f"compute_capability: built for {fp.get('compute_capability')!r}, this host has {host_cc!r}"
    return (
        f"compute_capability: built for {' '.join(names)} (tuned on "
        f"{fp.get('compute_capability')}), none of which runs on this host's {host_cc!r}"
    )


def best_variant(matches: list[dict[str, Any]], host_cc: Optional[str]) -> dict[str, Any]:
    """The variant to load among those whose fingerprint matches this host: a CUDA
    one over a CPU one (a GPU host serves on its GPU), then :func:`rank`, then the
    manifest's order."""

    def key(item: tuple[int, dict[str, Any]]) -> tuple[bool, tuple[Any, ...], int]:
        i, v = item
        cuda = (v.get("device") or v["fingerprint"].get("device_type") or "cpu") == "cuda"
        return (not cuda, rank(v["fingerprint"], host_cc) if cuda else (), i)

    return min(enumerate(matches), key=key)[1]


def check_jit_at_load(
    ctx: str, variant: dict[str, Any], host_cc: Optional[str], strict: bool
) -> None:
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
    if (variant.get("device") or fp.get("device_type")) != "cuda" or variant_kind(
        fp, host_cc
    ) != PTX:
        return
    text = (
        f"{ctx}: this GPU (compute capability {host_cc}) has no cubin in the variant "
        f"built for {fp.get('cuda_binaries')}; the driver would JIT-compile its PTX at load, "
        f'a compile. Add "{host_cc}" to `cuda-archs` and rebuild to ship a cubin for it'
    )
    if strict or guard_active():
        why = "strict mode" if strict else "PRECOMPILE_NO_COMPILE=1"
        raise HostMismatchError(f"{text}. Refused under {why}.")
    warnings.warn(text + ".", PtxJitWarning, stacklevel=4)
