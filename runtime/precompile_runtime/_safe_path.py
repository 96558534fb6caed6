"""Who else can change a folder or file: OpenSSH's StrictModes rule, for the runtime's
kernel cache and the build's capture cache (docs/security.md).

A path is trusted when it, resolved (``os.path.realpath``), is owned by this process's
effective uid and not writable by group or others, and every folder above it is owned
by this uid or root and not writable by group or others, unless it has the sticky bit
(``/tmp``: there only an entry's owner may rename or remove it). Root is a user like
any other: files root owns are its own, files another uid owns are not. Only ``stat``
calls: no import beyond ``os`` and ``stat``.
"""

from __future__ import annotations

import os
import stat


def problem(path: str) -> tuple[str, str] | None:
    """Why someone other than this user (or root) could change what ``path`` holds.

    Args:
        path: a folder or file; symlinks are resolved first (the caller then uses
            :func:`os.path.realpath` of it, so a link changed later is not followed).
    Returns:
        None when ``path`` is trusted, else ``(finding, fix)``: what was found (naming
        the path and its owner or mode) and the command or setting that fixes it.
    Raises:
        OSError: ``path`` or a folder above it cannot be stat'ed (missing: FileNotFoundError).
    """
    if not hasattr(os, "geteuid"):  # pragma: no cover - not POSIX: no owners and modes to check
        return None
    uid = os.geteuid()
    real = os.path.realpath(path)
    st = os.lstat(real)
    found = leaf_problem(real, st, uid)
    if found is not None:
        return found
    head = os.path.dirname(real)
    while True:
        st = os.stat(head)
        if st.st_uid not in (uid, 0):
            return (
                f"{head}, a folder above {real}, is owned by uid {st.st_uid}, neither you "
                f"(uid {uid}) nor root, and its owner can replace what it holds",
                "use a directory whose parent folders only you or root own",
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (
                f"{head}, a folder above {real}, is writable by "
                f"{_who(st.st_mode)} (mode {oct(stat.S_IMODE(st.st_mode))}) without the "
                "sticky bit, so they can replace what it holds",
                f"run `chmod go-w {head}`, or use a directory elsewhere",
            )
        parent = os.path.dirname(head)
        if parent == head:
            return None
        head = parent


def leaf_problem(path: str, st: os.stat_result, uid: int | None = None) -> tuple[str, str] | None:
    """:func:`problem` for ``path`` alone, from its ``lstat`` ``st`` (no folder above it
    checked): a symlink, or owned by another uid, or writable by group or others."""
    if uid is None:
        if not hasattr(os, "geteuid"):  # pragma: no cover - not POSIX
            return None
        uid = os.geteuid()
    if stat.S_ISLNK(st.st_mode):
        return (f"{path} is a symbolic link (to {_target(path)})", f"remove it: `rm {path}`")
    if st.st_uid != uid:
        return (
            f"{path} is owned by uid {st.st_uid}, not by you (uid {uid})",
            f"remove it (`rm -rf {path}`), or use a directory you own",
        )
    if st.st_mode & 0o022:
        return (
            f"{path} is writable by {_who(st.st_mode)} (mode {oct(stat.S_IMODE(st.st_mode))})",
            f"run `chmod go-w {path}`",
        )
    return None


def _who(mode: int) -> str:
    return {0o020: "its group", 0o002: "others"}.get(mode & 0o022, "its group and others")


def _target(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return "?"
