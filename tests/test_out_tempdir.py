"""The temp dir beside the output of a killed build: a SIGKILL while
the wheel is written leaves ``<outdir>/.precompile-tmp-*/`` with a truncated wheel; the
next build into that directory removes it (named after the pid of the build that made
it: removed once that process is gone)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _build_helpers import build, make_project, target_toml

from precompile_build.builder import workdir

pytestmark = pytest.mark.usefixtures("build_env")


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_killed_builds_temp_wheel_is_removed_by_the_next_build(tmp_path, monkeypatch):
    out = tmp_path / "dist"
    out.mkdir()
    dead = out / f".precompile-tmp-{_dead_pid()}-abc123"  # a build SIGKILLed mid-wheel
    dead.mkdir()
    (dead / "simplepkg-0.1.0-py3-none-any.whl").write_bytes(b"PK\x03\x04 truncated")
    running = out / f".precompile-tmp-{os.getppid()}-def456"  # a build still running
    running.mkdir()
    old = out / ".precompile-tmp-k2j4h5g6"  # an older version's (no pid), two days old
    old.mkdir()
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    fresh = out / ".precompile-tmp-q9w8e7r6"  # ... and one that may be writing now
    fresh.mkdir()
    whl = build(make_project(tmp_path, target_toml(mode="ok")), monkeypatch, out=out)
    assert sorted(p.name for p in out.iterdir()) == sorted([whl.name, running.name, fresh.name])


def test_the_sdists_temp_dir_is_swept_too(tmp_path):
    out = tmp_path / "dist"
    out.mkdir()
    dead = out / f".precompile-tmp-{_dead_pid()}-x"
    dead.mkdir()
    new = workdir.out_tempdir(out)
    assert new.name.startswith(f".precompile-tmp-{os.getpid()}-") and new.parent == out
    assert not dead.exists()
    assert workdir.sweep_stale(out, workdir.OUT_PREFIX) == []  # its own: kept
