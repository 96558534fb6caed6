"""What a trace assumed of Python state: recorded at capture, checked by every call.

A trace runs the function's Python once; whatever plain value that code read is built
into the graph: peft's ``_disable_adapters`` and ``scaling`` dicts, a config's
``output_hidden_states``, a module-level ``SCALES = {...}``, and which module hooks
were there to run. torch.compile guards on such reads (Dynamo's guards on sources like
``L['self'].lora_A['default'].scaling['default']``) and recompiles when they change; a
pair cannot recompile, so it records them here and its driver refuses a call whose
state differs (templates/assumed_state.py, copied into the pair: the same encoding).

Recorded, in ``PRECOMPILE_METADATA["assumed"]``:

- ``reads``: every attribute of a plain value (templates' ``state_value``: scalars,
  short tuples/lists/dicts/sets of them) that the trace read on a submodule of a model
  argument, or on a plain object one attribute away from one (a config), found by
  recording ``__getattribute__`` of ``nn.Module`` and of those objects' classes while
  the tracer runs the function: instance attributes and class attributes
  (``class M: SCALES = {...}``) alike. A module hook's own state counts as such an
  object: a callable object's attributes (``Scale(2.0)`` registered as a forward hook)
  and a bound method's ``self``'s, addressed as the hook's position in its dict
  (chain ``["_forward_hooks[0]"]``; the hooks' names are checked in order, below).
  Properties are not recorded (the attributes a property reads are). Values the
  function itself changes are state, not assumptions (python_state.py warns about
  them), and are left out; ``training`` has its own check (the driver's
  ``_check_training``).
- ``hooks``: the forward, forward-pre, backward and backward-pre hooks of every
  submodule of the model arguments and torch's global module hooks, by name
  (``module.qualname``), as the call found them: the graph ran exactly these.
- ``globals``: plain module-level values that the reached user functions name
  (python_state.py's walk), in modules a serving process can import (not the capture
  script's ``__main__``, whose values are the pair's constants).

Not recorded (docs/assumed_state.md, "What is not checked"): reads through ``vars(obj)`` or
``obj.__dict__[...]``, objects more than one attribute away from a module, library
modules' globals (transformers' own tables), and values of other types (enums,
objects: their identity cannot be compared across processes).
"""

from __future__ import annotations

import contextlib
import copy
import types
from collections.abc import Iterator
from typing import Any, Callable

import torch

from precompile_runtime.pair_format import AssumedState

from ..templates.state_values import HOOK_KINDS, global_hooks, module_hooks, state_value
from . import python_state

_NOT_SET = object()


def _internals() -> frozenset[str]:
    # nn.Module's own bookkeeping (parameters, hooks, the train flag, its class-level
    # flags) and dunder names
    flags = {
        k for k, v in vars(torch.nn.Module).items() if state_value(v) is not None
    }  # dump_patches, ...
    return (
        frozenset(vars(torch.nn.Module())) | frozenset(flags) | {"__dict__", "__class__", "forward"}
    )


def _class_value(cls: type, name: str) -> Any:
    """What ``name`` is on ``cls`` (the first class of its MRO that has it)."""
    for k in cls.__mro__:
        if name in k.__dict__:
            return k.__dict__[name]
    return _NOT_SET


def _current(obj: Any, name: str) -> Any:
    """``obj.name`` as an instance attribute, else as a class attribute."""
    d = vars(obj)
    return d[name] if name in d else _class_value(type(obj), name)


def _walk(module) -> Iterator[tuple[str, Any]]:
    """``(path, submodule)`` pre-order, the root as ``""``: the driver's walk."""
    stack = [("", module)]
    while stack:
        path, m = stack.pop()
        yield path, m
        stack.extend(
            (f"{path}.{k}" if path else k, c)
            for k, c in reversed(list(m._modules.items()))
            if c is not None
        )


def _hook_holders(module) -> Iterator[tuple[str, Any]]:
    """``(chain step, object)`` for the hooks of ``module`` that hold state of their
    own: a callable object (not a function) or a bound method's ``self`` that is not a
    module (a module's attributes are recorded as a module's). The step is
    ``"<hook dict>[<position>]"``, which templates/assumed_state.py resolves alike."""
    for _kind, attr in HOOK_KINDS:
        for k, hook in enumerate((module.__dict__.get(attr) or {}).values()):
            holder = hook.__self__ if isinstance(hook, types.MethodType) else hook
            if isinstance(
                holder, (types.FunctionType, types.BuiltinFunctionType, type, torch.nn.Module)
            ):
                continue
            if isinstance(getattr(holder, "__dict__", None), dict):
                yield f"{attr}[{k}]", holder


def _plain_object(v: Any) -> bool:
    """An instance of a Python class whose attributes a trace may read (a config)."""
    d = getattr(v, "__dict__", None)
    return (
        isinstance(d, dict)
        and not isinstance(v, (type, torch.nn.Module, torch.Tensor))
        and not callable(v)
        and type(v).__module__ not in ("builtins", "types")
    )


class Recorder:
    """The reads of one trace: ``{(model arg, path, chain): {attribute: (kind, value)}}``."""

    def __init__(self, modules: list) -> None:
        self.skip = _internals()
        self.where: dict[int, tuple[int, str, tuple[str, ...]]] = {}
        self.objects: list[Any] = []  # keeps every id in `where` alive and unique
        self.classes: dict[type, None] = {}
        self.reads: dict[tuple[int, str, tuple[str, ...]], dict[str, Any]] = {}
        for i, m in enumerate(modules):
            for path, sub in _walk(m):
                if id(sub) in self.where:
                    continue
                self.where[id(sub)] = (i, path, ())
                self.objects.append(sub)
                held = [
                    (k, v) for k, v in vars(sub).items() if k not in self.skip and _plain_object(v)
                ]
                for k, v in held + list(_hook_holders(sub)):
                    if id(v) not in self.where:
                        self.where[id(v)] = (i, path, (k,))
                        self.objects.append(v)
                        self.classes[type(v)] = None

    def note(self, obj: Any, name: str, value: Any) -> None:
        """Record that the trace read ``obj.name`` (== ``value``): the first read counts."""
        where = self.where.get(id(obj))
        if where is None or name in self.skip:
            return
        attrs = self.reads.setdefault(where, {})
        if name in attrs:
            return
        d = object.__getattribute__(obj, "__dict__")
        if d.get(name, _NOT_SET) is not value and (
            name in d or _class_value(type(obj), name) is not value
        ):
            return  # a property's result, or what __getattr__ made

        enc = state_value(value)
        attrs[name] = None if enc is None else (enc[0], copy.deepcopy(enc[1]))

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        """Record the attribute reads on the models (and the plain objects they hold)
        while the block runs: ``nn.Module.__getattribute__`` and those objects'
        classes' ``__getattribute__`` are wrapped for the block's duration and restored
        after it. The tracers enter it around each run of the function's Python that
        they make, never around TorchDynamo's (which reads the bytecode and refuses a
        class with a Python ``__getattribute__``; its strict export re-runs the function
        eagerly, under this block). A class whose ``__getattribute__`` cannot be set (a C
        type) is not recorded."""
        if not self.where:
            yield
            return
        note, skip = self.note, self.skip

        def wrapping(orig: Callable) -> Callable:
            def __getattribute__(obj, name, _orig=orig):
                value = _orig(obj, name)
                if name not in skip:
                    note(obj, name, value)
                return value

            return __getattribute__

        patched = []
        try:
            for cls in [torch.nn.Module, *self.classes]:
                own = cls.__dict__.get("__getattribute__", _NOT_SET)
                try:
                    cls.__getattribute__ = wrapping(cls.__getattribute__)  # type: ignore[method-assign]
                except (TypeError, AttributeError):
                    continue
                patched.append((cls, own))
            yield
        finally:
            for cls, own in reversed(patched):
                if own is _NOT_SET:
                    delattr(cls, "__getattribute__")
                else:
                    cls.__getattribute__ = own

    def entries(self) -> list[list]:
        """The recorded reads whose values are still the ones read: ``[[model arg, path,
        chain, [[attribute, kind, value], ...]], ...]`` (the metadata's ``reads``)."""
        objects = {w: o for o, w in ((o, self.where[id(o)]) for o in self.objects)}
        out = []
        for where, attrs in sorted(self.reads.items(), key=lambda kv: kv[0]):
            obj = objects[where]
            kept = []
            for name, enc in sorted(attrs.items()):
                if enc is None:
                    continue
                now = state_value(_current(obj, name))
                if now is not None and list(now) == list(enc):  # the function did not change it
                    kept.append([name, enc[0], enc[1]])
            if kept:
                out.append([where[0], where[1], list(where[2]), kept])
        return out


def hooks_record(modules: list) -> dict:
    """The hooks a call of ``modules`` runs now: ``{"modules": [[model arg, path, kind,
    [names]]], "global": [[kind, [names]]]}`` (the metadata's ``hooks``)."""
    out = []
    for i, m in enumerate(modules):
        seen: set[int] = set()
        for path, sub in _walk(m):
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            out += [[i, path, kind, names] for kind, names in module_hooks(sub)]
    return {"modules": out, "global": [[k, names] for k, names in global_hooks()]}


def global_values(fn: Callable, args: tuple, kwargs: dict) -> dict[tuple[str, str], tuple]:
    """``{(module, name): (kind, value)}`` of the plain module-level values that the
    user functions ``fn`` reaches name (python_state.py's walk), in importable modules."""
    out: dict[tuple[str, str], tuple] = {}
    try:
        functions = python_state.reached(fn, args, kwargs)
    except Exception:  # noqa: BLE001 - an object that cannot be walked: nothing recorded, as python_state
        return out
    for f in functions:
        module = f.__globals__.get("__name__")
        if not isinstance(module, str) or module == "__main__":
            continue
        for name in sorted(python_state.global_names(f)):
            v = f.__globals__.get(name, _NOT_SET)
            enc = None if v is _NOT_SET else state_value(v)
            if enc is not None:
                out.setdefault((module, name), (enc[0], copy.deepcopy(enc[1])))
    return out


def metadata(
    rec: Recorder, hooks: dict, globals_before: dict, fn: Callable, args: tuple, kwargs: dict
) -> AssumedState:
    """``PRECOMPILE_METADATA["assumed"]``: the reads of ``rec``, the ``hooks`` the call
    found and the module-level values of ``globals_before`` that the call left as they
    were (see the module docstring)."""
    now = global_values(fn, args, kwargs)
    kept = [
        [m, n, enc[0], enc[1]]
        for (m, n), enc in sorted(globals_before.items())
        if list(now.get((m, n), ())) == list(enc)
    ]
    return {"reads": rec.entries(), "hooks": hooks, "globals": kept}
