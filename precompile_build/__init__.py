"""precompile-build: ship ahead-of-time compiled PyTorch functions inside wheels.

The build backend is ``precompile_build.backend``; capture scripts call
:func:`capture`; installed wheels load with ``precompile_runtime.load_packaged``.
Importing this package does not import torch (the build backend imports it), nor
the capture stages: :func:`capture` and :class:`Capture` are imported from api.py on
first use (PEP 562 ``__getattr__``), so the PEP 517 hooks import no engine, tracer or
validation module.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
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

if TYPE_CHECKING:
    from .api import Capture, capture

_FROM_API = ("Capture", "capture")


def __getattr__(name: str) -> Any:
    """``capture`` and ``Capture`` (and the ``api`` module), imported on first use."""
    if name in _FROM_API or name == "api":
        # (import_module: `from . import api` would ask this hook for `api` again)
        api = importlib.import_module(f"{__name__}.api")
        return api if name == "api" else getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
