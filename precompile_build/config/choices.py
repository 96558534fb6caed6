"""The names a capture chooses among (engines, fallbacks, tracers, modes), and how ``engine="auto"`` is resolved.

Here, not in the engines package, so that config parsing (settings.py,
capture_options.py) and the tracers read them without importing any engine module.
"""

from __future__ import annotations

import os
from typing import Literal, Optional, cast, get_args

from precompile_runtime.pair_format import ENGINES, Device, Engine, Tracer  # noqa: F401 - the names, once

from . import capture_env

__all__ = [
    "ENGINES",
    "FALLBACKS",
    "MODES",
    "TRACERS",
    "Device",
    "DeviceChoice",
    "Engine",
    "EngineChoice",
    "Fallback",
    "Tracer",
    "TracerChoice",
    "check_tracer",
    "resolve",
    "torch_has_precompile",
]

EngineChoice = Literal["auto", Engine]
"""``capture(engine=)``: an engine, or ``auto`` (:func:`resolve`)."""
Fallback = Literal["none", "eager"]
FALLBACKS: tuple[Fallback, ...] = get_args(Fallback)
"""Values of ``fallback=`` and of a target's `fallback` key."""
TracerChoice = Literal["auto", Tracer]
TRACERS: tuple[TracerChoice, ...] = get_args(TracerChoice)
"""Values of the `tracer` setting (capturing/tracers.py says what each does)."""
DeviceChoice = Literal["auto", Device]
"""A target's `device`: ``auto`` builds for CUDA where the build host has it."""
MODES = ("default", "max-autotune")
"""Values of the targets' `mode` key and of ``options["mode"]``: ``"max-autotune"``
compiles the frozen engine's kernels as torch.compile's
``mode="max-autotune-no-cudagraphs"`` does (engines/frozen.py ``mode_options``)."""


def check_tracer(tracer: Optional[str]) -> str:
    """``tracer`` (or the ``PRECOMPILE_TRACER`` variable when None/empty), validated.

    Raises:
        ValueError: not one of :data:`TRACERS`.
    """
    value = tracer or os.environ.get(capture_env.TRACER, "").strip() or "auto"
    if value not in TRACERS:
        raise ValueError(
            f"tracer={value!r} is not one of {', '.join(map(repr, TRACERS))} "
            "(from the capture call, the target's `tracer` or PRECOMPILE_TRACER)"
        )
    return value


def torch_has_precompile() -> bool:
    """True when the installed torch has ``torch.compiler.precompile`` (detected by
    feature, never by version string). Imports torch."""
    import torch.compiler

    return callable(getattr(torch.compiler, "precompile", None))


def resolve(engine: str, device: str) -> Engine:
    """The engine to use for a capture on ``device`` (``"cpu"`` or ``"cuda"``).

    ``"auto"`` resolves to, in order: the ``PRECOMPILE_ENGINE`` environment variable
    when set; ``"frozen"`` for CPU captures; ``"torch"`` where the installed torch has
    ``torch.compiler.precompile``; else ``"frozen"``. CPU captures avoid the torch
    engine because torch 2.14.1's CPU pairs rebuild their C++ kernels with the
    compiler at every load (measured: bench/results/torch_engine_load_cpu.md), which
    breaks "serving compiles nothing"; ``engine="torch"`` still selects it.

    Raises:
        ValueError: ``engine`` (or ``PRECOMPILE_ENGINE``) is not ``auto`` or one of
            :data:`ENGINES`.
    """
    import os

    if engine == "auto":
        from .capture_env import ENGINE

        engine = os.environ.get(ENGINE, "").strip() or "auto"
    if engine == "auto":
        if device != "cpu" and torch_has_precompile():
            return "torch"
        return "frozen"
    if engine not in ENGINES:
        raise ValueError(
            f"engine={engine!r} is not one of 'auto', {', '.join(map(repr, ENGINES))} "
            "(from the capture call or PRECOMPILE_ENGINE)"
        )
    return cast(Engine, engine)  # one of ENGINES
