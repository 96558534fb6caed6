# ---- the calling convention: arguments and results through torch's pytree ----------
# Copied verbatim into every source half of the `frozen` and `eager` engines, after
# pytree_types.py and before the driver (driver.py, which calls these; CallError,
# _META and torch are the source's), by codegen.py. Needs torch and the stdlib.
# PRECOMPILE_METADATA["inputs"] / ["outputs"] (tracing.py, pytree_io.py): the
# treespec_dumps text of (args, kwargs) / of the result, a kind per leaf, and the types
# to import (and, for named tuples and transformers' caches, register) before
# treespec_loads. Loaded at the first call that needs them, not when the source runs.
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import _META, PRECOMPILE_METADATA, CallError, register_cache_types
# end stand-ins

import collections as _collections
import importlib as _importlib
import itertools as _itertools
import operator as _operator
import threading as _threading
import weakref as _weakref

from torch.utils import _pytree as _pytree

_IN = PRECOMPILE_METADATA["inputs"]
_OUT = PRECOMPILE_METADATA["outputs"]
_SPECS: dict = {}  # "inputs"/"outputs" -> the loaded TreeSpec


def _load_types(types, what):
    from torch.utils._pytree import SERIALIZED_TYPE_TO_PYTHON_TYPE, _register_namedtuple

    for kind, qualname, serialized in types:
        if serialized in SERIALIZED_TYPE_TO_PYTHON_TYPE:
            continue
        module, _, name = qualname.partition(":")
        try:
            obj = _importlib.import_module(module)
            for part in name.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise CallError(
                f"target {_META['target']!r}: {what} holds a {qualname}, which this process "
                f"cannot import ({type(e).__name__}: {e}); install or import what defines it"
            ) from None
        if kind == "namedtuple":
            _register_namedtuple(obj, serialized_type_name=serialized)  # type: ignore[arg-type]
        elif kind == "dataclass":
            _pytree.register_dataclass(obj, serialized_type_name=serialized)  # type: ignore[arg-type]
        elif kind == "cache":
            register_cache_types((qualname,))  # pytree_types.py, copied in above
        if serialized not in SERIALIZED_TYPE_TO_PYTHON_TYPE:
            raise CallError(
                f"target {_META['target']!r}: {what} holds a {qualname}, registered with "
                f"torch.utils._pytree as {serialized!r} at capture and not registered in this "
                "process; import the module that registers it before the call"
            )


_SPECS_LOCK = _threading.Lock()  # first calls on several threads register the types once


def _spec(which):
    spec = _SPECS.get(which)
    if spec is None:
        with _SPECS_LOCK:
            spec = _SPECS.get(which)
            if spec is None:
                entry = _META[which]  # type: ignore[literal-required]  # ("inputs" or "outputs")
                _load_types(entry["types"], "an argument" if which == "inputs" else "the result")
                spec = _SPECS[which] = _pytree.treespec_loads(entry["spec"])
    return spec


def _children(spec):
    return list(spec.children()) if hasattr(type(spec), "children") else list(spec.children_specs)


def _leaf_paths(args, kwargs):
    """Each leaf's path text (``argument 'x'[0]['a']``, ``keyword argument 'k'``), for
    messages: the same text as the capture's (pytree_io.arg_paths)."""
    names = _META.get("arg_names") or []
    tops = [(f"argument {names[i]!r}" if names else f"args[{i}]", a) for i, a in enumerate(args)]
    tops += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    paths = []
    for label, value in tops:
        try:
            paths += [
                label + _pytree.keystr(kp) for kp, _ in _pytree.tree_flatten_with_path(value)[0]
            ]
        except ValueError:  # a class registered without a flatten_with_keys_fn: positions
            paths += [f"{label} (leaf {i})" for i in range(len(_pytree.tree_leaves(value)))]
    return paths


_UNNAMED = object()  # a value _spec_text does not know


def _spec_problem(want, got, path, value):
    """Where two TreeSpecs first differ, as text (``argument 'x'[1]: expected a list of
    2 items, got a tuple of 3``), or None. ``value``: the call's value that ``got`` is
    the spec of (a leaf is named by its type: ``got a DynamicCache``)."""
    if want == got:
        return None
    if (
        want.is_leaf()
        or got.is_leaf()
        or want.type is not got.type
        or want.num_children != got.num_children
    ):
        return f"{path}: expected {_spec_text(want)}, got {_spec_text(got, value)}"
    if want.context != got.context:
        return f"{path}: {_context_difference(want, got)}"
    try:
        values = _pytree.SUPPORTED_NODES[got.type].flatten_fn(value)[0]
    except Exception:  # (the value flattened once already: only names are lost)
        values = [_UNNAMED] * got.num_children
    for key, w, g, v in zip(_child_keys(want), _children(want), _children(got), values):
        problem = _spec_problem(w, g, path + key, v)
        if problem:
            return problem
    return f"{path}: expected {_spec_text(want)}, got {_spec_text(got)}"  # pragma: no cover


def _child_keys(spec):
    """The key text of each child of a TreeSpec node (``[0]``, ``['a']``, ``.field``)."""
    try:
        node = _pytree.tree_unflatten([0] * spec.num_leaves, spec)
        entries, _ = _pytree.SUPPORTED_NODES[spec.type].flatten_with_keys_fn(node)  # type: ignore[misc]  # (None: the except below)
        return [_pytree.keystr((k,)) for k, _ in entries]
    except Exception:  # no keys known for this type: positions
        return [f"[{i}]" for i in range(spec.num_children)]


def _context_difference(want, got):
    """How two nodes of one type differ in their context (dict keys, the attributes of
    a registered object), as text."""
    w, g = want.context, got.context
    name = getattr(want.type, "__name__", str(want.type))
    if (
        isinstance(w, tuple) and len(w) == 2 and isinstance(w[1], tuple)
    ):  # pytree_types.py's attributes
        wd, gd = dict(w[1]), dict(g[1]) if isinstance(g, tuple) and len(g) == 2 else {}
        diff = [
            f"{k} {gd.get(k)!r} (captured {wd.get(k)!r})"
            for k in sorted(wd.keys() | gd.keys())
            if wd.get(k) != gd.get(k)
        ]
        if diff:
            return f"a {name} with " + ", ".join(diff)
    if want.type in (dict, _collections.OrderedDict):
        return f"expected a {name} with keys {w}, got a {name} with keys {g}"
    text = f"a {name} of another kind: captured {w!r}, got {g!r}"
    return text if len(text) <= 300 else text[:297] + "..."


def _spec_text(spec, value=_UNNAMED):
    if spec.is_leaf():
        if value is _UNNAMED:
            return "a value (a tensor, model or constant)"
        name = type(value).__name__
        return (
            "None"
            if value is None
            else f"an {name}"
            if name[:1].lower() in "aeiou"
            else f"a {name}"
        )
    if spec.type is type(None):
        return "None"
    kind = getattr(spec.type, "__name__", str(spec.type))
    context = spec.context
    if isinstance(context, list) and spec.type in (dict, _collections.OrderedDict):
        return f"a {kind} with keys {context}"
    return f"a {kind} of {spec.num_children} item(s)"


def _check_structure(args, kwargs):
    """Positional count and keyword names as captured; returns kwargs in the captured order."""
    if len(args) != _IN["num_args"] or kwargs.keys() != _KW_SET:
        raise CallError(
            f"target {_META['target']!r}: called with {len(args)} positional argument(s) "
            f"and keyword(s) {sorted(kwargs)}; the capture was called with "
            f"{_IN['num_args']} positional argument(s) and keyword(s) {sorted(_KW_NAMES)}: call it "
            "the same way"
        )
    if list(kwargs) != _KW_NAMES:
        kwargs = {k: kwargs[k] for k in _KW_NAMES}
    return kwargs


# ---- the fast walk: the captured structure checked without building a TreeSpec ----
# tree_flatten builds a TreeSpec node per container and per registered object (a
# StaticCache: one per layer) and the comparison walks both trees: microseconds per
# layer on every decode step. The walk below follows the captured TreeSpec instead and
# takes the leaves where it finds exactly what tree_flatten would have found there
# (the node types tuple, list, dict, None and the classes pytree_types.py registered;
# same length, dict keys, attribute names, non-tensor attributes); on anything else, or
# a capture with other node types, it gives way to tree_flatten and its messages.
_LEAF, _SEQ, _DICT, _NONE, _ATTRS = range(5)
_PLAN: list = []  # [the plan of the captured inputs (None: tree_flatten on every call)], built at first use
_PLAIN_LEAVES = frozenset((torch.Tensor, torch.nn.Parameter, int, float, bool, str))


class _Node:
    """One node of the captured TreeSpec, as _walk checks it."""

    __slots__ = (
        "kind",
        "type",
        "size",
        "keys",
        "get",
        "other_get",
        "other",
        "other_types",
        "kids",
        "leaves_only",
    )
    kind: int
    type: type
    size: int
    keys: object  # a list of dict keys, or a frozenset of attribute names
    get: object
    other_get: object
    other: tuple
    other_types: tuple
    kids: list
    leaves_only: bool


def _getter(names):
    """A function of a dict: the tuple of its values at ``names``."""
    get = _operator.itemgetter(*names)
    return get if len(names) > 1 else (lambda d: (get(d),))


def _node_plan(spec):
    """A TreeSpec as _Node objects for _walk, or None where a node is of another type."""
    node = _Node()
    node.kind = _LEAF
    if spec.is_leaf():
        return node
    kids = [_node_plan(c) for c in _children(spec)]
    if any(k is None for k in kids):
        return None
    node.kids, node.type = kids, spec.type
    node.leaves_only = all(k.kind == _LEAF for k in kids)
    if node.type is tuple or node.type is list:
        node.kind, node.size = _SEQ, spec.num_children
    elif node.type is dict:
        node.kind, node.keys = _DICT, list(spec.context)
    elif node.type is type(None):
        node.kind = _NONE
    else:
        registered = _pytree.SUPPORTED_NODES.get(node.type)
        if (
            getattr(getattr(registered, "flatten_fn", None), "precompile_flatten", None)
            != "attrs-1"
        ):
            return None
        names, other = spec.context
        if not names:  # (nothing to take: tree_flatten is as quick)
            return None
        node.kind, node.get = _ATTRS, _getter(names)
        node.keys = frozenset(names) | {k for k, _ in other}
        node.other_get = _getter([k for k, _ in other]) if other else None
        node.other = tuple(v for _, v in other)
        node.other_types = tuple(type(v) for _, v in other)
        # _pt_flatten takes tensors and containers as children, the rest as context
        if any(k.kind == _LEAF for k in kids) and not node.leaves_only:
            return None
    return node


def _walk(node, obj, out):
    """Append obj's leaves to ``out`` as tree_flatten would, where obj has the captured
    structure ``node``; False (``out`` half-filled) where it may not."""
    kind = node.kind
    if kind == _SEQ:
        if type(obj) is not node.type or len(obj) != node.size:
            return False
        children = obj
    elif kind == _ATTRS:
        d = getattr(obj, "__dict__", None) if type(obj) is node.type else None
        if d is None or d.keys() != node.keys:
            return False
        if node.other_get is not None:
            other = node.other_get(d)
            if tuple(map(type, other)) != node.other_types or other != node.other:
                return False
        children = node.get(d)
        if node.leaves_only and not all(map(isinstance, children, _TENSOR_TYPES)):
            return False
    elif kind == _DICT:
        if type(obj) is not dict or list(obj) != node.keys:
            return False
        children = obj.values()
    elif kind == _NONE:
        return obj is None
    else:
        out.append(obj)
        return True
    if node.leaves_only:
        out.extend(children)
        return True
    for k, c in zip(node.kids, children):
        if k.kind == _LEAF:
            out.append(c)
        elif not _walk(k, c, out):
            return False
    return True


_TENSOR_TYPES = _itertools.repeat(torch.Tensor)  # (an endless iterator: reused by every call)


def _fast_leaves(args, kwargs):
    """The leaves of (args, kwargs) where they have the captured structure, or None:
    then tree_flatten decides (and names what differs)."""
    if not _PLAN:
        _PLAN.append(_node_plan(_spec("inputs")))
    plan = _PLAN[0]
    if plan is None:
        return None
    leaves: list = []
    try:
        if not _walk(plan, (args, kwargs), leaves):
            return None
    except Exception:  # an object whose attributes do not read as captured: tree_flatten's verdict
        return None
    if not all(map(_PLAIN_LEAVES.__contains__, map(type, leaves))):
        for v in leaves:  # (a model: one look-up)
            if type(v) not in _PLAIN_LEAVES and not _pytree.tree_is_leaf(v):
                return None
    return leaves


def _flatten_call(args, kwargs):
    """The call's models and tensor leaves, its structure and constants checked
    against the capture's. Returns (modules, tensors). Raises CallError."""
    kwargs = _check_structure(args, kwargs)
    want = _spec("inputs")  # first: it registers the argument types this process lacks
    leaves = _fast_leaves(args, kwargs)
    if leaves is None:
        leaves = _generic_leaves(args, kwargs, want)
    modules = [leaves[i] for i in _IN_MODULES]
    for i, m in zip(_IN_MODULES, modules):
        if not isinstance(m, torch.nn.Module):
            raise CallError(
                f"target {_META['target']!r}, {_leaf_paths(args, kwargs)[i]}: expected an "
                f"nn.Module, got {type(m).__name__}"
            )
    for i, c in _IN_CONSTS:
        v = leaves[i]
        if type(v) is not type(c) or v != c:
            raise CallError(
                f"target {_META['target']!r}, {_leaf_paths(args, kwargs)[i]}: the capture "
                f"specialised on {c!r}, got "
                + (f"a {type(v).__name__}" if isinstance(v, torch.Tensor) else repr(v))
                + "; capture again with this value"
            )
    return modules, [leaves[i] for i in _IN_TENSORS]


def _generic_leaves(args, kwargs, want):
    """tree_flatten's leaves of (args, kwargs), its TreeSpec compared with the captured
    ``want``. Raises CallError naming the first difference."""
    try:
        leaves, spec = _pytree.tree_flatten((args, kwargs))
    except (
        ValueError
    ) as e:  # NotReady: a registered class refusing its value (pytree_types.py's, or
        # the capture side's copy where this process captured too)
        if type(e).__name__ != "NotReady":
            raise
        raise CallError(f"target {_META['target']!r}: an argument is {e}") from None
    if spec != want:
        names = _META.get("arg_names") or []
        (w_pos, w_kw), (g_pos, g_kw) = _children(want), _children(spec)
        pairs = [
            (f"argument {names[i]!r}" if names else f"args[{i}]", w, g, v)
            for i, (w, g, v) in enumerate(zip(_children(w_pos), _children(g_pos), args))
        ]
        pairs += [
            (f"keyword argument {k!r}", w, g, kwargs[k])
            for k, w, g in zip(_KW_NAMES, _children(w_kw), _children(g_kw))
        ]
        problem = next(
            (_spec_problem(w, g, label, v) for label, w, g, v in pairs if w != g), "the arguments"
        )
        raise CallError(
            f"target {_META['target']!r}, {problem}; pass what was captured, or capture "
            "again with this structure"
        )
    return leaves


def _tensor_paths(args, kwargs):
    """The path text of each tensor leaf (for messages)."""
    paths = _leaf_paths(args, _check_structure(args, kwargs))
    return [paths[i] for i in _IN_TENSORS]


def _rebuild(outs, flat):
    """The result: the captured structure with the graph's outputs ``outs``, the
    inputs returned as they are (from ``flat``) and the constants."""
    values = list(_OUT_VALUES)
    for pos, k in _OUT_TENSORS:
        values[pos] = outs[k]
    for pos, j in _OUT_INPUTS:
        values[pos] = flat[j]
    return _pytree.tree_unflatten(values, _spec("outputs"))


# The common calling convention, served without flattening the arguments: only
# positional arguments, each a model or a tensor; one tensor returned.
_KW_NAMES = list(_IN["kwarg_names"])
_KW_SET = set(_KW_NAMES)
_N_POS = _IN["num_args"]
_SIMPLE_ARGS = bool(_IN.get("positional_leaves"))
_IN_MODULES = [i for i, k in enumerate(_IN["leaves"]) if k[0] == "module"]
_IN_TENSORS = [i for i, k in enumerate(_IN["leaves"]) if k[0] == "tensor"]
_IN_CONSTS = [(i, k[1]) for i, k in enumerate(_IN["leaves"]) if k[0] == "const"]
_MODULE_POS = _IN_MODULES if _SIMPLE_ARGS else []  # leaves are the positional arguments
_TENSOR_POS = _IN_TENSORS if _SIMPLE_ARGS else []
_OUT_VALUES = [k[1] if k[0] == "const" else None for k in _OUT["leaves"]]
_OUT_TENSORS = [(pos, k[1]) for pos, k in enumerate(_OUT["leaves"]) if k[0] == "tensor"]
_OUT_INPUTS = [(pos, k[1]) for pos, k in enumerate(_OUT["leaves"]) if k[0] == "input"]
_SINGLE_OUT = bool(_OUT.get("single_tensor"))


# ---- inputs written in place share memory with no other ---------------------------
class _Params(list):
    """The lifted tensors of a call's models (_driver._cached_params), weakly referable:
    the alias verdict below is kept for them without keeping a deleted model alive."""

    __slots__ = ("__weakref__",)


_NO_PARAMS = _Params()
_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)  # (CUDA builds)
_DATA_PTR = torch.Tensor.data_ptr
_OFFSET = torch.Tensor.storage_offset
_WRITTEN = sorted(PRECOMPILE_METADATA.get("mutated_inputs") or ())  # indices into the flat inputs
_UNWRITTEN: list = []  # [the indices of the user inputs and constants not written], set at the first check
# Verdicts are kept only where the written inputs' sizes are fixed (no dynamic dims):
# then the same address and storage offset mean the same memory range and storage.
_KEEP_VERDICTS = not PRECOMPILE_METADATA.get("dynamic")
# verdicts of passing calls: (id of the params, data pointers and storage offsets of the
# inputs written) -> (weakref of the params, their data pointers, their indices, the
# storages written to)
_VERDICTS: dict = {}
_VERDICTS_KEPT = 16  # (several caches served in turn keep theirs; the oldest goes first)
# the last call's verdict, for one C comparison of its addresses (CUDA builds):
# (weakref of the params, data pointers by flat index, the indices, verdict, offsets)
_LAST_VERDICT: list = [None]


def _check_no_aliases(params, flat, names):
    """The compiled code writes to the inputs at _META["mutated_inputs"] of ``flat``
    (``params`` first, then the user tensors and constants) and reads the others as
    separate memory: an input written to must share memory with no other. ``names()``
    gives each input's name for the message. Raises CallError.

    A passing call's verdict is kept (static shapes) for the same models' tensors (the
    same objects, the state epoch of driver.py, at the same addresses: a ``p.data =
    other`` moves a parameter without a new object) and written inputs at the same
    addresses and storage offsets (a decode step's cache): then only the inputs not
    written (the new token, the position) are looked up among the storages written
    to, O(those inputs)."""
    if not _KEEP_VERDICTS:
        _full_alias_check(params, flat, names, None)
        return
    written_now = [flat[i] for i in _WRITTEN]
    offsets = list(map(_OFFSET, written_now))
    last = _LAST_VERDICT[0]
    if (
        last is not None
        and last[0]() is params
        and last[4] == offsets
        and len(flat) == len(last[1])
        and _PTRS_EQUAL(flat, last[1], last[2])  # type: ignore[misc]  # (kept only where it is set)
    ):
        verdict = last[3]
    else:
        key = (id(params), *map(_DATA_PTR, written_now), *offsets)
        verdict = _VERDICTS.get(key)
        if (
            verdict is None
            or verdict[0]() is not params
            or not (
                _PTRS_EQUAL(params, verdict[1], verdict[2])
                if _PTRS_EQUAL is not None
                else list(map(_DATA_PTR, params)) == verdict[1]
            )
        ):
            _full_alias_check(params, flat, names, key)
            return
    written = verdict[3]
    for i in _UNWRITTEN[0]:
        t = flat[i]
        if t.untyped_storage().data_ptr() in written and t.numel():
            _full_alias_check(params, flat, names, None)
            return  # (it raises, naming the two)
    if _PTRS_EQUAL is not None and (last is None or last[3] is not verdict):
        ptrs: list = [None] * len(flat)
        for i in verdict[2] + _WRITTEN:
            ptrs[i] = _DATA_PTR(flat[i])
        _LAST_VERDICT[0] = (verdict[0], ptrs, verdict[2] + _WRITTEN, verdict, offsets)


def _full_alias_check(params, flat, names, key):
    """_check_no_aliases over every input; keeps the verdict under ``key`` (None: not kept)."""
    n = len(params)
    ptrs = [t.untyped_storage().data_ptr() if t.numel() else None for t in flat]
    counts = _collections.Counter(ptrs)
    for i in _WRITTEN:
        if ptrs[i] is None or counts[ptrs[i]] == 1:
            continue
        j = next(j for j, ptr in enumerate(ptrs) if j != i and ptr == ptrs[i])
        names = names()
        raise CallError(
            f"target {_META['target']!r}: {names[i]} shares memory with {names[j]}, "
            "and the captured function writes to it; pass separate tensors (.clone())"
        )
    if key is None:
        return
    if not _UNWRITTEN:
        done = set(_WRITTEN)
        _UNWRITTEN.append([i for i in range(n, len(flat)) if i not in done])
    _VERDICTS[key] = (
        _weakref.ref(params),
        list(map(_DATA_PTR, params)),
        list(range(n)),
        frozenset(ptrs[i] for i in _WRITTEN if ptrs[i] is not None),
    )
    while len(_VERDICTS) > _VERDICTS_KEPT:
        try:
            del _VERDICTS[next(iter(_VERDICTS))]
        except (
            KeyError,
            RuntimeError,
            StopIteration,
        ):  # another thread took it (or changed the dict)
            break
