"""Engines: what turns a captured call into an artifact pair.

Each engine module exposes ``capture_pair(fn, args, kwargs, *, target, device,
options) -> (source_bytes, cache_bytes)``; :func:`precompile_build.capture` picks one and
writes the two halves atomically. ``available()`` says whether an engine can run here.
"""

from __future__ import annotations

ENGINES = ("frozen", "torch", "eager")


def torch_has_precompile() -> bool:
    """True when the installed torch has ``torch.compiler.precompile`` (detected by
    feature, never by version string). Imports torch."""
    import torch.compiler

    return callable(getattr(torch.compiler, "precompile", None))


def resolve(engine: str) -> str:
    """Map ``"auto"`` to ``"torch"`` where torch has precompile, else ``"frozen"``.

    Raises:
        ValueError: ``engine`` is not ``auto`` or one of :data:`ENGINES`.
    """
    if engine == "auto":
        return "torch" if torch_has_precompile() else "frozen"
    if engine not in ENGINES:
        raise ValueError(
            f"engine={engine!r} is not one of 'auto', {', '.join(map(repr, ENGINES))}"
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
