"""Arguments and results of a captured call, through torch's pytree.

``(args, kwargs)`` and the result are flattened with ``torch.utils._pytree``, the
machinery torch.export and torch.compile use: every pytree-registered type (tuple,
list, dict, OrderedDict, namedtuple, None, dataclasses registered with
``register_dataclass``, transformers' ModelOutput and caches, see pytree_types.py)
goes in and comes back as itself. The structure travels in the source half as
``treespec_dumps`` text; the driver (driver.py) loads it with ``treespec_loads`` and
compares each call's structure with it. Of the leaves:

- ``nn.Module`` leaves (arguments only) have their parameters and buffers lifted;
- tensor leaves are graph inputs / outputs;
- ``int/float/bool/str`` leaves are constants, specialised and checked per call;
- anything else is refused, with what to register.

A result leaf that is one of the call's own input tensors (a cache returned in a
ModelOutput, a buffer returned as is) comes back as that tensor, as in eager.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ..errors import CaptureError
from ..templates import pytree_types

_LITERALS = (int, float, bool, str, type(None))
DATACLASSES: set = set()  # result dataclasses registered with pytree here (the driver does too)
_BUILTIN_TYPES = (
    "builtins.tuple",
    "builtins.list",
    "builtins.dict",
    "collections.OrderedDict",
    "collections.defaultdict",
    "collections.deque",
    "collections.namedtuple",
)


def children(spec) -> list:
    """The child TreeSpecs of ``spec`` (``children()`` where torch has it, else the
    older ``children_specs``)."""
    return list(spec.children()) if hasattr(type(spec), "children") else list(spec.children_specs)


def qualname(tp) -> str:
    """``module:qualname`` of a type, as the driver imports it."""
    return f"{tp.__module__}:{tp.__qualname__}"


def arg_paths(args: tuple, kwargs: dict, arg_names: list[str]) -> list[tuple[str, Any]]:
    """``(path text, leaf)`` of each pytree leaf of ``(args, kwargs)``, in
    ``tree_flatten`` order: ``argument 'x'[0]['a']``, ``args[1].field``, ``keyword
    argument 'k'``; ``argument 'x' (leaf 2)`` inside a class registered without a
    ``flatten_with_keys_fn``.

    Raises:
        CaptureError: a registered class refused its value (an uninitialized cache).
    """
    tops = [
        (f"argument {arg_names[i]!r}" if arg_names else f"args[{i}]", a) for i, a in enumerate(args)
    ]
    tops += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    out = []
    for label, value in tops:
        try:
            out += [
                (label + pytree.keystr(kp), v) for kp, v in pytree.tree_flatten_with_path(value)[0]
            ]
            continue
        except ValueError:  # no flatten_with_keys_fn (positions, below), or a refused value
            pass
        try:
            out += [(f"{label} (leaf {i})", v) for i, v in enumerate(pytree.tree_leaves(value))]
        except (
            ValueError
        ) as e:  # _pytree_types.NotReady (of this module or of a loaded pair's copy)
            raise CaptureError(
                f"{label} is {e}" if type(e).__name__ == "NotReady" else f"{label}: {e}"
            ) from None
    return out


def _result_path(kp) -> str:
    return "the result" if not kp else f"the result's part result{pytree.keystr(kp)}"


def _register_hint(value) -> str:
    tp = type(value)
    return (
        f"register {tp.__name__} with torch.utils._pytree (register_dataclass({tp.__name__}, "
        f"serialized_type_name={qualname(tp).replace(':', '.')!r}) for a dataclass, "
        "register_pytree_node(...) for another class)"
    )


# transformers' caches a served call cannot follow: their tensors grow by reassignment
# (the dynamic and quantized ones) or their position is a Python int (sliding-window layers)
_UNSERVABLE_CACHES = (
    "DynamicCache",
    "DynamicLayer",
    "QuantizedCache",
    "SlidingWindowCache",
    "StaticSlidingWindowLayer",
)


def _transformers_cache(value, kinds=("Cache", "CacheLayerMixin")) -> bool:
    """A transformers class with one of ``kinds`` among its bases: by default any cache
    or cache layer (only StaticCache and StaticLayer are registered:
    _pytree_types.CACHE_TYPES)."""
    tp = type(value)
    return tp.__module__.startswith("transformers") and any(c.__name__ in kinds for c in tp.__mro__)


def _an(name: str) -> str:
    return f"an {name}" if name[:1].lower() in "aeiou" else f"a {name}"


_STATIC_CACHE = (
    "a transformers StaticCache allocated before the call "
    "(cache.early_initialization(batch_size, num_kv_heads, head_dim, dtype, device))"
)


def flatten_inputs(args: tuple, kwargs: dict, arg_names: list[str]):
    """Flatten a call's ``(args, kwargs)``.

    Returns:
        ``(leaves, spec, kinds, paths)``: the pytree leaves and TreeSpec of ``(args,
        kwargs)``; per leaf ``["module"]``, ``["tensor"]`` or ``["const", value]``; per
        leaf its path text (:func:`arg_paths`).
    Raises:
        CaptureError: a leaf of another type (a plain object, a class not registered
            with pytree), naming its path and what to do.
    """
    with_paths = arg_paths(args, kwargs, arg_names)
    spec = pytree.tree_structure((tuple(args), dict(kwargs)))
    leaves: list[Any] = []
    kinds: list[list[Any]] = []
    paths: list[str] = []
    for path, v in with_paths:
        if isinstance(v, torch.nn.Module):
            kinds.append(["module"])
        elif isinstance(v, torch.Tensor):
            kinds.append(["tensor"])
        elif isinstance(v, _LITERALS):
            kinds.append(["const", v])
        elif _transformers_cache(v, _UNSERVABLE_CACHES):
            raise CaptureError(
                f"{path} is {_an(type(v).__name__)}, a transformers cache the capture cannot take: it "
                "grows its tensors or keeps its position in a Python int, and a served call makes "
                f"no new tensors and keeps no Python state. Pass {_STATIC_CACHE}; a model with "
                "sliding-window layers (StaticSlidingWindowLayer) has no cache the capture takes"
            )
        else:
            hint = _register_hint(v)
            raise CaptureError(
                f"{path} is a {type(v).__name__}, which the capture cannot take apart: it takes "
                "tensors, nn.Modules, int/float/bool/str/None and the containers torch's pytree "
                f"knows (tuple, list, dict, namedtuple, registered classes). {hint[0].upper()}{hint[1:]}, "
                "or pass the tensors it holds instead"
            )
        leaves.append(v)
        paths.append(path)
    return leaves, spec, kinds, paths


def _registered_by_its_library(tp) -> bool:
    """Register ``tp`` as its library does, where its library registers it itself:
    transformers registers each ModelOutput class with pytree when the class is made,
    but not while ``torch.compiler.is_compiling()`` (true while the capture traces), so
    a class first imported inside the traced function (``BaseModelOutput``) is found
    unregistered here. Registered as a dataclass by us, its next instance outside the
    trace would register it again ("already registered as pytree node"), and a serving
    process would have transformers' flattening (non-None fields) where the pair
    recorded ours. Returns whether ``tp`` is registered now."""
    import torch.compiler as tc

    generic = sys.modules.get("transformers.utils.generic")
    base, register = (
        getattr(generic, "ModelOutput", None),
        getattr(generic, "_register_model_output_pytree_node", None),
    )
    if base is None or register is None or not issubclass(tp, base):
        return False
    flag = getattr(tc, "_is_compiling_flag", None)
    if flag is not None:
        tc._is_compiling_flag = False  # (torch.compiler.is_compiling() reads it; put back below)
    try:
        register(tp)
    finally:
        if flag is not None:
            tc._is_compiling_flag = flag
    return tp in pytree.SUPPORTED_NODES


def flatten_result(result):
    """Flatten a call's result: ``(leaves, spec)``.

    A dataclass that is not registered with pytree is registered here
    (``register_dataclass``, by its init fields), so that a dataclass result comes
    back as itself without the user registering it; the driver registers it the same
    way.

    Raises:
        CaptureError: a leaf that is no tensor or int/float/bool/str/None (a Python
            number computed from a tensor, an unregistered class), naming it.
    """
    leaves, spec = pytree.tree_flatten(result)
    while not torch.compiler.is_dynamo_compiling():  # (Dynamo would not follow a registration)
        plain = {type(v) for v in leaves if dataclasses.is_dataclass(v) and not isinstance(v, type)}
        if not plain:
            break
        for tp in plain:  # a plain dataclass result: registered as pytree flattens it by fields
            if _registered_by_its_library(tp):
                continue
            pytree.register_dataclass(tp, serialized_type_name=qualname(tp))
            DATACLASSES.add(tp)
        leaves, spec = pytree.tree_flatten(result)
    if all(isinstance(v, (torch.Tensor, *_LITERALS)) for v in leaves):
        return leaves, spec
    try:
        named = [(_result_path(kp), v) for kp, v in pytree.tree_flatten_with_path(result)[0]]
    except ValueError:  # a class registered without a flatten_with_keys_fn: positions
        named = [(f"the result's leaf {i}", v) for i, v in enumerate(leaves)]
    for what, v in named:  # name the first bad one
        if isinstance(v, (torch.Tensor, *_LITERALS)):
            continue
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise CaptureError(
                f"{what} is a Python number computed while tracing ({type(v).__name__}: from "
                ".item(), float()/int() of a tensor, or a dynamic size): a Python number from "
                ".item() cannot be a result of a captured function; return the tensor instead "
                "(e.g. `loss`, not `loss.item()`)"
            )
        if _transformers_cache(v):  # (registering it would not make a cache the call can return)
            raise CaptureError(
                f"{what} is {_an(type(v).__name__)}, a model's key/value cache made by the call: pass "
                f"{_STATIC_CACHE} as an argument, use_cache=False, or return the tensors you need"
            )
        raise CaptureError(
            f"{what} is a {type(v).__name__}; return tensors, int/float/bool/str/None and "
            f"containers torch's pytree knows (tuple, list, dict, namedtuple, registered classes): "
            f"{_register_hint(v)}"
        )
    raise AssertionError("unreachable")  # pragma: no cover


class _Shown:
    """A leaf in :func:`outline`'s text: ``repr`` is its type name."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def outline(spec, leaf_types: list[str]) -> tuple[str, str]:
    """The structure of a result without its constants' values: ``(key, text)``. Two
    calls returning the same structure have equal keys (the TreeSpec and each leaf's
    type name, ``Tensor`` for tensors); ``text`` is the result's ``repr`` with each leaf
    shown as its type: ``(Tensor, Tensor)``, ``[Tensor, int]``, ``Out(logits=Tensor,
    loss=NoneType)``."""
    key = f"{spec} with leaves ({', '.join(leaf_types)})"
    try:
        text = repr(pytree.tree_unflatten([_Shown(t) for t in leaf_types], spec))
    except Exception:  # noqa: BLE001 - a class whose unflatten or repr wants real values
        text = key
    return key, text


def leaf_types(leaves: list) -> list[str]:
    """The type names :func:`outline` takes, of real values."""
    return ["Tensor" if isinstance(v, torch.Tensor) else type(v).__name__ for v in leaves]


def short(text: str, limit: int = 200) -> str:
    """``text``, cut to ``limit`` characters for a message."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dump_spec(spec, what: str) -> tuple[str, list[list[str]]]:
    """``treespec_dumps`` of ``spec``, and the types the driver must import (and, for
    named tuples and transformers' caches, register) before ``treespec_loads``.

    Named tuples not yet registered for serialisation are registered here under their
    ``module:qualname`` (pytree flattens them the same way). Returns ``(text, types)``,
    ``types`` a list of ``[kind, "module:qualname", serialized name]`` with kind
    ``"namedtuple"``, ``"cache"`` (pytree_types.py), ``"dataclass"`` (a plain
    dataclass result, registered by :func:`flatten_result`) or ``"registered"``.
    Raises:
        CaptureError: a registered class without a ``serialized_type_name``, or whose
            context pytree cannot write as JSON.
    """
    types: list[list[str]] = []
    seen: set = set()
    stack = [spec]
    while stack:
        s = stack.pop()
        stack.extend(children(s))
        tp = s.type
        if tp is None or s.is_leaf() or tp in seen:
            continue
        seen.add(tp)
        node = pytree.SUPPORTED_SERIALIZED_TYPES.get(tp)
        name = getattr(node, "serialized_type_name", None)
        if name in _BUILTIN_TYPES or tp is type(None):
            if name == "collections.namedtuple":  # the class is the context
                nt = s.context
                nt_node = pytree.SUPPORTED_SERIALIZED_TYPES.get(nt)
                nt_name = getattr(nt_node, "serialized_type_name", None)
                if nt_name in (None, pytree.NO_SERIALIZED_TYPE_NAME_FOUND):
                    nt_name = qualname(nt)
                    pytree._register_namedtuple(nt, serialized_type_name=nt_name)
                if nt not in seen:
                    seen.add(nt)
                    types.append(["namedtuple", qualname(nt), nt_name])
            continue
        if name in (None, pytree.NO_SERIALIZED_TYPE_NAME_FOUND):
            raise CaptureError(
                f"{what} holds a {tp.__name__}, registered with torch.utils._pytree without a "
                "serialized_type_name, so the pair cannot record it: register it with "
                f"serialized_type_name={qualname(tp).replace(':', '.')!r}"
            )
        kind = (
            "cache"
            if pytree_types.registered_here(tp)
            else "dataclass"
            if tp in DATACLASSES
            else "registered"
        )
        types.append([kind, qualname(tp), name])
    try:
        text = pytree.treespec_dumps(spec)
    except (NotImplementedError, TypeError) as e:
        raise CaptureError(
            f"{what}: torch's pytree cannot record its structure ({e}); register "
            "its classes with a serialized_type_name and a JSON context"
        ) from None
    return text, sorted(types)


def result_leaves(leaves: list, flat_inputs: list) -> tuple[list, list]:
    """Split the result's leaves: ``(kinds, tensors)``, per leaf ``["tensor", k]`` (the
    k-th graph output), ``["input", j]`` (the j-th flat input, returned as it is) or
    ``["const", value]``; ``tensors`` the graph outputs in order."""
    kinds: list[list[Any]] = []
    tensors: list[Any] = []
    for v in leaves:
        if isinstance(v, torch.Tensor):
            j = next(
                (j for j, t in enumerate(flat_inputs) if t is v), None
            )  # `is`: Dynamo follows it
            if j is not None:
                kinds.append(["input", j])
            else:
                kinds.append(["tensor", len(tensors)])
                tensors.append(v)
        else:
            kinds.append(["const", v])
    return kinds, tensors


_DICTS = (dict, collections.OrderedDict, collections.defaultdict)


def _child_keys(spec) -> list[str]:
    """The key text of each child of a TreeSpec node (``[0]``, ``['a']``, ``.field``)."""
    try:
        node = pytree.tree_unflatten([0] * spec.num_leaves, spec)
        entries, _ = pytree.SUPPORTED_NODES[spec.type].flatten_with_keys_fn(node)  # type: ignore[misc]
        return [pytree.keystr((k,)) for k, _ in entries]
    except Exception:  # noqa: BLE001 - no keys known for this type: positions
        return [f"[{i}]" for i in range(spec.num_children)]


def _node_text(spec) -> str:
    if spec.is_leaf():
        return "a leaf (a tensor, model or constant)"
    if spec.type is type(None):
        return "None"
    return _an(getattr(spec.type, "__name__", str(spec.type))) + f" of {spec.num_children} item(s)"


def _structure_change(want, got, path: str, in_object: bool = False) -> tuple[str, bool] | None:
    """Where the TreeSpec ``got`` first differs from ``want``, as ``(text, plain)``:
    ``argument 'features': added the key(s) 'token_embeddings'``, ``plain`` True where
    the change is to a dict, list or tuple of the arguments themselves (not inside a
    registered object, a cache); None where equal."""
    if want == got:
        return None
    plain = not in_object and want.type in (*_DICTS, list, tuple)
    if want.is_leaf() or got.is_leaf() or want.type is not got.type:
        return f"{path} was {_node_text(want)}, now {_node_text(got)}", False
    if want.type in _DICTS and want.context != got.context:
        added = [k for k in got.context if k not in want.context]
        removed = [k for k in want.context if k not in got.context]
        parts = ([f"added the key(s) {', '.join(map(repr, added))}"] if added else []) + (
            [f"removed the key(s) {', '.join(map(repr, removed))}"] if removed else []
        )
        return f"{path}: " + (" and ".join(parts) or "its keys in another order"), plain
    if want.num_children != got.num_children:
        return f"{path} had {want.num_children} item(s), now {got.num_children}", plain
    if want.context != got.context:
        return short(
            f"{path}: {_node_text(want)} whose context changed ({want.context!r} -> {got.context!r})",
            300,
        ), False
    inside = in_object or want.type not in (*_DICTS, list, tuple)
    for key, w, g in zip(_child_keys(want), children(want), children(got)):
        found = _structure_change(w, g, path + key, inside)
        if found:
            return found
    return f"{path} changed", False  # pragma: no cover - (equal children, unequal specs)


def _where_changed(spec, after, arg_names) -> tuple[str, bool]:
    (w_pos, w_kw), (g_pos, g_kw) = children(spec), children(after)
    labels = [
        f"argument {arg_names[i]!r}" if i < len(arg_names) else f"args[{i}]"
        for i in range(w_pos.num_children)
    ]
    pairs = list(zip(labels, children(w_pos), children(g_pos)))
    pairs += [
        (f"keyword argument {k!r}", w, g)
        for k, w, g in zip(w_kw.context, children(w_kw), children(g_kw))
    ]
    for label, w, g in pairs:
        found = _structure_change(w, g, label)
        if found:
            return found
    return "the arguments", False  # pragma: no cover - (a call cannot change its own arity)


def changed_argument(
    args: tuple,
    kwargs: dict,
    spec,
    tensors: Sequence[Any],
    kinds: list,
    paths: list,
    arg_names: list[str] | tuple = (),
) -> str | None:
    """What the traced call changed in its arguments' structure (None: nothing): an
    attribute of a registered object reassigned (DynamicCache's ``keys = cat(...)``), a
    Python number in one changed, keys added to a dict argument
    (``features.update({...})``, as sentence-transformers' modules do). A served call
    runs no Python, so such a change would not reach the caller's object; in-place
    writes to its tensors do. The text names the argument's path and what changed
    (``arg_names``: the function's positional parameter names, for the path)."""
    leaves, after = pytree.tree_flatten((tuple(args), dict(kwargs)))
    if after != spec:
        where, plain = _where_changed(spec, after, list(arg_names))
        advice = (
            "return the new values instead, or capture a wrapper that passes the function a "
            "copy (`lambda features: model(dict(features))`; list(...) for a list)"
            if plain
            else "write into the argument's tensors in place instead (a transformers StaticCache, "
            "not a DynamicCache, whose tensors grow)"
        )
        return (
            f"the function changes the structure of its arguments ({where}), which a served "
            f"call would not do: {advice}"
        )
    it = iter(tensors)
    for v, k, path in zip(leaves, kinds, paths):
        if k[0] == "tensor" and v is not next(it):
            return (
                f"the function replaces {path} with a new tensor (an attribute reassigned, as "
                "DynamicCache does), which a served call would not do: write into it in place "
                "(a transformers StaticCache), or return the new value"
            )
    return None
