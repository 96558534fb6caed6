"""Engines: what turns a captured call into an artifact pair.

Each engine module exposes ``capture_pair(fn, args, kwargs, *, target, device,
options) -> (source_bytes, cache_bytes)``; :func:`precompile_build.capture` picks one and
writes the two halves atomically. ``available()`` says whether an engine can run here.
"""

from __future__ import annotations

ENGINES = ("frozen", "torch", "eager")
TRACERS = ("auto", "export", "export-strict", "make_fx")
"""Values of the `tracer` setting (tracers.py says what each does). Defined here, not
in tracers.py, so that config parsing (settings.py) imports no engine module."""


def torch_has_precompile() -> bool:
    """True when the installed torch has ``torch.compiler.precompile`` (detected by
    feature, never by version string). Imports torch."""
    import torch.compiler

    return callable(getattr(torch.compiler, "precompile", None))


def resolve(engine: str, device: str) -> str:
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
        engine = os.environ.get("PRECOMPILE_ENGINE", "").strip() or "auto"
    if engine == "auto":
        if device != "cpu" and torch_has_precompile():
            return "torch"
        return "frozen"
    if engine not in ENGINES:
        raise ValueError(
            f"engine={engine!r} is not one of 'auto', {', '.join(map(repr, ENGINES))} "
            "(from the capture call or PRECOMPILE_ENGINE)"
        )
    return engine


def get(engine: str):
    """The module implementing ``engine`` (already resolved)."""
    if engine == "frozen":
        from . import frozen as mod
    elif engine == "eager":
        from . import eager as mod
    elif engine == "torch":
        from . import torch_engine as mod
    else:  # pragma: no cover - resolve() rejects these
        raise ValueError(engine)
    return mod
