"""Tensors a model holds twice: as a registered parameter/buffer and through a plain
attribute, list, dict or object.

transformers' ``TorchExportableModuleWithStaticCache`` registers its cache tensors as
buffers (``key_cache_0``, ...) and keeps them in its ``static_cache`` object, which
its forward updates in place. The trace swaps each module's parameters and buffers
for the graph's inputs (``torch.nn.utils.stateless._reparametrize_module``), which
re-points the registered names only: the plain references still point at the
original tensors, and the graph would read and write them as constants.

:func:`find_aliases` walks the module arguments' plain attributes (and the lists,
dicts and objects they hold) for tensors that are a lifted parameter/buffer or a
tensor argument (the same object, or a view of its storage); :func:`repointed`
re-points them at the swapped-in graph inputs for the duration of the trace (a view
as the same view of the input), so the graph reads and writes the input, and what it
writes lands in the serving model's buffer. Tuples cannot be re-pointed (immutable):
a tensor aliased through one stays a constant of the graph (graph_attrs.py refuses
it if written).
"""

from __future__ import annotations

import contextlib
import types
from dataclasses import dataclass
from typing import Any

import torch

_SKIP = frozenset(
    {
        "_parameters",
        "_buffers",
        "_modules",
        "_non_persistent_buffers_set",
        "_forward_hooks",
        "_forward_pre_hooks",
        "_backward_hooks",
        "_state_dict_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
    }
)


@dataclass
class Alias:
    """One plain reference to an input tensor: ``holder[key]`` (a list or dict) or
    ``holder.key`` (an object's ``__dict__``) is flat input ``index`` itself
    (``view`` None) or the view ``(size, stride, offset from the input's offset)``."""

    holder: Any
    key: Any
    attr: bool
    index: int
    view: tuple | None


def find_aliases(
    modules: list, sources: list, *, max_depth: int = 6, max_objects: int = 20000
) -> list[Alias]:
    """The plain references to ``sources`` (the flat inputs: lifted parameters/buffers,
    then the tensor arguments) reachable from the nn.Modules ``modules`` through their
    non-registered attributes, ``max_depth`` steps into lists, dicts and objects."""
    by_id = {id(t): i for i, t in enumerate(sources)}
    by_storage: dict[int, int] = {}
    for i, t in enumerate(sources):
        if t.numel() and t.device.type != "meta":
            by_storage.setdefault(t.untyped_storage().data_ptr(), i)
    found: list[Alias] = []
    seen: set[int] = set()
    todo: list[tuple[Any, int]] = []
    for m in modules:
        todo.extend((sub, 0) for sub in m.modules())
    while todo and len(seen) < max_objects:
        obj, depth = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, dict):
            slots, attr = list(obj.items()), False
        elif isinstance(obj, list):
            slots, attr = list(enumerate(obj)), False
        elif isinstance(obj, tuple):
            slots, attr = [], False
            todo.extend((v, depth + 1) for v in obj if depth < max_depth)
        else:
            d = getattr(obj, "__dict__", None)
            if not isinstance(d, dict):
                continue
            module = isinstance(obj, torch.nn.Module)
            slots, attr = [(k, v) for k, v in d.items() if not (module and k in _SKIP)], True
        for key, v in slots:
            if isinstance(v, torch.Tensor):
                alias = _alias_of(v, by_id, by_storage, sources)
                if alias is not None:
                    found.append(Alias(obj, key, attr, *alias))
            elif depth < max_depth and not isinstance(
                v,
                (
                    torch.nn.Module,
                    types.ModuleType,
                    type,
                    types.FunctionType,
                    types.MethodType,
                    str,
                    bytes,
                    int,
                    float,
                    bool,
                    type(None),
                ),
            ):
                todo.append((v, depth + 1))
    return found


def _alias_of(t, by_id, by_storage, sources):
    i = by_id.get(id(t))
    if i is not None:
        return i, None
    if not t.numel() or t.device.type == "meta":
        return None
    i = by_storage.get(t.untyped_storage().data_ptr())
    if i is None:
        return None
    return i, (tuple(t.shape), tuple(t.stride()), t.storage_offset() - sources[i].storage_offset())


@contextlib.contextmanager
def repointed(aliases: list[Alias], flat: list):
    """Inside: each alias points at its input in ``flat`` (the trace's inputs, in the
    order of ``sources``); the original references are put back on exit."""
    saved = []
    try:
        for a in aliases:
            t = flat[a.index]
            if a.view is not None:
                size, stride, offset = a.view
                # the trace's inputs are fresh clones (layouts.example_clone): their
                # storage starts at the tensor, so the offset is the view's own
                t = t.as_strided(size, stride, offset)
            if a.attr:
                saved.append((a, a.holder.__dict__[a.key]))
                a.holder.__dict__[a.key] = t
            else:
                saved.append((a, a.holder[a.key]))
                a.holder[a.key] = t
        yield
    finally:
        for a, old in reversed(saved):
            if a.attr:
                a.holder.__dict__[a.key] = old
            else:
                a.holder[a.key] = old
