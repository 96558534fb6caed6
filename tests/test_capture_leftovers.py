"""A capture ends by its timeout whatever the script leaves behind:
a process the script started in a new session, holding its output pipe, no longer
blocks the build until it ends, and it is ended with the capture, the message (or
the log, for a capture that succeeded) saying which."""

from __future__ import annotations

import os
import re
import sys
import time

import pytest
from _build_helpers import build, make_project

from precompile_build.errors import CaptureError

pytestmark = [
    pytest.mark.usefixtures("build_env"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the /proc walk is Linux's"),
]

DAEMON = """\
import subprocess, sys, time
p = subprocess.Popen(["sh", "-c", "sleep 150"], start_new_session=True)  # holds our stdout
open(sys.argv[1], "w").write(str(p.pid))
if sys.argv[2] == "hang":
    time.sleep(150)
"""


def _project(tmp_path, mode):
    pid_file = tmp_path / "daemon.pid"
    root = make_project(
        tmp_path,
        "[tool.precompile.targets.double]\n"
        'script = "capture/daemon.py"\ntimeout = 3\n'
        f'args = ["{pid_file}", "{mode}"]\n',
    )
    (root / "capture" / "daemon.py").write_text(DAEMON)
    return root, pid_file


def _gone(pid: int) -> bool:
    for _ in range(50):  # reaped by init shortly after the kill
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(")")[1].split()[0] == "Z":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("mode", ["exit", "hang"])
def test_a_daemon_in_a_new_session_neither_blocks_nor_survives_the_capture(
    tmp_path, monkeypatch, mode
):
    """The issue's script (`Popen(["sh", "-c", "sleep 150"], start_new_session=True)`)
    blocked a build with `timeout = 10` for 152 s; the daemon survived the timeout."""
    root, pid_file = _project(tmp_path, mode)
    start = time.monotonic()
    with pytest.raises(CaptureError) as e:
        build(root, monkeypatch)
    assert time.monotonic() - start < 30
    daemon = int(pid_file.read_text())
    first = str(e.value).splitlines()[0]
    want = "timed out after 3 s" if mode == "hang" else "wrote neither half of the pair"
    assert want in first, first
    said = rf"ended what it left running in other sessions: pid {daemon} \((sh -c )?sleep 150\)"
    if mode == "hang":  # in the reason
        assert re.search(said, first), first
    else:  # it exited 0: the reason is the pair's; the log (its tail is in the message) says it
        assert re.search("precompile-build: the script " + said, str(e.value)), str(e.value)
    assert _gone(daemon), f"the daemon {daemon} the script started is still alive"
    assert list((tmp_path / "dist").iterdir()) == []


def test_leftovers_are_found_by_their_token_only(tmp_path):
    """A process without the capture's token (another capture's, the user's) is not ended."""
    import subprocess

    from precompile_build.builder import leftovers
    from precompile_build.config import capture_env

    mine = subprocess.Popen(
        ["sleep", "60"], env={**os.environ, capture_env.CAPTURE_ID: "tok-a"}, start_new_session=True
    )
    other = subprocess.Popen(["sleep", "60"], env={**os.environ, capture_env.CAPTURE_ID: "tok-b"})
    try:
        assert leftovers.end("tok-a") == [f"pid {mine.pid} (sleep 60)"]
        assert mine.wait(timeout=10) < 0 and other.poll() is None
        assert leftovers.end("tok-nothing") == [] and leftovers.said([]) == ""
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("leaves_daemon", [True, False])
def test_a_cancelled_script_stays_cancelled_whatever_it_left_running(tmp_path, leaves_daemon):
    """The build stops a running script (Ctrl-C: ``abort``): its run is ``cancelled``
    (the summary says so and no failure is raised for it), also when the script left a
    process in another session, which is ended and said in the reason; the outcome is
    read from the run's field, never from the reason's words."""
    import threading

    from precompile_build.builder.script import run_script
    from precompile_build.config.settings import load_settings

    root, pid_file = _project(tmp_path, "hang")
    toml = root / "pyproject.toml"
    toml.write_text(toml.read_text().replace("timeout = 3", "timeout = 60"))  # no timeout
    if not leaves_daemon:
        (root / "capture" / "daemon.py").write_text(
            "import sys, time\nopen(sys.argv[1], 'w').write('0')\ntime.sleep(150)\n"
        )
    settings = load_settings(root, {"precompile.cache": "off"})
    target = settings.targets["double"]
    abort, done = threading.Event(), threading.Event()

    def stop_once_started():  # the script wrote its pid file: its daemon runs
        while not done.is_set() and not pid_file.exists():
            time.sleep(0.05)
        abort.set()

    stopper = threading.Thread(target=stop_once_started, daemon=True)
    stopper.start()
    try:
        run = run_script(settings, target, "cpu", None, tmp_path / "work", False, abort)
    finally:
        done.set()
        stopper.join()
    assert run.outcome == "cancelled", run
    if leaves_daemon:
        daemon = int(pid_file.read_text())
        assert "ended what it left running in other sessions" in (run.reason or ""), run.reason
        assert _gone(daemon), f"the daemon {daemon} the script started is still alive"
    else:
        assert run.reason is None, run.reason
