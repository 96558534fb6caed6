"""Run one capture script in a subprocess: environment, log, timeout, cancel, check;
and check an imports record in a process started as the script would be.

The script runs as ``python SCRIPT ARGS...`` would run it, in its own session (its whole
process group is killed on timeout, cancel or Ctrl-C), with the project root as working
directory; its output goes to ``work/logs/NAME.log``, and the exception that ended it, if
one did, to ``work/logs/NAME.result.json`` (:func:`result_file`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any, NamedTuple, Optional

from ..config import capture_env
from ..config.settings import Settings, TargetSettings
from ..errors import CaptureError
from ..process import imported
from ..process import stats as capture_stats
from ..process.world import MODE_ENV, WORLD_ENV
from ..programs import path as program_path
from . import leftovers, ranks
from .pairs import inspect_pair
from .ranks import WorldPlan
from .results import Outcome, PairCheck, ScriptRun

LOG_TAIL_LINES = 40
_TAIL_BYTES = 64 * 1024
_LINE_CAP = 400  # characters per shown log line
_KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


class Ended(NamedTuple):
    """How waiting for a script's process (or a world's) ended: ``outcome`` decides,
    ``reason`` (a failure's) is only shown."""

    outcome: Outcome
    reason: Optional[str] = None


_OK = Ended("ok")
_CANCELLED = Ended("cancelled")


def _failed(reason: str) -> Ended:
    return Ended("failed", reason)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (long lines cut), for error messages."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    out = [
        ln if len(ln) <= _LINE_CAP else ln[:_LINE_CAP] + " [...]"
        for ln in text.splitlines()[-lines:]
    ]
    return "\n".join(out) or "(empty log)"


_ERROR_CAP = 2000  # characters of the error line put into a failure's reason


def result_file(log_path: Path) -> Path:
    """Where the script's process reports how it ended (``NAME.result.json`` beside its
    log): ``{"error": "Type: first line of the message"}`` when an exception ended it,
    written by programs/run_script.py's ``sys.excepthook``; no file otherwise."""
    return log_path.with_suffix(".result.json")


def stats_file(log_path: Path) -> Path:
    """Where the script's captures record what they measured (``NAME.stats.json``
    beside its log; process/stats.py)."""
    return log_path.with_suffix(".stats.json")


def error_line(log_path: Path) -> Optional[str]:
    """The first line of the exception that ended the script, as its process reported
    it (:func:`result_file`): ``CaptureError: target 't': ...`` (the exception's class
    name without its module; cut at :data:`_ERROR_CAP` characters, not at a log line's
    cap). None when no exception ended it (killed, ``sys.exit(3)``)."""
    try:
        with open(result_file(log_path), encoding="utf-8") as f:
            line = json.load(f)["error"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(line, str):
        return None
    return line if len(line) <= _ERROR_CAP else line[:_ERROR_CAP] + " [...]"


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """End the script and every process it started in its session."""
    for sig, grace in ((signal.SIGTERM, _KILL_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if grace is None:
            break
        try:
            proc.wait(timeout=grace)
            # the leader is gone; SIGKILL what is left of its group
        except subprocess.TimeoutExpired:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def _pump(stream: IO[bytes], log: IO[bytes], echo: Optional[str]) -> None:
    """Copy the script's output to its log; with ``echo`` (the target name) also to
    stderr, each line prefixed with ``[name]`` (captures may run side by side)."""
    partial, writing = b"", True
    for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
        if writing:
            try:
                log.write(chunk)
                log.flush()  # the live progress line reads the log's last line
            except (
                OSError
            ):  # a full disk: the pipe is still drained (the script would block on it);
                writing = False  # the failure's reason says why (_no_space)
        if echo is not None:
            *lines, partial = (partial + chunk).split(b"\n")
            if lines:
                prefix = f"[{echo}] ".encode()
                sys.stderr.buffer.write(b"".join(prefix + ln + b"\n" for ln in lines))
                sys.stderr.flush()
    if echo is not None and partial:
        sys.stderr.buffer.write(f"[{echo}] ".encode() + partial + b"\n")
        sys.stderr.flush()


def _exit_reason(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name} ({-rc})"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def script_env(
    settings: Settings,
    target: TargetSettings,
    device: str,
    src: Path,
    cache: Path,
    gpu: Optional[str],
) -> dict[str, str]:
    """The script's environment: ours, the target's `env`, the PRECOMPILE_* paths and
    device, the project root and package folder for the imports record,
    ``CUDA_VISIBLE_DEVICES`` (``""`` for cpu, ``gpu`` for cuda when given)."""
    env = dict(os.environ)
    env.update(target.env)
    # The script imports the library being built: put its source root first.
    base = str(settings.package_dir.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (base, env.get("PYTHONPATH")) if p)
    env.update(
        {
            capture_env.TARGET: target.name,
            capture_env.ARTIFACT_PATH: str(src),
            capture_env.CACHE_PATH: str(cache),
            capture_env.DEVICE: device,
            capture_env.FALLBACK: target.fallback,
            capture_env.IMPORTS_PATH: str(imported.record_path(src)),
        }
    )
    # what the imports record takes as the project's own (process/imported.py)
    env[capture_env.PROJECT_ROOT] = str(settings.root)
    env[capture_env.PACKAGE_DIR] = str(settings.package_dir)
    if target.tracer:
        env[capture_env.TRACER] = target.tracer
    if target.cuda_graphs:
        env[capture_env.CUDA_GRAPHS] = "1"
    if target.cuda_archs and device == "cuda":  # engines/cross_arch.py reads it
        env[capture_env.CUDA_ARCHS] = ",".join(target.cuda_archs)
    else:
        env.pop(capture_env.CUDA_ARCHS, None)
    if (
        target.mode != "default"
    ):  # config/capture_options.py reads it: the capture's options["mode"]
        env[capture_env.MODE] = target.mode
    else:
        env.pop(capture_env.MODE, None)
    for name in (MODE_ENV, WORLD_ENV):  # set per rank for a world-size target (ranks.rank_env)
        env.pop(name, None)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def wait(proc: subprocess.Popen[bytes], timeout: float, abort: threading.Event) -> Ended:
    """Wait for the script at most ``timeout`` seconds; returns how it ended (``ok`` for
    exit status 0, ``cancelled`` on ``abort``, else ``failed`` and why). Kills the script's process group on timeout, ``abort`` or
    an exception."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                rc = _wait_once(proc, max(0.0, min(0.5, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if abort.is_set():
                    _kill_group(proc)
                    return _CANCELLED
                if time.monotonic() >= deadline:
                    _kill_group(proc)
                    return _failed(f"timed out after {timeout:g} s (process group killed)")
    except BaseException:  # Ctrl-C: end the script's tree, then re-raise
        _kill_group(proc)
        raise
    _kill_group(proc)  # leftovers the script started in the background
    return _failed(_exit_reason(rc)) if rc != 0 else _OK


def _wait_once(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """``proc.wait(timeout)``, reaping with ``os.wait4`` where there is one, so that the
    script's peak RSS (``ru_maxrss``) is kept as ``proc.peak_rss_bytes``."""
    if not hasattr(os, "wait4"):
        return proc.wait(timeout=timeout)
    end = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            proc.peak_rss_bytes = capture_stats.maxrss_bytes(usage.ru_maxrss)  # type: ignore[attr-defined]
            return proc.returncode
        if time.monotonic() >= end:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))


def run_script(
    settings: Settings,
    target: TargetSettings,
    device: str,
    gpu: Optional[str],
    work: Path,
    verbose: bool,
    abort: threading.Event,
    world: Optional[WorldPlan] = None,
) -> ScriptRun:
    """Run one target's script (see the module docstring).

    Args:
        settings: the project's settings (project root, verbosity).
        target: the target to run (script, args, env, timeout in seconds).
        device: ``"cpu"`` or ``"cuda"``; sets PRECOMPILE_DEVICE (and hides GPUs for cpu).
        gpu: ``CUDA_VISIBLE_DEVICES`` for a cuda capture (None: inherited); for the
            ranks of a real world, one GPU per rank (``"0,1"``), all visible to each.
        work: the build's temp directory; the pair goes to ``work/pairs/NAME/``.
        verbose: also stream the output to stderr, lines prefixed ``[NAME]``
            (``[NAME rank 1]`` for the other ranks).
        abort: set by the build to stop the script (outcome ``cancelled``).
        world: a world-size target's plan (ranks.py): ``real`` runs the script once
            per rank with torchrun's environment (rank ``r > 0`` writing its pair to
            ``work/pairs/NAME/rank<r>/`` and its log to ``NAME.rank<r>.log``); the
            first rank that fails ends the others. ``fake``: rank 0 alone.
    Returns:
        a :class:`~.results.ScriptRun`: the outcome and a failure's reason, the source
        and cache paths, the log path (of the rank that failed first, else rank 0's),
        what the capture measured (rank 0's :func:`.capture_stats.read`: peaks,
        breakdown). A reason from another rank than 0 begins ``rank R``.
    Raises:
        OSError: the pair or log directory cannot be created, or the interpreter
            cannot be started.
    """
    out = work / "pairs" / target.name
    out.mkdir(parents=True, exist_ok=True)
    src, cache = out / f"{target.name}.py", out / f"{target.name}.cache"
    log_path = log_file(work, target)
    env = script_env(settings, target, device, src, cache, gpu)
    stats = stats_file(log_path)  # GPU peaks, seconds per step (process/stats.py)
    stats.unlink(missing_ok=True)
    env[capture_stats.STATS_ENV] = str(stats)
    env[capture_env.CAPTURE_ID] = (
        uuid.uuid4().hex
    )  # what the script starts inherits it (leftovers.py)
    env[capture_stats.STARTED_ENV] = repr(
        time.time()
    )  # + the script's pid (programs/run_script.py): capture_began
    for attempt in range(2):
        ended, failed, procs = _run_ranks(
            settings, target, work, env, log_path, verbose, abort, world
        )
        if attempt or world is None or world.processes == 1 or ended.outcome != "failed":
            break
        # MASTER_PORT was free when chosen and taken before rank 0 bound it (another
        # process on this host): a new port, once
        if not any(_PORT_TAKEN in log_tail(r_log, 60) for _, _, r_log in procs):
            break
    reason = ended.reason
    if failed:
        reason, log_path = f"rank {failed} {reason}", procs[failed][2]
    peaks, breakdown = capture_stats.read(stats, getattr(procs[0][0], "peak_rss_bytes", None))
    return ScriptRun(ended.outcome, reason, src, cache, log_path, peaks, breakdown)


_PORT_TAKEN = "EADDRINUSE"  # c10d's TCPStore, when the MASTER_PORT is in use


def _run_ranks(
    settings: Settings,
    target: TargetSettings,
    work: Path,
    env: dict[str, str],
    log_path: Path,
    verbose: bool,
    abort: threading.Event,
    world: Optional[WorldPlan],
) -> tuple[Ended, int, list[tuple[subprocess.Popen[bytes], threading.Thread, Path]]]:
    """Start the script once per rank of ``world`` (once when None) and wait for all:
    ``(how it ended, index of the rank that failed first, [(process, pump, log path)])``."""
    port = ranks.free_port() if world is not None else 0
    procs: list[tuple[subprocess.Popen[bytes], threading.Thread, Path]] = []
    try:
        for rank in range(world.processes if world is not None else 1):
            r_env, r_log, echo = env, log_path, target.name if verbose else None
            if world is not None:
                r_env = ranks.rank_env(env, world, rank, port)
            if rank:
                r_src, r_cache = rank_pair(work, target, rank)
                r_src.parent.mkdir(parents=True, exist_ok=True)
                r_log = log_path.with_name(f"{target.name}.rank{rank}.log")
                r_env.update(
                    {
                        capture_env.ARTIFACT_PATH: str(r_src),
                        capture_env.CACHE_PATH: str(r_cache),
                        capture_env.IMPORTS_PATH: str(imported.record_path(r_src)),
                    }
                )
                r_env.pop(capture_stats.STATS_ENV, None)  # the report is rank 0's
                echo = f"{target.name} rank {rank}" if verbose else None
            procs.append(_start(settings, target, r_env, r_log, echo))
        ended, failed = wait_all([p for p, _, _ in procs], target.timeout, abort)
    finally:
        for proc, _, _ in procs:
            if proc.returncode is None:
                _kill_group(proc)
        # what it started in other sessions (a daemon holding the output pipe open)
        left = leftovers.end(env[capture_env.CAPTURE_ID]) if procs else []
        for proc, pump, _ in procs:
            pump.join(timeout=10)
            if not pump.is_alive():  # (a close would wait for a read that a holder keeps open)
                proc.stdout.close()  # type: ignore[union-attr]
    reason = ended.reason
    if ended.outcome == "failed":
        full = _no_space(work)
        if full:
            reason = f"{reason}; {full}"
    if left:
        if ended.outcome == "ok":  # served, but said in its log
            with open(log_path, "ab") as log:
                log.write(f"precompile-build: the script {leftovers.said(left)}\n".encode())
        else:
            reason = f"{reason or ended.outcome}; {leftovers.said(left)}"
    return Ended(ended.outcome, reason), failed, procs


_LOW_SPACE = 16 * 2**20  # bytes free below which a failed capture is said to have run out of room


def _no_space(work: Path) -> Optional[str]:
    """The words for a failed capture whose temp dir's file system is full, or None."""
    try:
        free = shutil.disk_usage(work).free
    except OSError:
        return None
    if free >= _LOW_SPACE:
        return None
    return (
        f"no space left: the file system of the build's temp dir {work} has {free} bytes free "
        "(the script's files and its log could not be written); free space there, or point TMPDIR "
        "at a file system with room"
    )


def rank_pair(work: Path, target: TargetSettings, rank: int) -> tuple[Path, Path]:
    """Where rank ``rank`` (> 0) of a real world writes its pair."""
    out = work / "pairs" / target.name / f"rank{rank}"
    return out / f"{target.name}.py", out / f"{target.name}.cache"


def _start(
    settings: Settings,
    target: TargetSettings,
    env: dict[str, str],
    log_path: Path,
    echo: Optional[str],
) -> tuple[subprocess.Popen[bytes], threading.Thread, Path]:
    """Start the script (its own session) with its output pumped to ``log_path``."""
    result_file(log_path).unlink(missing_ok=True)
    cmd = [
        sys.executable,
        program_path("run_script"),
        str(os.getpid()),
        str(result_file(log_path)),
        str(target.script),
        *target.args,
    ]
    log = open(log_path, "wb")
    try:
        proc = subprocess.Popen(
            cmd,
            cwd=settings.root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except BaseException:
        log.close()
        raise

    def pump() -> None:
        try:
            _pump(proc.stdout, log, echo)  # type: ignore[arg-type]
        finally:
            with contextlib.suppress(OSError):  # a full disk's last flush (the reason says so)
                log.close()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    return proc, thread, log_path


def wait_all(
    procs: list[subprocess.Popen[bytes]], timeout: float, abort: threading.Event
) -> tuple[Ended, int]:
    """:func:`wait` for several processes (the ranks of a world): returns ``(how it
    ended, index)`` of the first to fail (the others are killed: they would wait for it
    in a collective), or ``(ok, 0)`` when all exit 0."""
    if len(procs) == 1:
        return wait(procs[0], timeout, abort), 0
    deadline = time.monotonic() + timeout
    done: set[int] = set()
    try:
        while len(done) < len(procs):
            failed = []  # those that ended in this round, in rank order
            for i, proc in enumerate(procs):
                if i in done:
                    continue
                try:
                    rc = _wait_once(proc, 0.0)
                except subprocess.TimeoutExpired:
                    continue
                done.add(i)
                _kill_group(proc)  # leftovers the script started in the background
                if rc != 0:
                    failed.append((i, rc))
            if failed:
                for other in procs:
                    _kill_group(other)
                return _failed(_exit_reason(failed[0][1])), failed[0][0]
            time.sleep(0.05)
            if abort.is_set() or time.monotonic() >= deadline:
                for proc in procs:
                    _kill_group(proc)
                return (
                    _CANCELLED
                    if abort.is_set()
                    else _failed(f"timed out after {timeout:g} s (process groups killed)")
                ), 0
    except BaseException:
        for proc in procs:
            _kill_group(proc)
        raise
    return _OK, 0


def imports_changes(
    settings: Settings, target: TargetSettings, device: str, recorded: dict[str, Any]
) -> list[str]:
    """What changed since a capture of ``target`` recorded ``recorded`` (its imports:
    :mod:`~precompile_build.process.imported`), asked in a process started as the
    capture would be now (this interpreter, :func:`script_env`, the project root as
    working directory, the script's folder first on ``sys.path``): the import context
    the record was made in. Returns :func:`~precompile_build.process.imported.changes`'s
    list; a process that fails or prints no answer counts as a change (its last line),
    so the target is captured again."""
    env = script_env(settings, target, device, Path(os.devnull), Path(os.devnull), None)
    request = {
        "module": imported.__file__,
        "script_dir": str(target.script.parent),
        "root": str(settings.root),
        "record": recorded,
    }
    try:
        proc = subprocess.run(
            [sys.executable, program_path("check_imports")],
            input=json.dumps(request),
            cwd=settings.root,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        answer = json.loads((proc.stdout.strip().splitlines() or ["null"])[-1])
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        return [f"the imports could not be checked ({type(e).__name__}: {e})"]
    if proc.returncode != 0 or not isinstance(answer, list):
        last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        return [f"the imports could not be checked ({last[:200]})"]
    return [str(x) for x in answer]


def log_file(work: Path, target: TargetSettings) -> Path:
    """``work/logs/NAME.log`` (its directory created)."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    return work / "logs" / f"{target.name}.log"


def check_pair(src: Path, cache: Path) -> PairCheck:
    """What a script that exited 0 wrote: its :class:`~.pairs.PairInfo`, or why it is unusable."""
    have = [p.name for p in (src, cache) if p.is_file()]
    if not have:
        return PairCheck(
            None,
            "exited 0 but wrote neither half of the pair; did the script run a "
            f"capture with {capture_env.ARTIFACT_PATH} / {capture_env.CACHE_PATH}?",
        )
    if len(have) == 1:
        missing = cache.name if have[0] == src.name else src.name
        return PairCheck(None, f"wrote only {have[0]}, not {missing}: half a pair is unusable")
    try:
        return PairCheck(inspect_pair(src, cache))
    except CaptureError as e:
        return PairCheck(None, f"wrote an invalid pair: {e}")
