"""precompile-build: ship ahead-of-time compiled PyTorch functions inside wheels.

The build backend is ``precompile_build.backend``; capture scripts call
:func:`capture`; installed wheels load with ``precompile_runtime.load_packaged``.
Importing this package does not import torch (the build backend imports it).
"""

from __future__ import annotations

from ._version import __version__
from .api import Capture, capture
from .errors import (
    BuildError,
    CaptureError,
    ConfigError,
    PrecompileBuildError,
    PythonStateWarning,
    TracerFallbackWarning,
)

__all__ = [
    "BuildError",
    "Capture",
    "CaptureError",
    "ConfigError",
    "PrecompileBuildError",
    "PythonStateWarning",
    "TracerFallbackWarning",
    "__version__",
    "capture",
]
