"""A library's own function served by its packaged pair where one serves this host and
this call, and by its own Python otherwise.

::

    from precompile_runtime import packaged

    class TinyMLP(torch.nn.Module):
        @packaged("mlp")                 # the target captured as forward(model, x)
        def forward(self, x):
            return torch.relu(self.fc(x)) * 2

The decorated function is the library's public call, unchanged in what it returns:

- the first call loads the target (``load_packaged(name, package=..., strict=True)``:
  lazily, once per process, thread-safe); where no variant serves this host (or the
  wheel has no such target) the function runs as written, with one warning
  (:class:`RoutedFallbackWarning`), never the pair's slower fallback;
- each call goes through the pair; a call the pair does not cover (another shape,
  dtype, mode or structure than captured: a :class:`~precompile_runtime.CallError`,
  raised before the pair computes anything) runs the function as written, quietly;
- strict (``strict=True``, or ``PRECOMPILE_STRICT=1`` when ``strict`` is None): both
  raise instead;
- inside a capture (the build's capture script: ``PRECOMPILE_TARGET`` is set when
  the library is imported) the decorator returns the function as written, so the
  capture traces the library's own code and nothing of this module; while torch
  compiles or exports, a routed call runs the function as written.

``fn.route`` (a :class:`Route`) counts what served the calls (``served``,
``fallback``) and keeps the reason of the last fallback.
"""

from __future__ import annotations

import functools
import os
import threading
import warnings
from typing import Any, Callable, Optional, TypeVar

from ._env import env_flag
from .errors import CallError, PrecompileLoadError

F = TypeVar("F", bound=Callable[..., Any])
_UNLOADED = object()


class RoutedFallbackWarning(UserWarning):
    """A routed function runs its own Python: its target does not serve this host."""


class Route:
    """Where the calls of one routed function go (``fn.route``)."""

    def __init__(
        self, fn: Callable[..., Any], name: str, package: Optional[str], strict: Optional[bool]
    ):
        self.fn, self.name, self.strict = fn, name, strict
        self.package = package or (getattr(fn, "__module__", None) or "").split(".")[0] or None
        self.served = 0
        """Calls the pair answered."""
        self.fallback = 0
        """Calls the function's own Python answered (no pair for this host, or a call
        the pair does not cover)."""
        self.reason: Optional[str] = None
        """Why the last fallback happened (the load's or the call's error), or None."""
        self._pair: Any = _UNLOADED
        self._lock = threading.Lock()

    def _strict(self) -> bool:
        return self.strict if self.strict is not None else env_flag("PRECOMPILE_STRICT")

    def pair(self) -> Optional[Callable[..., Any]]:
        """The loaded pair, or None where it does not serve this host (loaded once)."""
        if self._pair is _UNLOADED:
            with self._lock:
                if self._pair is _UNLOADED:
                    from .loader import load_packaged

                    try:
                        self._pair = load_packaged(self.name, package=self.package, strict=True)
                    except PrecompileLoadError as e:
                        if self._strict():
                            raise
                        self._pair, self.reason = None, str(e)
                        warnings.warn(
                            f"{self._what()} runs its own Python on this host: {e}",
                            RoutedFallbackWarning,
                            stacklevel=4,
                        )
        pair: Optional[Callable[..., Any]] = self._pair  # (loaded by now: a pair or None)
        return pair

    def _what(self) -> str:
        return (
            f"{getattr(self.fn, '__qualname__', self.fn)!s} (packaged target "
            f"{self.name!r} of {self.package!r})"
        )

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _own_python_only():
            return self.fn(*args, **kwargs)
        pair = self.pair()
        if pair is not None:
            try:
                out = pair(*args, **kwargs)
            except CallError as e:
                if self._strict():
                    raise
                self.reason = str(e)
            else:
                self.served += 1
                return out
        self.fallback += 1
        return self.fn(*args, **kwargs)


def _own_python_only() -> bool:
    """While torch compiles or exports: the function's own code is what is traced."""
    import sys

    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None)
    try:
        return bool(compiler is not None and compiler.is_compiling())
    except Exception:  # pragma: no cover (a torch without it)
        return False


def packaged(
    name: str, *, package: Optional[str] = None, strict: Optional[bool] = None
) -> Callable[[F], F]:
    """Decorate a library function (or method) so that its calls go through the packaged
    target ``name`` where one serves (see the module docstring).

    Args:
        name: the target, as in ``[tool.precompile.targets.NAME]``; its capture must
            have the function's calling convention (a method: ``fn(model, ...)``).
        package: the package whose ``_precompiled/`` holds it (default: the top-level
            package of the function's module).
        strict: raise instead of falling back (None: ``PRECOMPILE_STRICT``).
    Returns:
        the decorator; the decorated function has ``.route`` (:class:`Route`) and
        ``__wrapped__`` (the function as written).
    """

    def decorate(fn: F) -> F:
        if os.environ.get("PRECOMPILE_TARGET"):  # a capture script's process: the
            return fn  # function as written, so the trace reads nothing of this module
        route = Route(fn, name, package, strict)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            return route(args, kwargs)

        call.route = route  # type: ignore[attr-defined]
        # a pair's checks of the code its trace called see through this wrapper (the
        # capture traced the function as written, above; served calls meet ``call``).
        # Itself, not True: functools.wraps copies __dict__ into a wrapper of ``call``
        call.__precompile_routed__ = call  # type: ignore[attr-defined]
        return call  # type: ignore[return-value]

    return decorate
