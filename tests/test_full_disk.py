"""A capture that fails because the build's temp dir is full says so: the message
was "exited with status 1 (empty log)". A real full TMPDIR needs a small file system
of its own (root); here the log writes go to /dev/full (ENOSPC on every write) and the
free-space probe reports what a full one does."""

from __future__ import annotations

import io
import os
import shutil
import types

import pytest
from _build_helpers import build, make_project, target_toml

from precompile_build.builder import script
from precompile_build.errors import CaptureError


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_log_that_cannot_be_written_still_drains_the_pipe():
    """A script whose log cannot be written must not block on its full output pipe:
    the pump keeps reading (and used to die on the first write, leaving the pipe full)."""
    stream = io.BytesIO(b"x" * 300_000)
    with open("/dev/full", "wb") as log:
        script._pump(stream, log, None)
    assert stream.tell() == 300_000


@pytest.mark.usefixtures("build_env")
def test_a_failed_capture_on_a_full_temp_dir_says_so(tmp_path, monkeypatch):
    full = shutil._ntuple_diskusage(total=10**9, used=10**9, free=0)  # type: ignore[attr-defined]
    monkeypatch.setattr(script, "shutil", types.SimpleNamespace(disk_usage=lambda path: full))
    with pytest.raises(CaptureError) as e:
        build(make_project(tmp_path, target_toml(mode="raise")), monkeypatch)
    first = str(e.value).splitlines()[0]
    assert first.startswith("Capture of target 'double' failed: exited with status 1"), first
    assert (
        "; no space left: the file system of the build's temp dir " in first
        and "has 0 bytes free (the script's files and its log could not be written); free space there, "
        "or point TMPDIR at a file system with room"
        in first
    ), first


@pytest.mark.usefixtures("build_env")
def test_room_enough_says_nothing_of_space(tmp_path, monkeypatch):
    with pytest.raises(CaptureError) as e:
        build(make_project(tmp_path, target_toml(mode="raise")), monkeypatch)
    assert "no space left" not in str(e.value)
