"""Error types of the build side. Every message begins with what was being done
("Failed to read `tool.precompile` ...", "Capture of target 'forward' failed ...")."""

from __future__ import annotations


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
