"""The code object of a pair's source half: the bytecode pip wrote for it at install
when that is valid for these very bytes, else compiled now.

A source half is a ``.py`` file in the package, so ``pip install`` byte-compiles it
into ``__pycache__`` like the package's own modules. Python's ``compile()`` of a large
source half is the largest part of a load (about 2 ms per transformer layer:
bench/results/scale_cuda.md), paid again in every fresh process; the bytecode is
taken under the rule Python's import uses for it (PEP 552), bound to the bytes the
loader verified (their sha256 against the manifest): a hash-based pyc whose hash is
these bytes', or a timestamp pyc whose recorded mtime and size are the file's when the
file still holds exactly these bytes (read again: a file replaced since the loader read
it, by a concurrent upgrade, is compiled from the verified bytes instead) and was not
written after its pyc. As for the package's own modules, a pyc forged together with
the file's mtime by someone who may write the package is not defended against.

Under ``sys.pycache_prefix`` (``PYTHONPYCACHEPREFIX``) the pyc lies outside the package,
maybe in a folder others share: it is used only when only this user or root could have
written it (:mod:`._safe_path`), else the verified bytes are compiled.

An installer that does not byte-compile (``uv pip install`` without
``--compile-bytecode``, ``pip install --no-compile``) leaves no such pyc, and the runtime
never writes inside the installed package; for that case the build ships one beside
the source half, ``NAME.<cache tag>.pyc`` (:func:`shipped_path`; made by
precompile_build/wheels/bytecode.py for the interpreter that built the wheel),
hash-based only: it serves only the very bytes it was compiled from, and a name that
neither Python's import nor pip's compileall writes or reads. Like every file the
loader reads, it is covered by the manifest: the variant's ``bytecode`` entry for this
interpreter's cache tag (its size and sha256, checked by :func:`shipped_bytes`); a
shipped pyc the manifest does not list is not read, one that differs is refused.
"""

from __future__ import annotations

import _imp
import importlib.util
import marshal
import os
import sys
import types
from collections.abc import Mapping
from typing import Any

from . import _safe_path
from . import envelope as _envelope
from .errors import IntegrityError


def source_code(
    path: Any, source: bytes, filename: str, shipped: bytes | None = None
) -> types.CodeType:
    """The code object of ``source`` (the bytes of the file at ``path``).

    Args:
        path: the source half's location (a ``pathlib.Path`` or a Traversable of
            importlib.resources); only a real file can have bytecode.
        source: its bytes, as read (and verified) by the loader.
        filename: the name compiled code carries (tracebacks, linecache).
        shipped: the bytes of the pyc the build shipped beside it, as
            :func:`shipped_bytes` read and verified them; None: none is used.
    Returns:
        the bytecode pip compiled for it where valid, else the one the build
        shipped where valid (see the module docstring; a missing, stale or
        unreadable pyc is no error), else ``compile(source)``.
    Raises:
        SyntaxError: ``source`` does not compile (a corrupted source half).
    """
    code = _installed_bytecode(path, source, shipped)
    if code is None:
        return compile(source, filename, "exec", dont_inherit=True)
    _imp._fix_co_filename(code, filename)  # type: ignore[attr-defined]  # as importlib does: tracebacks name the pair's file
    return code


def shipped_path(source_path: str) -> str | None:
    """Where the build ships the source half ``source_path``'s bytecode for this
    interpreter: ``DIR/NAME.<cache tag>.pyc`` beside ``DIR/NAME.py`` (None: this
    Python caches no bytecode, ``sys.implementation.cache_tag`` is None)."""
    tag = sys.implementation.cache_tag
    if tag is None:
        return None
    head, name = os.path.split(source_path)
    return os.path.join(head, f"{name[:-3] if name.endswith('.py') else name}.{tag}.pyc")


def shipped_bytes(data: Any, variant: Mapping[str, Any], where: str) -> bytes | None:
    """The pyc the build shipped for this interpreter beside the variant's source half,
    verified against the manifest.

    Args:
        data: the ``_precompiled/`` folder (a Path or a Traversable).
        variant: the manifest's variant (its ``bytecode`` entry, by cache tag).
        where: the package and target, for the message.
    Returns:
        its bytes, or None: the manifest lists none for this cache tag (an older build,
        another Python), or the file is not there (an installer that left it out).
    Raises:
        IntegrityError: its size or sha256 differs from the manifest's (it was
            modified: a swapped code object behind a kept header is never run).
    """
    tag = sys.implementation.cache_tag
    entry = (variant.get("bytecode") or {}).get(tag) if tag else None
    if not entry:
        return None
    try:
        blob: bytes = (data / entry["path"]).read_bytes()
    except (OSError, KeyError):
        return None
    digest = _envelope.sha256_hex(blob)
    if len(blob) != entry["size"] or digest != entry["sha256"]:
        raise IntegrityError(
            f"sha256 check failed: the manifest says {entry['size']} bytes with sha256 {entry['sha256']}, "
            f"the file has {len(blob)} bytes with {digest}",
            advice="the file was modified, reinstall the package",
            context=where,
            where=f"_precompiled/{entry['path']}",
        )
    return blob


def _installed_bytecode(path: Any, source: bytes, shipped: bytes | None) -> types.CodeType | None:
    try:
        file = os.fspath(path)
    except TypeError:  # a Traversable of a zip: no file, no pyc
        return None
    try:
        pyc = importlib.util.cache_from_source(file)
    except (ValueError, NotImplementedError):
        pyc = None
    if pyc and sys.pycache_prefix and not _trusted(pyc):
        pyc = None  # a shared PYTHONPYCACHEPREFIX: a pyc another user could have written
    code = _pip_bytecode(file, pyc, source) if pyc else None
    if code is None and shipped is not None:
        data = (
            shipped if len(shipped) >= 16 and shipped[:4] == importlib.util.MAGIC_NUMBER else None
        )
        if (
            data is not None
            and _flags(data) in (0b01, 0b11)
            and data[8:16] == importlib.util.source_hash(source)
        ):
            code = _code(data)
    return code


def _trusted(pyc: str) -> bool:
    """Whether only this user or root could have written ``pyc`` (docs/security.md)."""
    try:
        return _safe_path.problem(pyc) is None
    except OSError:
        return False


def _read(pyc: str) -> bytes | None:
    """The bytes of ``pyc`` when it is a pyc of this Python, else None."""
    try:
        with open(pyc, "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data if len(data) >= 16 and data[:4] == importlib.util.MAGIC_NUMBER else None


def _flags(data: bytes) -> int:
    return int.from_bytes(data[4:8], "little")


def _code(data: bytes) -> types.CodeType | None:
    try:
        code = marshal.loads(data[16:])
    except (ValueError, EOFError, TypeError):  # a truncated or corrupt pyc
        return None
    return code if isinstance(code, types.CodeType) else None


def _pip_bytecode(file: str, pyc: str, source: bytes) -> types.CodeType | None:
    """The pyc an installer wrote in ``__pycache__`` (``pyc``), where valid for ``source``."""
    data = _read(pyc)
    if data is None:
        return None
    try:
        stat, pyc_stat = os.stat(file), os.stat(pyc)
    except OSError:
        return None
    flags = _flags(data)
    if flags in (0b01, 0b11):  # hash-based (checked or not: here always checked)
        if data[8:16] != importlib.util.source_hash(source):
            return None
    elif flags != 0:  # bits Python's import does not know
        return None
    elif (
        int.from_bytes(data[8:12], "little") != int(stat.st_mtime) & 0xFFFFFFFF
        or int.from_bytes(data[12:16], "little") != len(source) & 0xFFFFFFFF
        or stat.st_size != len(source)
        or not _holds(file, source)
        # written after its pyc (within the header's second): not what was compiled
        or stat.st_mtime_ns > pyc_stat.st_mtime_ns
    ):
        return None
    return _code(data)


def _holds(file: str, source: bytes) -> bool:
    """Whether ``file`` holds exactly ``source`` now."""
    try:
        with open(file, "rb") as f:
            return f.read() == source
    except OSError:
        return False
