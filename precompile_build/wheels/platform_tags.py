"""The platform tag of a wheel with frozen kernels: ``manylinux_X_Y`` where they allow it.

PyPI refuses ``linux_*`` wheels, and ``auditwheel`` cannot see our kernels (they sit
inside the ``.cache`` envelopes), so the backend decides the tag itself, the way
auditwheel does, with auditwheel's own policy data (:class:`auditwheel.policy.WheelPolicies`):

1. collect every ELF file of this host's architecture: the blobs of every ``.cache``
   envelope (frozen CPU kernels) and every ELF entry of the wheel (a project's own
   extension modules); ELF files for other machines (CUDA cubins) need no libc;
2. the policy is the most compatible one whose glibc/GLIBCXX/CXXABI/GCC symbol
   versions cover every versioned symbol those files need
   (``WheelPolicies.versioned_symbols_policy``), but no older than :data:`FLOOR`;
3. each ``DT_NEEDED`` library must be on that policy's whitelist, or one of torch's
   own (:data:`TORCH_LIBS`: the kernels run inside a process that has imported torch,
   which the wheel requires, so these are loaded already); any other library means no
   policy fits: ``linux_<arch>``, with the reason printed.

A cache that is not an envelope (the ``torch`` engine's own format) cannot be looked
into: its kernels were compiled on this host, so the tag is this host's glibc
(``manylinux_<host glibc>``), the newest any of them can need, with the reason printed.
Non-Linux platforms keep ``sysconfig.get_platform()``.
"""

from __future__ import annotations

import io
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from packaging.tags import sys_tags

__all__ = [
    "FLOOR",
    "TORCH_LIBS",
    "TagDecision",
    "decide_platform",
    "elf_needs",
    "kernel_files",
    "wheel_tags",
]

# Libraries torch's own wheels ship or load (libtorch, c10, OpenMP, the CUDA runtime
# and its libraries, the driver): present in any process that imported torch.
TORCH_LIBS = re.compile(
    r"^lib(torch|c10|shm|gomp|iomp5|omp|cuda|cudart|nvrtc|cublas|cublasLt|"
    r"cudnn|cufft|curand|cusolver|cusparse|nccl|nvToolsExt|nvJitLink|"
    r"triton|amdhip64|hiprtc|rocblas|MIOpen)[\w.+-]*\.so(\.[\d.]+)?$"
)

# The oldest tag given: kernels that need nothing older (CUDA-only wheels: cubins need
# no libc) still get manylinux_2_17 (manylinux2014), the oldest policy torch and
# current pip, auditwheel and manylinux images still build for.
FLOOR = "manylinux_2_17"

_ELF_MAGIC = b"\x7fELF"
_MACHINES = {
    "x86_64": "EM_X86_64",
    "i686": "EM_386",
    "aarch64": "EM_AARCH64",
    "ppc64le": "EM_PPC64",
    "s390x": "EM_S390",
    "armv7l": "EM_ARM",
    "riscv64": "EM_RISCV",
}


@dataclass
class TagDecision:
    """The platform part of the tags, and why (``reason`` None: a policy fitted)."""

    platforms: list[str]
    """e.g. ``["manylinux_2_17_x86_64", "manylinux2014_x86_64"]`` or ``["linux_x86_64"]``."""
    reason: Optional[str] = None
    needs: dict[str, Any] = field(default_factory=dict)
    """What the inspected files need: ``{library: sorted symbol versions}``."""


def kernel_files(files: Mapping[str, bytes]) -> tuple[dict[str, bytes], list[str]]:
    """ELF files among ``files`` and inside their ``.cache`` envelopes.

    Args:
        files: ``{name: bytes}``, e.g. a wheel's entries (archive paths) or a
            ``_precompiled/`` set (file names).
    Returns:
        ``(elves, opaque)``: ``elves`` maps ``name`` (an ELF file itself) or
        ``"NAME.cache!BLOB"`` (an ELF blob of an envelope) to its bytes; ``opaque``
        lists, in ``files`` order, the ``.cache`` files whose kernels cannot be
        inspected (not an envelope: the torch engine's own format; or an envelope of
        another engine than frozen/eager, whose ELF blobs are still collected).
    Raises:
        precompile_runtime.errors.IntegrityError: a ``.cache`` that starts like an
            envelope but is corrupt (truncated, a blob's sha256 differs).
    """
    from precompile_runtime.envelope import MAGIC, loads

    elves: dict[str, bytes] = {}
    opaque: list[str] = []
    for name, data in files.items():
        if data[:4] == _ELF_MAGIC:
            elves[name] = data
        elif name.endswith(".cache"):
            if data[: len(MAGIC)] != MAGIC:
                opaque.append(name)
                continue
            env = loads(data, what=name)
            if env.engine not in ("frozen", "eager"):
                opaque.append(name)
            for blob, bdata in env.blobs.items():
                if bdata[:4] == _ELF_MAGIC:
                    elves[f"{name}!{blob}"] = bdata
    return elves, opaque


def elf_needs(data: bytes, arch: str) -> Optional[tuple[list[str], dict[str, set[str]]]]:
    """``(DT_NEEDED libraries, {library: {symbol versions}})`` of one ELF file, or
    None for an ELF of another machine (a CUDA cubin). Raises ValueError for a file
    that cannot be parsed."""
    from auditwheel.elfutils import elf_find_versioned_symbols
    from elftools.common.exceptions import ELFError
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        elf = ELFFile(io.BytesIO(data))
        if elf["e_machine"] != _MACHINES.get(arch):
            return None
        needed: list[str] = []
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                needed += [t.needed for t in section.iter_tags() if t.entry.d_tag == "DT_NEEDED"]  # type: ignore[attr-defined]
        versions: dict[str, set[str]] = {}
        for lib, ver in elf_find_versioned_symbols(elf):
            versions.setdefault(lib, set()).add(ver)
        return needed, versions
    except (ELFError, ValueError, KeyError, AssertionError) as e:
        raise ValueError(f"not a readable ELF file ({e})") from None


def _host_glibc() -> Optional[tuple[int, int]]:
    import os

    try:
        text = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):
        return None
    m = re.match(r"glibc (\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def decide_platform(elves: Mapping[str, bytes], opaque: Iterable[str] = ()) -> TagDecision:
    """The platform tags for a wheel holding ``elves`` (see :func:`kernel_files`).

    Args:
        elves: ``{name: ELF bytes}``; one that cannot be parsed counts as opaque, one
            for another machine (a CUDA cubin) needs nothing.
        opaque: names of files whose kernels cannot be inspected.
    Returns:
        a :class:`TagDecision`: ``platforms`` as wheel tag parts, most specific
        first (``["manylinux_2_17_x86_64", "manylinux2014_x86_64"]``, or
        ``["linux_x86_64"]``), never older than :data:`FLOOR`; its ``reason`` says
        why ``linux_*`` was chosen (no policy allows the symbol versions, a library
        outside torch's and the policy's, auditwheel missing or without policies
        here, a musl host) or why this host's glibc was (opaque files). Off Linux:
        ``sysconfig.get_platform()``, no reason.
    Raises:
        nothing of its own: every problem is a ``reason``.
    """
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    if not plat.startswith("linux_"):
        return TagDecision([plat])
    arch = plat[len("linux_") :]
    try:
        from auditwheel.architecture import Architecture
        from auditwheel.libc import Libc
        from auditwheel.policy import WheelPolicies
    except ImportError as e:
        return TagDecision(
            [plat],
            f"auditwheel is not importable ({e}); install it "
            "(`pip install auditwheel`) for a manylinux tag",
        )
    if any("musl" in t.platform for t in list(sys_tags())[:1]):
        return TagDecision([plat], "a musl libc host: musllinux tags are not decided here")
    try:
        policies = WheelPolicies(libc=Libc.GLIBC, arch=Architecture(arch))
    except (ValueError, KeyError, TypeError) as e:  # TypeError: an auditwheel before 6.2
        return TagDecision([plat], f"auditwheel has no policies for {arch} here ({e})")
    needs, libs, unread = _all_needs(elves, arch)
    opaque = [*opaque, *unread]
    shown = {k: sorted(v) for k, v in sorted(needs.items())}
    policy = policies.versioned_symbols_policy(needs)
    if policy.name == policies.linux.name:
        return TagDecision(
            [plat],
            f"no manylinux policy allows the symbol versions the kernels need ({shown})",
            shown,
        )
    floor = [p for p in policies if p.name == f"{FLOOR}_{arch}"]
    if floor and floor[0].priority < policy.priority:
        policy = floor[0]
    outside = sorted(
        lib
        for lib in libs
        if lib not in policy.whitelist and not TORCH_LIBS.match(lib) and "ld-linux" not in lib
    )
    if outside:
        return TagDecision(
            [plat],
            "the kernels link libraries that neither torch nor the "
            f"manylinux policy provides: {', '.join(outside)} (needed by "
            f"{', '.join(sorted(libs[outside[0]]))})",
            shown,
        )
    if opaque:
        return _for_host_glibc(sorted(opaque), plat, arch, policies, policy, shown)
    return TagDecision([policy.name, *policy.aliases], None, shown)


def _all_needs(
    elves: Mapping[str, bytes], arch: str
) -> tuple[dict[str, set[str]], dict[str, set[str]], list[str]]:
    """``(symbol versions needed per library, the files that link each library, the
    files that cannot be read as ELF)`` of ``elves``."""
    needs: dict[str, set[str]] = {}
    libs: dict[str, set[str]] = {}
    unread: list[str] = []
    for name, data in elves.items():
        try:
            got = elf_needs(data, arch)
        except ValueError:
            unread.append(name)
            continue
        if got is None:
            continue
        for lib in got[0]:
            libs.setdefault(lib, set()).add(name)
        for lib, vers in got[1].items():
            needs.setdefault(lib, set()).update(vers)
    return needs, libs, unread


def _for_host_glibc(
    opaque: list[str],
    plat: str,
    arch: str,
    policies: Any,
    policy: Any,
    shown: dict[str, list[str]],
) -> TagDecision:
    """The decision where some kernels cannot be inspected: the policy of this host's
    glibc (the newest any kernel compiled here can need), when newer than ``policy``."""
    host = _host_glibc()
    if host is None:
        return TagDecision(
            [plat],
            f"{', '.join(opaque)}: not an envelope, so its "
            "kernels cannot be inspected, and this host's glibc is unknown",
            shown,
        )
    mine = [p for p in policies if p.name == f"manylinux_{host[0]}_{host[1]}_{arch}"]
    if mine and mine[0].priority < policy.priority:
        policy = mine[0]
    reason = (
        f"{', '.join(opaque)}: cannot be inspected (not an envelope, or "
        f"not a readable ELF file); tagged for this host's glibc "
        f"{host[0]}.{host[1]}, the newest any kernel compiled here can need"
    )
    return TagDecision([policy.name, *policy.aliases], reason, shown)


def wheel_tags(
    files: Mapping[str, bytes],
    *,
    interpreter_abi: Optional[str] = None,
    say: Optional[Callable[[str], None]] = None,
) -> list[str]:
    """``cpXY-cpXY-<platform>`` tags for a wheel whose entries (and ``_precompiled/``
    files) are ``files``: one per platform of :func:`decide_platform`.

    ``interpreter_abi``: e.g. ``cp311-cp311`` (default: this interpreter's). ``say``
    (default: print to stderr) gets one line naming the tag, and the reason when a
    ``linux_*`` tag (or the host's glibc) was chosen."""
    if interpreter_abi is None:
        first = next(iter(sys_tags()))
        interpreter_abi = f"{first.interpreter}-{first.abi}"
    elves, opaque = kernel_files(files)
    decision = decide_platform(elves, opaque)
    line = f"precompile: platform tag {'.'.join(decision.platforms)}"
    if decision.reason:
        line += f" ({decision.reason})"
    (say or (lambda s: print(s, file=sys.stderr)))(line)
    return [f"{interpreter_abi}-{p}" for p in decision.platforms]
