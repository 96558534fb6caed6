"""What an engine module gives: typed Protocols for :func:`precompile_build.engines.get`.

An engine is a module (frozen.py, eager.py, torch_engine.py) with ``capture_pair``;
mypy checks each module against its Protocol where ``get`` returns it. Three shapes:

- :class:`Engine`: ``capture_pair(fn, args, kwargs, *, target, device, options)``
  (the torch engine);
- :class:`JudgingEngine`: an engine whose ``JUDGES_EAGER_CALL`` is true also takes
  ``real_call=``, the user's call run once for real, and judges the pair by its
  results (frozen, eager); ``engines.judges_eager_call`` tells one apart;
- :class:`FallbackEngine`: the engine ``fallback = "eager"`` captures with when the
  frozen engine's compiler failed: it also takes that engine's trace and real call's
  results (``traced=``, ``real=``) instead of tracing and calling again (eager).

Only type checking imports this module (``engines/__init__.py`` under TYPE_CHECKING):
config parsing and the PEP 517 hooks import the registry and no engine module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from ..capturing.tracing import TracedCall

Pair = tuple[bytes, bytes]
"""``(source_bytes, cache_bytes)``: the two halves of an artifact pair."""

RealCall = Callable[[], Any]
"""Runs the user's call for real, once; returns its result."""


class Engine(Protocol):
    """An engine module: captures one call of ``fn`` into an artifact pair."""

    def capture_pair(
        self,
        fn: Any,
        args: Any,
        kwargs: Any,
        *,
        target: str,
        device: str,
        options: dict[str, Any],
    ) -> Pair: ...


class JudgingEngine(Protocol):
    """An engine that judges its pair by the user's real call (``real_call=``)."""

    JUDGES_EAGER_CALL: bool

    def capture_pair(
        self,
        fn: Any,
        args: Any,
        kwargs: Any,
        *,
        target: str,
        device: str,
        options: dict[str, Any],
        real_call: RealCall | None = None,
    ) -> Pair: ...


class FallbackEngine(Protocol):
    """A judging engine that also serves another engine's trace after its compiler
    failed (``traced=``, ``real=``: see errors.CompilerFailed)."""

    JUDGES_EAGER_CALL: bool

    def capture_pair(
        self,
        fn: Any,
        args: Any,
        kwargs: Any,
        *,
        target: str,
        device: str,
        options: dict[str, Any],
        real_call: RealCall | None = None,
        traced: TracedCall | None = None,
        real: dict[Any, Any] | None = None,
    ) -> Pair: ...
