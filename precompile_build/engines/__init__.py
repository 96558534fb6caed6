"""Engines: what turns a captured call into an artifact pair.

Each engine module has ``capture_pair(fn, args, kwargs, *, target, device, options)
-> (source_bytes, cache_bytes)``; one whose ``JUDGES_EAGER_CALL`` is true (frozen,
eager: :func:`judges_eager_call`) also takes ``real_call=``, the user's call run once
for real, and judges the pair by its results. ``interface.py`` has their typed
Protocols (:class:`Engine`, :class:`JudgingEngine`, :class:`FallbackEngine`), which
:func:`get`'s overloads return. :func:`precompile_build.capture` (api.py) takes the
module from :func:`get` (``config/choices.py`` has already resolved ``engine="auto"``)
and writes the two halves atomically. ``torch_engine.available()`` says whether this
torch has ``torch.compiler.precompile``; the frozen and eager engines run on any torch
the project supports.

- ``frozen.py``: Inductor's kernels frozen into the pair (``triton_freeze.py`` takes a
  CUDA kernel's cubin and launch, ``cross_arch.py`` and its worker ``cross_compile.py``
  compile them for the other `cuda-archs`, ``cubins.py`` reads a cubin's target,
  ``kernel_size.py`` strips CPU kernels);
- ``torch_engine.py``: ``torch.compiler.precompile``'s own pair;
- ``eager.py``: the captured ATen graph, no kernels;
- ``codegen.py``: the source half of a frozen or eager pair, from the graph, Inductor's
  wrapper and the serving templates (``precompile_build/templates``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, overload

if TYPE_CHECKING:  # (no engine module at run time: config parsing imports this package)
    from typing_extensions import TypeGuard

    from .interface import Engine, FallbackEngine, JudgingEngine

__all__ = ["get", "judges_eager_call"]


@overload
def get(engine: Literal["frozen"]) -> JudgingEngine: ...
@overload
def get(engine: Literal["eager"]) -> FallbackEngine: ...
@overload
def get(engine: Literal["torch"]) -> Engine: ...
@overload
def get(engine: str) -> Engine | JudgingEngine: ...
def get(engine: str) -> Engine | JudgingEngine:
    """The module implementing ``engine``: ``"frozen"``, ``"eager"`` or ``"torch"``
    (already resolved); ValueError for any other name. Its module is imported here,
    on the first call that asks for it (the PEP 517 hooks import this package)."""
    if engine == "frozen":
        from . import frozen

        judging: JudgingEngine = frozen  # (mypy checks the module against its Protocol)
        return judging
    if engine == "eager":
        from . import eager

        fallback: FallbackEngine = eager  # (mypy checks the module against its Protocol)
        return fallback
    if engine == "torch":
        from . import torch_engine

        plain: Engine = torch_engine  # (mypy checks the module against its Protocol)
        return plain
    raise ValueError(engine)  # pragma: no cover - resolve() rejects these


def judges_eager_call(engine: Engine | JudgingEngine) -> TypeGuard[JudgingEngine]:
    """Whether ``engine`` (from :func:`get`) takes ``real_call=`` and judges its pair by
    the user's real call: its ``JUDGES_EAGER_CALL`` is true (frozen, eager)."""
    return bool(getattr(engine, "JUDGES_EAGER_CALL", False))
