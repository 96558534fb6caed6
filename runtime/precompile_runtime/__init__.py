"""precompile-runtime: load the precompiled artifacts a wheel carries.

Importing this package does not import torch; torch is imported only when a pair
is loaded (or when the serving guard has to patch it).

Public API:

- :func:`load_packaged` -- the compiled callable of a packaged target.
- :func:`packaged` -- a decorator routing a library's own function through its packaged
  target where one serves this host and call, and its own Python otherwise.
- :func:`no_compilation` -- serving guard: compiling raises :class:`ServingCompileError`
  (also on, process-wide and in child processes, with ``PRECOMPILE_NO_COMPILE=1``).
- the errors (all subclasses of :class:`PrecompileLoadError`) and
  the warnings :class:`HostMismatchWarning`, :class:`StaleArtifactWarning`,
  :class:`CudaGraphWarning`, :class:`PtxJitWarning` and :class:`CacheSecurityWarning`.
"""

from __future__ import annotations

from ._guard import guard_active, no_compilation
from ._version import __version__
from .errors import (
    CacheDirNotExecutableError,
    CacheSecurityWarning,
    CallError,
    CudaGraphWarning,
    HostMismatchError,
    HostMismatchWarning,
    IntegrityError,
    LoadOptionError,
    ManifestError,
    PackageChangedError,
    PairFormatError,
    PrecompileLoadError,
    PtxJitWarning,
    ServingCompileError,
    StaleArtifactError,
    StaleArtifactWarning,
    TargetNotFoundError,
)
from .loader import load_packaged
from .routed import RoutedFallbackWarning, packaged

__all__ = [
    "CacheDirNotExecutableError",
    "CacheSecurityWarning",
    "CallError",
    "CudaGraphWarning",
    "HostMismatchError",
    "HostMismatchWarning",
    "IntegrityError",
    "LoadOptionError",
    "ManifestError",
    "PackageChangedError",
    "PairFormatError",
    "PrecompileLoadError",
    "PtxJitWarning",
    "RoutedFallbackWarning",
    "ServingCompileError",
    "StaleArtifactError",
    "StaleArtifactWarning",
    "TargetNotFoundError",
    "__version__",
    "guard_active",
    "load_packaged",
    "no_compilation",
    "packaged",
]

# PRECOMPILE_NO_COMPILE=1 in the environment: arm the guard now (cheap: it only adds
# an import hook until torch is imported).
from . import _guard as _g  # noqa: E402

try:
    _g.install_if_env()
except ValueError:  # not a boolean: arm anyway; load_packaged and any compile say why
    _g.install()
del _g
