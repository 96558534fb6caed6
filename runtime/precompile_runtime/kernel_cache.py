"""The per-user kernel cache on disk: where a pair's frozen kernels are unpacked.

``$PRECOMPILE_CACHE_DIR``, else ``$XDG_CACHE_HOME/precompile-runtime``, else
``~/.cache/precompile-runtime``; one folder per code_hash, placed by an atomic rename
and verified byte for byte on every load (the installed package is never written).
Where the root cannot be written, a private temp folder serves (removed at exit).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid

from . import envelope as _envelope
from .errors import IntegrityError, PrecompileLoadError

CACHE_ENV = "PRECOMPILE_CACHE_DIR"
_private_dirs: list[str] = []


def cache_root() -> str:
    """The kernel cache root: ``$PRECOMPILE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/precompile-runtime``, else ``~/.cache/precompile-runtime``."""
    root = os.environ.get(CACHE_ENV)
    if root:
        return os.path.abspath(os.path.expanduser(root))
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "precompile-runtime")


def _check_blob_name(ctx: str, name: str) -> list[str]:
    parts = name.split("/")
    if (
        not name
        or name.startswith("/")
        or "\\" in name
        or "\0" in name
        or any(p in ("", ".", "..") for p in parts)
        or os.path.isabs(name)
    ):
        raise IntegrityError(
            f"cache blob name {name!r} check failed: it must be a relative path "
            "without '..' (path traversal refused)", context=ctx)
    return parts


def unpack(ctx: str, code_hash: str, env: _envelope.Envelope) -> str:
    """Unpack a cache's blobs into ``<cache_root()>/<code_hash>/`` (atomically: a temp
    folder renamed into place; an existing entry is reused when every file equals its
    blob), or into a private temp folder removed at exit where the cache root cannot
    be written.

    Args:
        ctx: ``package 'p', target 't'`` for messages.
        code_hash: the pair's code_hash (64 hex characters): the entry's folder name.
        env: the cache's envelope, already verified against the manifest's sha256.
    Returns:
        the folder holding the blobs (str).
    Raises:
        IntegrityError: a blob name that is not a plain relative path.
        PrecompileLoadError: neither the cache root nor a temp folder can be written.
    """
    names = {n: _check_blob_name(ctx, n) for n in env.blobs}
    root = cache_root()
    try:
        return _unpack_into(root, code_hash, env, names)
    except OSError as first:
        try:
            private = tempfile.mkdtemp(prefix="precompile-runtime-")
            _private_dirs.append(private)
            return _unpack_into(private, code_hash, env, names)
        except OSError as e:
            raise PrecompileLoadError(
                f"cannot unpack the precompiled kernels: the cache directory {root} "
                f"failed ({first}) and so did a private temp directory ({e}); set "
                f"{CACHE_ENV} to a writable directory", context=ctx) from None


def _verify_dir(path: str, env: _envelope.Envelope, names: dict[str, list[str]]) -> bool:
    """Whether every file of an unpacked entry equals its blob (the blobs were
    verified with the cache file's sha256 before the envelope was read: compare bytes)."""
    for name, parts in names.items():
        try:
            with open(os.path.join(path, *parts), "rb") as f:
                if f.read() != env.blobs[name]:
                    return False
        except OSError:
            return False
    return True


def _write_file(path: str, data: bytes) -> None:
    """One blob to disk (a seam: the tests fill the disk here)."""
    with open(path, "wb") as f:
        f.write(data)


def _unpack_into(root: str, code_hash: str, env: _envelope.Envelope, names: dict[str, list[str]]) -> str:
    final = os.path.join(root, code_hash)
    if os.path.isdir(final) and _verify_dir(final, env, names):
        return final  # also works on a read-only, pre-filled cache
    os.makedirs(root, mode=0o700, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{code_hash[:16]}-", dir=root)
    try:
        for name, parts in names.items():
            path = os.path.join(tmp, *parts)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            # No fsync: an entry is used only after every file's sha256 is verified
            # (above, and on every later load), so one torn by a crash is replaced,
            # never run; syncing a dozen files would cost more than the whole load.
            _write_file(path, env.blobs[name])
            os.chmod(path, 0o755 if name.endswith((".so", ".pyd", ".dylib")) else 0o644)
        os.chmod(tmp, 0o755)
        for _ in range(10):
            try:
                os.rename(tmp, final)
                return final
            except OSError:
                if not os.path.isdir(final):
                    raise
            # someone else put a directory there: use it if it is good, replace it if not
            if _verify_dir(final, env, names):
                return final
            trash = os.path.join(root, f".trash-{code_hash[:16]}-{uuid.uuid4().hex}")
            try:
                os.rename(final, trash)
            except FileNotFoundError:
                continue  # another process moved it already
            shutil.rmtree(trash, ignore_errors=True)
        raise OSError(f"could not place {final} after repeated races with other processes")
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


@atexit.register
def _remove_private_dirs() -> None:
    for d in _private_dirs:
        shutil.rmtree(d, ignore_errors=True)
