"""Runs a capture script so that it dies with the build (builder/script.py starts it as
``python run_script.py BUILD_PID RESULT_FILE SCRIPT ARGS...``).

A frontend interrupted by Ctrl-C may SIGKILL the backend, which then cannot end the
script (it runs in its own session, so that a timeout can end its whole process group).
On Linux the script asks for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG). Then
the script runs as `python SCRIPT ARGS...` would run it (sys.argv, sys.path[0] its
folder, __main__), with a sys.excepthook that reports the exception that ends it to the
result file (builder/script.py: result_file) before Python prints its traceback. It adds
the script's pid to capture_env.SCRIPT_STARTED (the one variable it spells before the
script runs). A script that ends well and wrote no imports record (it did not capture
through precompile_build.capture) gets the whole environment's, made here in its own
import context (process/imported.py). Nothing of precompile_build is imported before the
script runs, except the fake process group's setup for a fake world.
"""

import os
import signal
import sys

# config/capture_env.py's and process/world.py's names, spelled here: nothing of the
# package is imported before the script runs (a test keeps them equal)
STARTED_ENV = "PRECOMPILE_SCRIPT_STARTED"
WORLD_ENV = "PRECOMPILE_WORLD"


def _report(kind, value, tb, _shown=sys.excepthook):
    import json

    text = value.msg if isinstance(value, SyntaxError) and value.msg else str(value)
    line = (kind.__name__ + (": " + text if text else "")).strip().split("\n")[0].strip()
    try:
        with open(_result, "w", encoding="utf-8") as f:
            json.dump({"error": line}, f)
    except OSError:
        pass
    _shown(kind, value, tb)


def _record() -> None:
    try:
        from precompile_build.process.imported import write_record

        write_record(environment=True)
    except Exception:  # noqa: BLE001 - the build keys the entry on its own view of the environment
        pass


def main() -> None:
    global _result
    parent, _result, script = int(sys.argv[1]), sys.argv[2], os.path.abspath(sys.argv[3])
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the build died before the request took effect
            sys.exit("precompile-build: the build that started this capture is gone")
    sys.excepthook = _report
    if STARTED_ENV in os.environ:  # capture_stats.capture_began: this process's setup only
        os.environ[STARTED_ENV] += " " + str(os.getpid())
    sys.argv = sys.argv[3:]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    if os.environ.get(WORLD_ENV) == "fake":  # rank 0 alone: init_process_group() makes a fake group
        from precompile_build.process.world import use_fake_backend

        use_fake_backend()
    import runpy

    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code in (None, 0):
            _record()
        raise
    _record()


_result = ""

if __name__ == "__main__":
    main()
