"""Smaller CPU kernels: strip what a kernel does not need at run time.

A frozen CPU kernel is a shared object that is only ever loaded (``dlopen``, or as
a Python extension module) and called through its dynamic symbols. Its static
symbol table (``.symtab``/``.strtab``) and any debug sections (DWARF, e.g. when a
torch build compiles kernels with ``-g``) are for debuggers and linkers only:
``strip --strip-unneeded`` removes them and keeps ``.dynsym``, relocations and
everything the loader reads. Where binutils' ``strip`` is missing or fails, the
kernel is kept as it is (stripping is an optimisation, never a failure).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

__all__ = ["strip_kernel"]


def strip_kernel(data: bytes) -> bytes:
    """``data`` (an ELF shared object) without symbol tables and debug info.

    Returns the stripped bytes, or ``data`` unchanged when it is not an ELF file,
    ``strip`` is not installed, or it fails. Deterministic: the same input gives
    the same output.
    """
    if data[:4] != b"\x7fELF":
        return data
    tool = shutil.which("strip")
    if tool is None:
        return data
    with tempfile.TemporaryDirectory(prefix="precompile-strip-") as tmp:
        src, dst = os.path.join(tmp, "in.so"), os.path.join(tmp, "out.so")
        with open(src, "wb") as f:
            f.write(data)
        try:
            proc = subprocess.run(
                [tool, "--strip-unneeded", "-o", dst, src], capture_output=True, timeout=120
            )
        except (OSError, subprocess.SubprocessError):
            return data
        if proc.returncode != 0 or not os.path.isfile(dst):
            return data
        with open(dst, "rb") as f:
            out = f.read()
    return out if out[:4] == b"\x7fELF" and len(out) <= len(data) else data
