"""Error types of the build side, and how its capture warnings are given (at the
user's line; torch's own kept from the user's error filters). Every message begins
with what was being done ("Failed to read `tool.precompile` ...", "Capture of target
'forward' failed ...")."""

from __future__ import annotations

import contextlib
from typing import Any


class PrecompileBuildError(Exception):
    """Base of every error precompile-build raises on purpose."""


class ConfigError(PrecompileBuildError, ValueError):
    """`[tool.precompile]`, a PEP 517 config setting or a `PRECOMPILE_*` variable is
    invalid. Raised before any capture runs."""


class CaptureError(PrecompileBuildError):
    """A capture (a script run by the backend, or the capture API) failed or wrote an
    artifact pair that does not validate.

    Args:
        detail: what went wrong and what to change.
        target: the target's name; the message then begins ``target 'NAME': ``
            (``target 'NAME', WHERE: `` with ``where``).
        where: the part of the target, e.g. ``"Triton kernel 'k'"``.
    Code that catches one reads :attr:`target` (None: not yet known; the caller that
    knows it raises :meth:`for_target`), never the text.
    """

    def __init__(self, detail: str = "", *, target: str | None = None, where: str | None = None):
        self.detail, self.target, self.where = detail, target, where
        super().__init__(self._message())

    def _message(self) -> str:
        return (
            self.detail if self.target is None else in_target(self.target, self.detail, self.where)
        )

    def _fields(self) -> dict:
        return {"target": self.target, "where": self.where}

    def for_target(self, target: str) -> CaptureError:
        """This error, or (when it names no target) one of its type naming ``target``."""
        if self.target is not None:
            return self
        return type(self)(self.detail, **dict(self._fields(), target=target))

    def __reduce__(self):  # pickle (multiprocessing) keeps the fields
        return _rebuild, (type(self), self.detail, self._fields())


def _rebuild(cls, detail, fields):
    return cls(detail, **fields)


def in_target(target: str, text: str, where: str | None = None) -> str:
    """``target 'NAME': text`` (``target 'NAME', where: text``): how every capture
    error and warning about one target begins."""
    return f"target {target!r}{', ' + where if where else ''}: {text}"


class CompilerFailed(CaptureError):
    """The frozen engine's compiler (Inductor) raised while compiling a traced call:
    an upstream compiler bug, not the user's code. A target with `fallback = "eager"`
    is then captured with the eager engine instead, from :attr:`traced` (the trace,
    tracing.TracedCall) and :attr:`real` (the real call's results, or None), so that
    the call is neither traced nor run again."""

    def __init__(
        self,
        detail: str = "",
        *,
        target: str | None = None,
        where: str | None = None,
        traced: Any = None,
        real: Any = None,
    ):
        self.traced, self.real = traced, real
        super().__init__(detail, target=target, where=where)

    def _fields(self) -> dict:
        return dict(super()._fields(), traced=self.traced, real=self.real)

    def with_call(self, traced: Any, real: Any) -> CompilerFailed:
        """This error with the trace and the real call's results it happened on."""
        return type(self)(self.detail, **dict(self._fields(), traced=traced, real=real))


class ScriptFailed(CaptureError):
    """A capture script run by the backend failed (builder/capture_run.py): ``Capture of target
    'NAME' failed: REASON``, then the tail of its log.

    Args:
        detail: the reason (``exited with status 1: RuntimeError: ...``).
        target: the target's name.
        log_tail: text appended to the message (the log's last lines), or "".
        seconds: wall seconds the capture ran, for the build summary.
    """

    def __init__(
        self,
        detail: str = "",
        *,
        target: str | None = None,
        where: str | None = None,
        log_tail: str = "",
        seconds: float | None = None,
    ):
        self.log_tail, self.seconds = log_tail, seconds
        super().__init__(detail, target=target, where=where)

    def _message(self) -> str:
        return f"Capture of target {self.target!r} failed: {self.detail}{self.log_tail}"

    def _fields(self) -> dict:
        return dict(super()._fields(), log_tail=self.log_tail, seconds=self.seconds)


class BuildError(PrecompileBuildError):
    """Packaging failed after the captures: rewriting a wheel or sdist, merging wheels."""


class TracerFallbackWarning(UserWarning):
    """``tracer = "auto"`` traced the call with make_fx because torch.export failed:
    make_fx specialises data-dependent branches to the example's path. The build's
    line for the target says it (builder/capture_run.py), not only the capture log."""


class PythonStateWarning(UserWarning):
    """The captured function changed Python-level state while it was traced (the
    ``random`` module's or numpy's global RNG): Python code runs once, at capture, so
    what it computed (a ``random.random()`` value) is a constant of the pair."""


def warn_at_caller(
    message: str, category: type[Warning] = UserWarning, *, target: str | None = None
) -> None:
    """``warnings.warn(message, category)`` (prefixed :func:`in_target` when ``target``
    is given) attributed to the user's line: the first
    frame outside this package and ``contextlib`` (whose ``__exit__`` runs the end of a
    ``with capture(...)`` block), not the engine line that noticed, however deep that
    is. (Python 3.12's ``skip_file_prefixes`` does this; 3.9-3.11 lack it.)

    Raises:
        ``category(message)`` where the user's warning filters turn it into an error
        (``-W error``): from the user's line, like any warning.
    """
    import os
    import sys
    import warnings

    package = os.path.dirname(os.path.abspath(__file__)) + os.sep
    frame: Any
    frame, level = sys._getframe(1), 2  # stacklevel 2: our caller
    while frame is not None and (
        frame.f_code.co_filename.startswith(package)
        or frame.f_code.co_filename == contextlib.__file__
    ):
        frame, level = frame.f_back, level + 1
    warnings.warn(
        message if target is None else in_target(target, message), category, stacklevel=level
    )


@contextlib.contextmanager
def torch_warnings_shown():
    """While torch traces or compiles, warnings that the user's filters would raise
    (``-W error``, pytest's ``filterwarnings = error``) are shown instead: torch's own
    FutureWarning/DeprecationWarning inside torch.export or Inductor, raised, aborted
    the trace or the compile, which then read as a failed trace or an upstream
    compiler bug. Other filters (``ignore``, ``once``) keep their effect. The user's call
    still runs for real outside this block, under the user's filters, and this
    package's own warnings (:func:`warn_at_caller`) are given outside it.
    A context manager, and a decorator (``@torch_warnings_shown()``)."""
    import warnings

    with warnings.catch_warnings():
        kept = list(warnings.filters)
        warnings.resetwarnings()
        for action, message, category, module, lineno in kept:  # the public API, in order
            # patterns are compiled regexes, or plain strings in the interpreter's defaults
            warnings.filterwarnings(
                "default" if action == "error" else action,  # type: ignore[arg-type]
                getattr(message, "pattern", message or ""),  # type: ignore[arg-type]
                category,  # type: ignore[arg-type]
                getattr(module, "pattern", module or ""),  # type: ignore[arg-type]
                lineno,
                append=True,
            )
        yield
