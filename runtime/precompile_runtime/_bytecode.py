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

Where there is no valid pyc (an installer that does not byte-compile, as ``uv pip
install`` by default, or ``pip install --no-compile``), the code compiled now is written
where Python's import writes a module's (``importlib.util.cache_from_source``), as a
checked hash-based pyc of the verified bytes (PEP 552: valid for exactly those bytes,
whatever the file's mtime), atomically, unless ``sys.dont_write_bytecode`` or the
directory is read-only (by its mode, for root too); one that cannot be written is no
error. So only the first process after such an install
pays the compile (8B Llama: 0.10 s of a 0.39 s first result, bench/results/
llama_cold_h200.md), and ``pip uninstall`` removes the pyc with its source file.
"""

from __future__ import annotations

import _imp
import importlib.util
import marshal
import os
import sys
import tempfile
import types
from typing import Any


def source_code(path: Any, source: bytes, filename: str) -> types.CodeType:
    """The code object of ``source`` (the bytes of the file at ``path``).

    Args:
        path: the source half's location (a ``pathlib.Path`` or a Traversable of
            importlib.resources); only a real file can have bytecode.
        source: its bytes, as read (and verified) by the loader.
        filename: the name compiled code carries (tracebacks, linecache).
    Returns:
        the bytecode pip compiled for it where valid (see the module docstring;
        a missing, stale or unreadable pyc is no error), else ``compile(source)``.
    Raises:
        SyntaxError: ``source`` does not compile (a corrupted source half).
    """
    code = _installed_bytecode(path, source)
    if code is None:
        code = compile(source, filename, "exec", dont_inherit=True)
        _write_bytecode(path, source, code)
        return code
    _imp._fix_co_filename(code, filename)  # type: ignore[attr-defined]  # as importlib does: tracebacks name the pair's file
    return code


def _installed_bytecode(path: Any, source: bytes) -> types.CodeType | None:
    try:
        file = os.fspath(path)
        pyc = importlib.util.cache_from_source(file)
        with open(pyc, "rb") as f:
            data = f.read()
        stat, pyc_stat = os.stat(file), os.stat(pyc)
    except (TypeError, OSError, ValueError, NotImplementedError):  # no file, no pyc
        return None
    if len(data) < 16 or data[:4] != importlib.util.MAGIC_NUMBER:
        return None  # another Python's, or not a pyc
    flags = int.from_bytes(data[4:8], "little")
    if flags in (0b01, 0b11):  # hash-based (checked or not: here always checked)
        if data[8:16] != importlib.util.source_hash(source):
            return None
    elif flags != 0:  # bits Python's import does not know
        return None
    elif (int.from_bytes(data[8:12], "little") != int(stat.st_mtime) & 0xFFFFFFFF
          or int.from_bytes(data[12:16], "little") != len(source) & 0xFFFFFFFF
          or stat.st_size != len(source) or not _holds(file, source)
          # written after its pyc (within the header's second): not what was compiled
          or stat.st_mtime_ns > pyc_stat.st_mtime_ns):
        return None
    try:
        code = marshal.loads(data[16:])
    except (ValueError, EOFError, TypeError):  # a truncated or corrupt pyc
        return None
    return code if isinstance(code, types.CodeType) else None


def _holds(file: str, source: bytes) -> bool:
    """Whether ``file`` holds exactly ``source`` now."""
    try:
        with open(file, "rb") as f:
            return f.read() == source
    except OSError:
        return False


def _write_bytecode(path: Any, source: bytes, code: types.CodeType) -> None:
    """Write ``code`` as the checked hash-based pyc of ``source`` for the file at
    ``path`` (see the module docstring); any OSError (a read-only install) is ignored,
    as Python's import ignores it."""
    if sys.dont_write_bytecode:
        return
    try:
        file = os.fspath(path)
        pyc = importlib.util.cache_from_source(file)
        mode = (os.stat(file).st_mode | 0o200) & 0o666  # the source's, writable by its owner: as import does
        where = os.path.dirname(pyc)
        while not os.path.isdir(where) and os.path.dirname(where) != where:
            where = os.path.dirname(where)  # the nearest that exists: the package's, or sys.pycache_prefix's
        if not os.stat(where).st_mode & 0o222:
            return  # a directory made read-only for everyone: left so even for root, who could write it
    except (TypeError, OSError, ValueError, NotImplementedError):
        return
    data = importlib.util.MAGIC_NUMBER + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source) \
        + marshal.dumps(code)
    tmp = None
    try:
        os.makedirs(os.path.dirname(pyc), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(pyc), prefix=os.path.basename(pyc) + ".", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, pyc)  # readers see the old pyc or the whole new one, never a part
    except OSError:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
