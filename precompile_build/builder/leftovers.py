"""What a capture script left running: processes that outlived it, found and ended.

A script's own process group is ended by script.py (``os.killpg``). A process it
started in a new session (``start_new_session=True``, a daemon that double-forks)
is in no group of the script's, and may hold the script's output pipe open: the
build would wait for it. Every process the script starts inherits its environment,
so the build gives each run a random token (``PRECOMPILE_CAPTURE_ID``, config/
capture_env.py) and, when the capture ends, ends every process of this user whose
environment carries it (a ``/proc`` walk, Linux; elsewhere only the process group is
ended). A process that removed the variable from its environment is not found.
"""

from __future__ import annotations

import os
import signal
import time

from ..config import capture_env

_GRACE = 2.0  # seconds between SIGTERM and SIGKILL


def _holders(token: str) -> list[tuple[int, str]]:
    """``(pid, command line)`` of each process whose environment has the token."""
    needle = f"{capture_env.CAPTURE_ID}={token}".encode()
    found = []
    try:
        names = os.listdir("/proc")
    except OSError:  # no /proc: not Linux
        return []
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
            if needle not in env:
                continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
        except OSError:  # gone, or another user's
            continue
        found.append((int(name), cmd or "?"))
    return sorted(found)


def end(token: str) -> list[str]:
    """End every process that carries ``token`` in its environment (SIGTERM, then
    SIGKILL after 2 s for those left).

    Args:
        token: the run's ``PRECOMPILE_CAPTURE_ID``.
    Returns:
        one text per process ended, ``"pid 123 (sh -c sleep 150)"`` (command lines cut
        at 80 characters), in pid order; empty when none was running.
    """
    found = _holders(token)
    if not found:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid, _ in found:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + _GRACE
            while time.monotonic() < deadline and _holders(token):
                time.sleep(0.05)
            if not _holders(token):
                break
    return [f"pid {pid} ({cmd if len(cmd) <= 80 else cmd[:77] + '...'})" for pid, cmd in found]


def said(ended: list[str]) -> str:
    """The words for the build's message: ``"ended what it left running in other
    sessions: pid 123 (sh -c sleep 150)"``, or ``""`` when nothing was left."""
    if not ended:
        return ""
    return "ended what it left running in other sessions: " + ", ".join(ended)
