"""Run capture scripts in subprocesses and collect their artifact pairs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Optional

from .errors import CaptureError
from .pairs import PairInfo, inspect_pair
from .settings import Settings, TargetSettings

LOG_TAIL_LINES = 40
_TAIL_BYTES = 64 * 1024
_LINE_CAP = 400  # characters per shown log line
_KILL_GRACE = 5.0  # seconds between SIGTERM and SIGKILL


class CaptureWarning(UserWarning):
    """An optional target was left out of the wheel."""


@dataclass
class CaptureResult:
    """Outcome of one target."""

    name: str
    status: str
    """`ok` or `failed` (an optional target left out; `reason` says why)."""
    required: bool
    device: str
    """Resolved device: `cpu` or `cuda`."""
    seconds: float = 0.0
    reason: Optional[str] = None
    source_path: Optional[Path] = None
    cache_path: Optional[Path] = None
    info: Optional[PairInfo] = None


_cuda_cache: Optional[bool] = None


def cuda_available() -> bool:
    """Whether this build host has a usable CUDA GPU (cached per process).

    ``nvidia-smi -L`` listing a GPU counts; where nvidia-smi is missing but
    ``/dev/nvidiactl`` exists, asks ``torch.cuda.is_available()`` in a subprocess.
    ``CUDA_VISIBLE_DEVICES`` set to ``""`` or ``-1`` means no.
    """
    global _cuda_cache
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    if _cuda_cache is None:
        _cuda_cache = _probe_cuda()
    return _cuda_cache


def _probe_cuda() -> bool:
    cmd = None
    if shutil.which("nvidia-smi"):
        cmd = ["nvidia-smi", "-L"]
    elif os.path.exists("/dev/nvidiactl"):
        cmd = [sys.executable, "-c",
               "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"]
    if cmd is None:
        return False
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and (cmd[0] != "nvidia-smi" or b"GPU" in proc.stdout)


def resolve_device(device: str) -> Optional[str]:
    """`cpu`/`cuda` for a configured device; None for `cuda` on a host without CUDA."""
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        return None
    return device


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)  # pragma: no cover


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (long lines cut), for error messages."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    out = [ln if len(ln) <= _LINE_CAP else ln[:_LINE_CAP] + " [...]"
           for ln in text.splitlines()[-lines:]]
    return "\n".join(out) or "(empty log)"


def _kill_group(proc: subprocess.Popen) -> None:
    """End the script and every process it started in its session."""
    for sig, wait in ((signal.SIGTERM, _KILL_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if wait is None:
            break
        try:
            proc.wait(timeout=wait)
            # the leader is gone; SIGKILL what is left of its group
        except subprocess.TimeoutExpired:
            pass
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover
        pass


def _pump(stream: IO[bytes], log: IO[bytes], echo: bool) -> None:
    for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
        log.write(chunk)
        if echo:
            sys.stderr.buffer.write(chunk)
            sys.stderr.flush()


def _exit_reason(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name} ({-rc})"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


def _script_env(settings: Settings, target: TargetSettings, device: str,
                src: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(target.env)
    # The script imports the library being built: put its source root first.
    base = str(settings.package_dir.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (base, env.get("PYTHONPATH")) if p)
    env.update(PRECOMPILE_TARGET=target.name, PRECOMPILE_ARTIFACT_PATH=str(src),
               PRECOMPILE_CACHE_PATH=str(cache), PRECOMPILE_DEVICE=device)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _run_script(settings: Settings, target: TargetSettings, device: str,
                work: Path, verbose: bool) -> tuple[Optional[str], Path, Path, Path]:
    """Run one script. Returns (failure reason or None, source, cache, log path)."""
    out = work / "pairs" / target.name
    out.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    src, cache = out / f"{target.name}.py", out / f"{target.name}.cache"
    log_path = work / "logs" / f"{target.name}.log"
    env = _script_env(settings, target, device, src, cache)
    cmd = [sys.executable, str(target.script), *target.args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=settings.root, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)
        pump = threading.Thread(target=_pump, args=(proc.stdout, log, verbose), daemon=True)
        pump.start()
        reason = None
        try:
            rc = proc.wait(timeout=target.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            reason = f"timed out after {target.timeout:g} s (process group killed)"
        except BaseException:  # Ctrl-C: end the script's tree, then re-raise
            _kill_group(proc)
            raise
        else:
            _kill_group(proc)  # leftovers the script started in the background
            if rc != 0:
                reason = _exit_reason(rc)
        pump.join(timeout=10)
        proc.stdout.close()  # type: ignore[union-attr]
    return reason, src, cache, log_path


def run_target(settings: Settings, target: TargetSettings, work: Path,
               *, verbose: bool = False) -> CaptureResult:
    """Run one target's capture script and validate its pair.

    Args:
        settings: the project's settings.
        target: the target to run.
        work: a fresh temp directory of this build (pairs and logs go under it).
        verbose: stream the script's output to stderr.
    Returns:
        a :class:`CaptureResult`: ``ok``, or ``failed`` for an optional target.
    Raises:
        CaptureError: a required target (or any target with ``strict``) failed;
            names the target, the reason and the last lines of its log.
    """
    required = target.required or settings.strict
    device = resolve_device(target.device)
    if device is None:
        reason = "needs CUDA (device = \"cuda\") but this build host has no CUDA GPU"
        if required:
            reason += ("; build on a GPU host, or set `required = false` to leave it "
                       "out of wheels built elsewhere")
        return _fail_or_skip(target, required, "cuda", reason, None, 0.0)
    start = time.monotonic()
    reason, src, cache, log_path = _run_script(settings, target, device, work, verbose)
    seconds = time.monotonic() - start
    info = None
    if reason is None:
        have = [p.name for p in (src, cache) if p.is_file()]
        if not have:
            reason = ("exited 0 but wrote neither half of the pair; did the script run "
                      "a capture with PRECOMPILE_ARTIFACT_PATH / PRECOMPILE_CACHE_PATH?")
        elif len(have) == 1:
            missing = cache.name if have[0] == src.name else src.name
            reason = f"wrote only {have[0]}, not {missing}: half a pair is unusable"
        else:
            try:
                info = inspect_pair(src, cache)
            except CaptureError as e:
                reason = f"wrote an invalid pair: {e}"
    if reason is not None:
        return _fail_or_skip(target, required, device, reason, log_path, seconds)
    sizes = f"source {_size(src.stat().st_size)}, cache {_size(cache.stat().st_size)}"
    print(f"precompile: {target.name}: ok on {device} in {seconds:.1f} s "
          f"({info.engine}; {sizes})", file=sys.stderr, flush=True)  # type: ignore[union-attr]
    return CaptureResult(target.name, "ok", target.required, device, seconds,
                         None, src, cache, info)


def _fail_or_skip(target: TargetSettings, required: bool, device: str, reason: str,
                  log_path: Optional[Path], seconds: float) -> CaptureResult:
    if required:
        tail = ""
        if log_path is not None:
            tail = (f"\nlast {LOG_TAIL_LINES} lines of {log_path}:\n"
                    + log_tail(log_path))
        raise CaptureError(f"Capture of target {target.name!r} failed: {reason}" + tail)
    print(f"precompile: {target.name}: left out ({reason})", file=sys.stderr, flush=True)
    warnings.warn(f"optional target {target.name!r} left out of the wheel: {reason}",
                  CaptureWarning, stacklevel=3)
    return CaptureResult(target.name, "failed", False, device, seconds, reason)


def run_captures(settings: Settings, work: Path,
                 *, verbose: Optional[bool] = None) -> list[CaptureResult]:
    """Run every selected target in order (see :func:`run_target`).

    Args:
        settings: resolved settings; ``settings.selected`` names the targets.
        work: fresh temp directory for pairs and logs (``work/logs/NAME.log``).
        verbose: default ``settings.verbose``.
    Returns:
        one :class:`CaptureResult` per selected target.
    Raises:
        CaptureError: the first required target that failed.
    """
    verbose = settings.verbose if verbose is None else verbose
    return [run_target(settings, settings.targets[n], Path(work), verbose=verbose)
            for n in settings.selected]
