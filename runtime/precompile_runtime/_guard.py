"""The serving guard: while it is on, anything that would compile raises
:class:`~precompile_runtime.errors.ServingCompileError`.

It is on when the environment has ``PRECOMPILE_NO_COMPILE=1`` (or ``true``/``yes``/``on``,
any case; see :func:`precompile_runtime._env.env_flag`; read at each call,
so it is process-wide and inherited by child processes) or inside
:func:`no_compilation` (process-wide, all threads, nestable; it does not change the
environment of child processes).

How: the entry points that compile are wrapped; the wrappers pass straight through
while the guard is off. Wrapped, where they exist:

- ``torch.compile`` and ``torch._dynamo.optimize`` (dynamo tracing + backend compile),
- ``torch._inductor.compile_fx.compile_fx`` / ``compile_fx_inner`` (inductor lowering;
  dynamo's ``inductor`` backend looks ``compile_fx`` up at call time, so it is caught),
- ``triton.compile``, ``triton.compiler.compile``, ``triton.compiler.compiler.compile``
  (kernel compile, including autotuning's precompile),
- ``torch.utils.cpp_extension.load`` / ``load_inline`` (C++/CUDA extension builds),
- ``torch._inductor.cpp_builder.run_compile_cmd`` (every C++ compile of Inductor's
  ``CppBuilder``: what torch 2.14's own ``torch.compiler.precompile.load`` runs for CPU
  pairs, whose cache does not hold the compiled kernels).

Nothing here imports torch or triton. A module already imported is patched when the
guard is installed; one imported later is patched right after its import by a
``sys.meta_path`` hook (:class:`_PatchOnImport`). Installing happens on the first
:func:`no_compilation`, on ``import precompile_runtime`` when the variable is set, and
on :func:`~precompile_runtime.load_packaged` when the variable is set.

Limits: code that bound one of these functions by name before the guard was
installed (``from torch import compile``) keeps the unwrapped function; an error
raised inside a dynamo backend may reach the caller wrapped by dynamo
(``BackendCompilerFailed``) with the :class:`ServingCompileError` as its cause.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import sys
import threading
from collections.abc import Iterator
from typing import Any, Callable

from ._env import env_flag
from .errors import ServingCompileError

ENV = "PRECOMPILE_NO_COMPILE"

# module name -> attribute paths (inside that module) to wrap once it is imported
_TARGETS: dict[str, tuple[str, ...]] = {
    "torch": ("compile",),
    "torch._dynamo": ("optimize",),
    "torch._inductor.compile_fx": ("compile_fx", "compile_fx_inner"),
    "torch.utils.cpp_extension": ("load", "load_inline"),
    "torch._inductor.cpp_builder": ("run_compile_cmd",),
    "triton": ("compile",),
    "triton.compiler": ("compile",),
    "triton.compiler.compiler": ("compile",),
}

_lock = threading.RLock()
_depth = 0  # nesting depth of no_compilation(), all threads together
_installed = False
_MARK = "__precompile_guarded__"


def guard_active() -> bool:
    """True while the serving guard is on (``PRECOMPILE_NO_COMPILE=1`` or inside
    :func:`no_compilation`).

    Raises:
        ValueError: ``PRECOMPILE_NO_COMPILE`` has a value that is not a boolean.
    """
    return _depth > 0 or env_flag(ENV)


def _wrap(fn: Callable[..., Any], what: str) -> Callable[..., Any]:
    if getattr(fn, _MARK, False):
        return fn

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if guard_active():
            raise ServingCompileError(
                f"{what} was called while the serving guard is on "
                f"({ENV}=1 or precompile_runtime.no_compilation()): serving must compile "
                "nothing. Load the precompiled target with precompile_runtime.load_packaged "
                "on a host that matches one of its variants, or turn the guard off."
            )
        return fn(*args, **kwargs)

    setattr(guarded, _MARK, True)
    return guarded


def _patch_module(name: str) -> None:
    module = sys.modules.get(name)
    if module is None:
        return
    for attr in _TARGETS.get(name, ()):
        fn = getattr(module, attr, None)
        if callable(fn) and not getattr(fn, _MARK, False):
            try:
                setattr(module, attr, _wrap(fn, f"{name}.{attr}"))
            except (AttributeError, TypeError):  # pragma: no cover - read-only module
                pass


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then wraps the module's compile entry points."""

    def __init__(self, inner: Any, name: str) -> None:
        self._inner = inner
        self._name = name

    def create_module(self, spec: Any) -> Any:
        create = getattr(self._inner, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _patch_module(self._name)

    def __getattr__(self, attr: str) -> Any:  # get_source, get_code, is_package, ...
        return getattr(self._inner, attr)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """``sys.meta_path`` hook: watches the modules of :data:`_TARGETS` only."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, fullname)
                return spec
        return None


def install() -> None:
    """Wrap the compile entry points now (modules already imported) and on import
    (the rest). Idempotent; imports nothing."""
    global _installed
    with _lock:
        if _installed:
            return
        if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
            sys.meta_path.insert(0, _PatchOnImport())
        for name in _TARGETS:
            _patch_module(name)
        _installed = True


def install_if_env() -> None:
    """:func:`install` when ``PRECOMPILE_NO_COMPILE`` is on (ValueError: not a boolean)."""
    if env_flag(ENV):
        install()


@contextlib.contextmanager
def no_compilation() -> Iterator[None]:
    """Context manager: inside it, compiling raises ``ServingCompileError``.

    Process-wide (every thread sees it while any thread is inside), nestable.
    Compile entry points: see this module's docstring. Yields None.
    """
    global _depth
    install()
    with _lock:
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
