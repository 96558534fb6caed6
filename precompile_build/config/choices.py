"""The names a capture chooses among (engines, fallbacks, tracers, modes), and how ``engine="auto"`` is resolved.

Here, not in the engines package, so that config parsing (settings.py,
capture_options.py) and the tracers read them without importing any engine module.
"""

from __future__ import annotations

ENGINES = ("frozen", "torch", "eager")
FALLBACKS = ("none", "eager")
"""Values of ``fallback=`` and of a target's `fallback` key."""
TRACERS = ("auto", "export", "export-strict", "make_fx")
"""Values of the `tracer` setting (capturing/tracers.py says what each does)."""
MODES = ("default", "max-autotune")
"""Values of the targets' `mode` key and of ``options["mode"]``: ``"max-autotune"``
compiles the frozen engine's kernels as torch.compile's
``mode="max-autotune-no-cudagraphs"`` does (engines/frozen.py ``mode_options``)."""
MODE_ENV = "PRECOMPILE_MODE"
"""The variable the build sets for a capture script from the target's resolved `mode`
(also the `mode` override's): a capture's ``options["mode"]`` where it gives none."""


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
