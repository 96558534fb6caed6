"""The build's temporary directories, and the sweeping of ones a killed build left.

A frontend that is interrupted (Ctrl-C under ``python -m build``) may SIGKILL the
backend, whose ``finally`` blocks then never run. Its temp dir is named after its pid,
so the next build removes every such dir whose process is gone. So is the temp dir
beside the output where a wheel or sdist is written before its rename
(``<out_dir>/.precompile-tmp-<pid>-*``, :func:`out_tempdir`): a build killed while
writing it leaves a truncated wheel there, which the next build into that directory
removes (one named without a pid, by an older version, once it is a day old).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PREFIX = "precompile-build-"
OUT_PREFIX = ".precompile-tmp-"
_LEGACY_AGE = (
    86400.0  # seconds: an output temp dir named without its pid, older than this, is a leftover
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_stale(parent: str | os.PathLike[str] | None = None, prefix: str = PREFIX) -> list[Path]:
    """Remove ``<parent>/<prefix><pid>-*`` dirs whose process no longer runs (and, for
    :data:`OUT_PREFIX`, ones named without a pid that are over a day old).

    Args:
        parent: the directory to sweep (default: ``tempfile.gettempdir()``).
        prefix: :data:`PREFIX` (the build's temp dirs) or :data:`OUT_PREFIX` (beside
            the output).
    Returns:
        the paths removed.
    """
    removed = []
    base = Path(parent or tempfile.gettempdir())
    for d in base.glob(prefix + "*"):
        pid, dash, _ = d.name[len(prefix) :].partition("-")
        if pid.isdigit() and dash:
            stale = int(pid) != os.getpid() and not _alive(int(pid))
        else:  # an output temp dir of an older version (mkdtemp's random name: no pid)
            try:
                stale = prefix == OUT_PREFIX and time.time() - d.stat().st_mtime > _LEGACY_AGE
            except OSError:
                stale = False
        if stale and d.is_dir() and not d.is_symlink():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def out_tempdir(out_dir: str | os.PathLike[str]) -> Path:
    """A fresh temp dir beside the output, ``<out_dir>/.precompile-tmp-<pid>-*``, where a
    wheel or sdist is written before its rename into ``out_dir`` (the caller removes
    it), after sweeping the ones killed builds left there.

    Args:
        out_dir: the output directory (exists).
    Returns:
        the new directory's path.
    Raises:
        OSError: it cannot be created.
    """
    sweep_stale(out_dir, OUT_PREFIX)
    return Path(tempfile.mkdtemp(prefix=f"{OUT_PREFIX}{os.getpid()}-", dir=out_dir))


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
