"""The build's temporary directory, and the sweeping of ones a killed build left.

A frontend that is interrupted (Ctrl-C under ``python -m build``) may SIGKILL the
backend, whose ``finally`` blocks then never run. Its temp dir is named after its pid,
so the next build removes every such dir whose process is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

PREFIX = "precompile-build-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale(parent: str | None = None) -> list[Path]:
    """Remove ``<tmp>/precompile-build-<pid>-*`` dirs whose process no longer runs.

    Args:
        parent: the directory to sweep (default: ``tempfile.gettempdir()``).
    Returns:
        the paths removed.
    """
    removed = []
    base = Path(parent or tempfile.gettempdir())
    for d in base.glob(PREFIX + "*-*"):
        pid = d.name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)) and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


@contextlib.contextmanager
def build_tempdir() -> Iterator[str]:
    """A fresh temp dir for one build (yields its path, a str; removed at exit), after
    sweeping stale ones. Raises OSError when it cannot be created."""
    sweep_stale()
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
