"""CUDA binaries' targets: Triton's name for a compute capability (``sm_80``,
``sm_90a``) and the target a cubin was compiled for, read from its ELF header
(cross_arch.py files each cubin under the target it was compiled for). A cubin is
read with struct alone: no GPU and no pyelftools needed; :func:`sm_name` asks Triton
where it is installed.
"""

from __future__ import annotations

import struct


def sm_name(cc: int) -> str:
    """Triton's compile target for a capability: ``sm_80``, ``sm_90a``, ``sm_120a``
    (triton.backends.nvidia.compiler.sm_arch_from_capability)."""
    try:
        from triton.backends.nvidia.compiler import sm_arch_from_capability
    except ImportError:  # pragma: no cover - Triton's rule, for other versions
        return f"sm_{cc}{'a' if cc >= 90 else ''}"
    return sm_arch_from_capability(cc)


def cubin_target(data: bytes) -> str:
    """The ptxas target a cubin was compiled for, read from the cubin itself:
    ``"sm_80"``, ``"sm_90"``, ``"sm_90a"``, ``"sm_100a"`` (the architecture-specific
    'a' included; a family target such as sm_100f reads as sm_100).

    Three layouts, all seen from the ptxas versions Triton and torch ship (real
    cubins of each: tests/data/cubins): CUDA's older ELF ABI (``EI_OSABI`` 0x33,
    ptxas 12.x below sm_100) keeps the SM in the low byte of ``e_flags`` and the 'a'
    in bit 0x800; the newer one (0x41: ptxas 12.8+ for sm_100 and later, ptxas 13
    for every SM) keeps the SM in the second byte, and the 'a' in bit 0x8 (ptxas
    12.x) or, from ptxas 13 on, as attribute 9 = 1 of the ``.nv.compat`` section
    (cuobjdump 12.8 does not read that one: it names such a cubin sm_90).

    Raises:
        ValueError: ``data`` is not a 64-bit CUDA ELF file.
    """
    if len(data) < 0x40 or data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    flags = struct.unpack_from("<I", data, 0x30)[0]
    if data[7] == 0x33:
        return f"sm_{flags & 0xFF}{'a' if flags & 0x800 else ''}"
    if data[7] != 0x41:
        raise ValueError(f"not a CUDA ELF (EI_OSABI {data[7]:#x})")
    specific = bool(flags & 0x8) or _compat_attribute(data, 9) == 1
    return f"sm_{(flags >> 8) & 0xFF}{'a' if specific else ''}"


def _compat_attribute(data: bytes, attr: int):
    """The value of attribute ``attr`` in a cubin's ``.nv.compat`` section, or None:
    records of (format, attribute, 2-byte value), or of (4, attribute, 2-byte size,
    that many bytes). The ELF64 section headers are read here with struct: a GPU host
    that runs captures from a checkout need not have pyelftools."""
    try:
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

        def header(i):  # -> (name offset, file offset, size)
            (name,) = struct.unpack_from("<I", data, shoff + i * shentsize)
            offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
            if offset + size > len(data):
                raise struct.error("section past the end of the file")
            return name, offset, size

        _, names, _ = header(shstrndx)
        body = b""
        for i in range(shnum):
            name, offset, size = header(i)
            if data[names + name : names + name + 11] == b".nv.compat\x00":
                body = data[offset : offset + size]
    except struct.error as err:
        raise ValueError(f"not a readable ELF file: {err}") from None
    i = 0
    while i + 4 <= len(body):
        fmt, key, value = body[i], body[i + 1], struct.unpack_from("<H", body, i + 2)[0]
        if key == attr and fmt != 4:
            return value
        i += 4 + (value if fmt == 4 else 0)
    return None


def cubin_arch(data: bytes) -> int:
    """The SM number a cubin is for (:func:`cubin_target` without the 'a'): 80 for
    sm_80, 90 for sm_90a. Raises ValueError for bytes that are not a CUDA ELF."""
    return int(cubin_target(data)[3:].rstrip("a"))
