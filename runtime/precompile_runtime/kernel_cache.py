"""Where a pair's frozen kernels are unpacked for this process: a private folder in
the kernel cache directory, written from the verified bytes.

The cache directory is ``$PRECOMPILE_CACHE_DIR``, else
``$XDG_CACHE_HOME/precompile-runtime``, else ``~/.cache/precompile-runtime``. It is
used only when nobody but this user (or root) can change it (:mod:`._safe_path`:
owned by this user, not writable by group or others, nor is any folder above it,
sticky ``/tmp``-like folders aside); otherwise a :class:`CacheSecurityWarning` names
it and the fix, and a private temp folder serves. Each process writes the cache's
blobs, verified with the cache file's sha256 against the manifest and held in memory,
into its own folder ``<cache dir>/.run-XXXXXXXX/<code_hash>/`` (mode 0o700, created by
this process, removed at exit; one a crashed process left is removed by the next load,
which finds its lock released): the bytes the kernels are loaded from are the verified
bytes, and nothing another process put in the cache directory, or replaced after it
was checked, is ever loaded (docs/security.md). Writing them costs what verifying an
entry shared between processes did (a read of every byte). The installed package is
never written. Where the cache directory cannot be written, a private temp folder
serves (removed at exit).
"""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import tempfile
import threading
import warnings

from . import _safe_path
from . import envelope as _envelope
from .errors import CacheSecurityWarning, IntegrityError, PrecompileLoadError

try:  # POSIX: a crashed process's folder is found by its released lock
    import fcntl as _fcntl
except ImportError:  # pragma: no cover - not POSIX: folders of crashed processes stay
    _fcntl = None  # type: ignore[assignment]

CACHE_ENV = "PRECOMPILE_CACHE_DIR"
RUN_PREFIX = ".run-"
_private_dirs: list[
    tuple[int, str]
] = []  # (pid that made it, folder): removed at that process's exit
_runs: dict[str, tuple[str, int]] = {}  # real cache dir -> (this process's folder, its locked fd)
_mutex = threading.Lock()


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
            "without '..' (path traversal refused)",
            context=ctx,
        )
    return parts


class _Untrusted(Exception):
    """The cache directory could be changed by another user: (finding, fix)."""


def unpack(ctx: str, code_hash: str, env: _envelope.Envelope) -> str:
    """Write a cache's blobs into this process's private folder
    ``<cache_root()>/.run-XXXXXXXX/<code_hash>/`` (temp folder, then rename), or into a
    private temp folder removed at exit where the cache root cannot be written or
    could be changed by another user.

    Args:
        ctx: ``package 'p', target 't'`` for messages.
        code_hash: the pair's code_hash (64 hex characters): the folder's name.
        env: the cache's envelope, already verified against the manifest's sha256:
            its blobs are the bytes written (no file is read back).
    Returns:
        the folder holding the blobs (str); only this process (and root) can change it.
    Raises:
        IntegrityError: a blob name that is not a plain relative path.
        PrecompileLoadError: neither the cache root nor a temp folder can be written,
            or the temp folder could be changed by another user.
    Warns:
        CacheSecurityWarning: the cache root, or an entry named ``code_hash`` in it,
            could be changed by another user (the message names it and the fix); it
            is not used.
    """
    names = {n: _check_blob_name(ctx, n) for n in env.blobs}
    root = cache_root()
    first: OSError | None = None
    try:
        real = _trusted_root(root)
        _warn_foreign_entry(ctx, real, code_hash)
        run = _run_folder(real)
        try:
            return _write_private(run, code_hash, env, names)
        except OSError:
            _drop_run_if_empty(real)
            raise
    except _Untrusted as u:
        finding, fix = u.args
        warnings.warn(
            f"{ctx}: the kernel cache directory {root} is not used: {finding}. Whoever can "
            "change it could replace the kernels this process runs, so they were written "
            "into a private temp directory of this process instead (removed at exit, not "
            f"reused by other processes). To use it: {fix}; or set {CACHE_ENV} to a "
            "directory only you can write (docs/security.md)",
            CacheSecurityWarning,
            stacklevel=4,
        )
    except OSError as e:
        first = e
    return _private_temp(ctx, root, code_hash, env, names, first)


def _trusted_root(root: str) -> str:
    """``root``, created (each missing folder mode 0o700) and resolved, once it is
    trusted; raises :class:`_Untrusted` (finding, fix) or OSError."""
    _makedirs_private(root)
    found = _safe_path.problem(root)
    if found is not None:
        raise _Untrusted(*found)
    return os.path.realpath(root)


def _makedirs_private(path: str) -> None:
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        _makedirs_private(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise


def _warn_foreign_entry(ctx: str, real: str, code_hash: str) -> None:
    """A CacheSecurityWarning for ``<real>/<code_hash>`` where someone other than this
    user made or can change it (a folder the runtime never loads from: a sign that
    something put it there)."""
    entry = os.path.join(real, code_hash)
    try:
        st = os.lstat(entry)
    except OSError:
        return
    found = _safe_path.leaf_problem(entry, st)
    if found is not None:
        warnings.warn(
            f"{ctx}: the kernel cache entry {entry} is not used: {found[0]}. The runtime "
            "loads kernels only from the private folder of this process, written from the "
            "wheel's verified bytes; an entry that someone else could have written is a sign "
            f"that someone did. To clear this warning: {found[1]}",
            CacheSecurityWarning,
            stacklevel=5,
        )


def _run_folder(real: str) -> str:
    """This process's private folder in the trusted cache dir ``real`` (made once,
    locked while the process lives; a folder of a process that is gone is removed)."""
    with _mutex:
        held = _runs.get(real)
        if held is not None and os.path.isdir(held[0]):
            return held[0]
        _sweep(real)
        tmp = tempfile.mkdtemp(prefix=".tmp" + RUN_PREFIX, dir=real)  # mode 0o700
        fd = os.open(tmp, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            if _fcntl is not None:
                _fcntl.flock(fd, _fcntl.LOCK_EX)  # held until this process ends
            run = os.path.join(real, os.path.basename(tmp)[len(".tmp") :])
            os.rename(tmp, run)  # (a sweep takes only .run- folders: this one is locked now)
        except OSError:
            os.close(fd)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _runs[real] = (run, fd)
        _private_dirs.append((os.getpid(), run))
        return run


def _sweep(real: str) -> None:
    """Remove the ``.run-`` folders in ``real`` of processes that are gone (their lock
    is free); folders of another uid are left alone."""
    if _fcntl is None:  # pragma: no cover
        return
    try:
        names = [n for n in os.listdir(real) if n.startswith(RUN_PREFIX)]
    except OSError:
        return
    uid = os.geteuid()
    for name in names:
        path = os.path.join(real, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
                continue
            fd = os.open(
                path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
            )
        except OSError:
            continue
        try:
            _fcntl.flock(fd, _fcntl.LOCK_EX | _fcntl.LOCK_NB)
        except OSError:
            continue  # its process lives
        finally:
            os.close(fd)
        shutil.rmtree(path, ignore_errors=True)


def _drop_run_if_empty(real: str) -> None:
    with _mutex:
        held = _runs.get(real)
        if held is None:
            return
        try:
            os.rmdir(held[0])
        except OSError:
            return
        os.close(held[1])
        del _runs[real]


def _private_temp(
    ctx: str,
    root: str,
    code_hash: str,
    env: _envelope.Envelope,
    names: dict[str, list[str]],
    first: OSError | None,
) -> str:
    """The blobs in a private temp folder of this process (removed at exit)."""
    try:
        private = tempfile.mkdtemp(prefix="precompile-runtime-")
        _private_dirs.append((os.getpid(), private))
        found = _safe_path.problem(private)
        if found is not None:
            raise PrecompileLoadError(
                f"cannot unpack the precompiled kernels: the private temp directory {private} "
                f"could be changed by another user: {found[0]}",
                context=ctx,
                advice=f"set TMPDIR, or {CACHE_ENV}, to a directory only you can write ({found[1]})",
            )
        return _write_private(private, code_hash, env, names)
    except OSError as e:
        if first is None:
            raise PrecompileLoadError(
                f"cannot unpack the precompiled kernels: the cache directory {root} is not used "
                f"(see the CacheSecurityWarning) and a private temp directory failed ({e}); set "
                f"{CACHE_ENV} to a writable directory only you can write",
                context=ctx,
            ) from None
        raise PrecompileLoadError(
            f"cannot unpack the precompiled kernels: the cache directory {root} "
            f"failed ({first}) and so did a private temp directory ({e}); set "
            f"{CACHE_ENV} to a writable directory",
            context=ctx,
        ) from None


def _write_file(path: str, data: bytes) -> None:
    """One blob to disk, as a new read-only file (``r-x`` for a shared object; a seam:
    the tests fill the disk here). A name already there (a link) fails instead of being
    followed."""
    mode = 0o500 if path.endswith((".so", ".pyd", ".dylib")) else 0o400
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _write_private(
    folder: str, code_hash: str, env: _envelope.Envelope, names: dict[str, list[str]]
) -> str:
    """The blobs in ``<folder>/<code_hash>/`` (a temp folder renamed into place; kept
    when this process wrote it already). ``folder`` is this process's own."""
    final = os.path.join(folder, code_hash)
    if os.path.isdir(final):
        return final  # another target of this process with the same source half
    tmp = tempfile.mkdtemp(prefix=f".tmp-{code_hash[:16]}-", dir=folder)
    try:
        made = {tmp}
        for name, parts in names.items():
            path = os.path.join(tmp, *parts)
            head = os.path.dirname(path)
            if head not in made:
                os.makedirs(head, mode=0o700, exist_ok=True)
                made.add(head)
            # No fsync: the folder is this process's alone and gone with it.
            _write_file(path, env.blobs[name])
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # a thread of this process placed it first
                raise
        return final
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


@atexit.register
def _remove_private_dirs() -> None:
    pid = os.getpid()  # a forked child that exits leaves its parent's folders alone
    for owner, d in _private_dirs:
        if owner == pid:
            shutil.rmtree(d, ignore_errors=True)
