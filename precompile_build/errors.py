"""Error types of the build side, and how its capture warnings are given (at the
user's line; torch's own kept from the user's error filters). Every message begins
with what was being done ("Failed to read `tool.precompile` ...", "Capture of target
'forward' failed ...")."""

from __future__ import annotations

import contextlib


class PrecompileBuildError(Exception):
    """Base of every error precompile-build raises on purpose."""


class ConfigError(PrecompileBuildError, ValueError):
    """`[tool.precompile]`, a PEP 517 config setting or a `PRECOMPILE_*` variable is
    invalid. Raised before any capture runs."""


class CaptureError(PrecompileBuildError):
    """A capture (a script run by the backend, or the capture API) failed or wrote an
    artifact pair that does not validate."""


class CompilerFailed(CaptureError):
    """The frozen engine's compiler (Inductor) raised while compiling a traced call:
    an upstream compiler bug, not the user's code. A target with `fallback = "eager"`
    is then captured with the eager engine instead."""


class BuildError(PrecompileBuildError):
    """Packaging failed after the captures: rewriting a wheel or sdist, merging wheels."""


class PythonStateWarning(UserWarning):
    """The captured function changed Python-level state while it was traced (the
    ``random`` module's or numpy's global RNG): Python code runs once, at capture, so
    what it computed (a ``random.random()`` value) is a constant of the pair."""


def warn_at_caller(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the user's line: the first
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
    frame, level = sys._getframe(1), 2  # stacklevel 2: our caller
    while frame is not None and (frame.f_code.co_filename.startswith(package)
                                 or frame.f_code.co_filename == contextlib.__file__):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


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
            warnings.filterwarnings("default" if action == "error" else action,
                                    getattr(message, "pattern", message or ""), category,
                                    getattr(module, "pattern", module or ""), lineno, append=True)
        yield
