"""Build progress on stderr: messages, a live line per running capture, a summary.

Without a terminal (CI, ``pip -v``: stderr is a pipe) a status line per running
target is printed, plain lines only, less and less often: after 2 x :data:`INTERVAL`
seconds, then each time its running time doubles, at most :data:`MAX_GAP` seconds
apart (10, 20, 40, 80, ... s: three lines for a one-minute capture). On a terminal
the running targets are a block of lines redrawn in place about once a second.
Every message goes through :meth:`Progress.say`, so the two never interleave.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Optional

from .results import SummaryRow

INTERVAL = 5.0  # seconds between checks for a status line without a terminal
MAX_GAP = 120.0  # most seconds between two status lines of a target without a terminal
TTY_INTERVAL = 1.0  # seconds between redraws on a terminal
_LINE_CAP = 100  # characters of a log line shown in a status line


# what the warnings module prints: "FILE:LINE: Category: message", the message's
# further lines, then the warned source line indented by two spaces
_WARNING = re.compile(r"^\S.*?:\d+: (\w*Warning): (.*)$")
_WARNING_LINES = 8  # lines searched back from the end for a warning's first line


def last_log_line(path: Path) -> str:
    """The last non-empty line of a log (its last ``\\r`` segment), cut short. A
    warning counts as one line, shown as ``Category: message``: its source line
    (or a multi-line message's later lines) is not the capture's output."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4096))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [ln for ln in (raw.split("\r")[-1].rstrip() for raw in text.splitlines()) if ln.strip()]
    if not lines:
        return ""
    line = lines[-1].strip()
    if lines[-1][:1].isspace():  # an indented line continues the block above it
        for back in lines[-1 : -_WARNING_LINES - 1 : -1]:
            m = _WARNING.match(back)
            if m:
                line = f"{m[1]}: {m[2].strip()}"
                break
    else:
        m = _WARNING.match(lines[-1])
        line = f"{m[1]}: {m[2].strip()}" if m else line
    return line if len(line) <= _LINE_CAP else line[:_LINE_CAP] + "..."


def human_size(n: float) -> str:
    """``n`` bytes as ``185 B``, ``1.2 KiB``, ``3.4 MiB``, ``1.0 GiB`` (powers of 1024)."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class Progress:
    """Status of the captures of one build.

    Args:
        stream: where to write (default ``sys.stderr``).
        live: redraw in place; default: ``stream`` is a terminal and ``TERM`` is
            not ``dumb``. Pass False when other output (verbose logs) shares it.
    """

    def __init__(self, stream: Optional[IO[str]] = None, live: Optional[bool] = None):
        self._stream = stream or sys.stderr
        if live is None:
            live = (
                getattr(self._stream, "isatty", lambda: False)()
                and os.environ.get("TERM") != "dumb"
            )
        self.live = live
        self._lock = threading.Lock()
        self._running: dict[str, tuple[float, str, Path]] = {}
        self._due: dict[str, float] = {}  # no terminal: running time of a target's next line
        self._drawn = 0  # lines of the live block on screen
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._tick, daemon=True, name="precompile-progress")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._clear()

    def say(self, message: str) -> None:
        """Print one message line (above the live block on a terminal)."""
        with self._lock:
            self._clear()
            self._stream.write(message + "\n")
            self._draw()
            self._stream.flush()

    def started(self, name: str, where: str, log: Path) -> None:
        """Target ``name`` is running on ``where`` (``cpu``, ``cuda:1``), logging to ``log``."""
        with self._lock:
            self._running[name] = (time.monotonic(), where, log)
            self._due[name] = 2 * INTERVAL

    def finished(self, name: str) -> None:
        """Target ``name`` is no longer running."""
        with self._lock:
            self._running.pop(name, None)
            self._due.pop(name, None)

    def _lines(self, min_age: Optional[float] = None) -> list[str]:
        """A status line per running target; ``min_age`` None: only those whose next
        line is due (no terminal; the next one is then due at twice the running time)."""
        now, out = time.monotonic(), []
        for name, (start, where, log) in sorted(self._running.items()):
            age = now - start
            if min_age is None and age >= self._due.get(name, 0.0):
                self._due[name] = min(2 * age, age + MAX_GAP)
            elif min_age is None or age < min_age:
                continue
            tail = last_log_line(log)
            out.append(
                f"precompile: {name} on {where}: running {age:.0f} s"
                + (f" | {tail}" if tail else "")
            )
        return out

    def _clear(self) -> None:
        if self.live and self._drawn:
            self._stream.write(f"\x1b[{self._drawn}F\x1b[J")  # up N lines, clear below
            self._drawn = 0

    def _draw(self) -> None:
        if self.live:
            lines = self._lines(0.0)
            width = max(20, _terminal_width() - 1)
            self._stream.write("".join(ln[:width] + "\n" for ln in lines))
            self._drawn = len(lines)

    def _tick(self) -> None:
        interval = TTY_INTERVAL if self.live else INTERVAL
        while not self._stop.wait(interval):
            with self._lock:
                if self.live:
                    self._clear()
                    self._draw()
                else:
                    for line in self._lines():
                        self._stream.write(line + "\n")
                self._stream.flush()


def _terminal_width() -> int:
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns
    except (OSError, ValueError):
        return 100


def summary(rows: Sequence[SummaryRow]) -> str:
    """The end-of-build table: one :class:`~.results.SummaryRow` ``(target, device,
    result, seconds, bytes, peak_memory)`` per target (``peak_memory``: :func:`.capture_stats.read`'s dict, host
    then GPU; may be left off); seconds/bytes/peaks None print as ``-``; a last line says
    what the seconds count (more than a target's own line: the slot, cache and checks)."""
    from ..process.stats import short

    head = ("target", "device", "result", "seconds", "bytes", "peak host/GPU")
    cells = [head] + [
        (
            t,
            d,
            r,
            "-" if s is None else f"{s:.1f}",
            "-" if b is None else human_size(b),
            short(rest[0] if rest else None, human_size),
        )
        for t, d, r, s, b, *rest in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(6)]
    fmt = "".join(f"  {{:{align}{w}}}" for align, w in zip("<<<>>>", widths))
    note = (
        "precompile: seconds: each target's whole time in this build (its wait for a device "
        "slot, the capture cache and the pair's checks included); a target's `ok ... in N s` "
        "line gives its capture script's run alone"
    )
    return "\n".join(["precompile: summary"] + [fmt.format(*c).rstrip() for c in cells] + [note])
