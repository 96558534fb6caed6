"""The guards TorchDynamo builds for the captured call, as checks a pair runs per call.

A trace bakes every Python value its code read into the graph. The recorder of
assumed_state.py sees the reads that pass through what it wraps; TorchDynamo sees all
of them, since it reads the bytecode the call ran: a global read in a helper method
(``G['GAIN']``), a ``SimpleNamespace`` config (``m.cfg.temp``), a class attribute
(``type(m).SCALE``), a closure cell (``m.post.__closure__[0].cell_contents``), an
attribute absent at capture (``HASATTR``), a hook function's code (``CLOSURE_MATCH``).
So the capture asks Dynamo for the guard set of the example call
(``torch.compile(fn, fullgraph=True, options={"guard_filter_fn": ...})``, stopped once
the guards are built: nothing runs) and translates each guard into a check that needs
no compiler at serving time: a value compared with a literal, a class compared by
module and qualname, a function by a fingerprint of its code, an attribute's presence,
a dict's keys, a length. Identity guards become structural checks (the identity of an
object cannot be compared across processes).

Each check is evaluated on the capture's own state before it is kept (a check that
does not hold there is a translation bug: the capture refuses), and again after the
trace: a value the function itself changes (a call counter) is its state, not an
assumption, and is left out (python_state.py warns about it). Values of the capture
script (``__main__``) that are not modules, classes or functions of an importable
module are the pair's constants and are not checked; guards on torch's own modules,
tensors (the driver's tensor checks), aliasing (call_args.py) and the global modes
(the driver's ambient checks) are left to those checks (:data:`LEFT_TO_OTHERS`).

Where Dynamo cannot trace the call in one graph (a graph break), or a guard has no
translation, the capture refuses with the reason, the source and its line, unless the
target's ``guards`` option is ``"recorded"`` (then only assumed_state.py's recording
is checked, and the manifest and ``inspect`` say so).
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import types
from typing import Any, Callable

from ..errors import CaptureError, warn_at_caller
from ..templates.guard_values import code_fingerprint, code_of, literal_type
from . import class_attributes, dict_covers, dynamo_collect, graph_attrs, guard_sources

LEFT_TO_OTHERS = {
    "TENSOR_MATCH": "tensors: the driver's dtype, device, shape, stride and requires_grad checks",
    "DUPLICATE_INPUT": "aliasing: call_args.py's alias checks",
    "NO_TENSOR_ALIASING": "aliasing: call_args.py's alias checks",
    "OBJECT_ALIASING": "aliasing: call_args.py's alias checks",
    "SHAPE_ENV": "sizes: the static shapes or the dynamic dims' ranges",
    "SYMBOL_MATCH": "sizes",
    "GRAD_MODE": "the driver's grad-mode check",
    "GLOBAL_STATE": "the driver's ambient checks (grad mode, autocast, default dtype)",
    "DETERMINISTIC_ALGORITHMS": "the driver's ambient checks",
    "TORCH_FUNCTION_STATE": "the driver's ambient checks",
    "AUTOGRAD_SAVED_TENSORS_HOOKS": "the driver's ambient checks",
    "DEFAULT_DEVICE": "the graph's tensors carry the captured device",
    "FUNCTORCH_STACK_MATCH": "functorch transforms are not served",
    "DUAL_LEVEL": "forward-mode AD is not served",
    "BUILTIN_MATCH": "Python's builtins",
    "WEAKREF_ALIVE": "object lifetimes within one process",
    "DISPATCH_KEY_SET_MATCH": "tensors: the driver's checks",
    "TENSOR_SUBCLASS_METADATA_MATCH": "tensors: the driver's checks",
    "DTENSOR_SPEC_MATCH": "DTensor placements: distributed.py's checks",
    "FSDP_TRAINING_STATE": "FSDP is not served",
}
"""Guard kinds another check of the pair covers, with which."""

_LENGTH = {"SEQUENCE_LENGTH", "LIST_LENGTH", "TUPLE_ITERATOR_LEN", "LENGTH_CHECK"}
_KEYS = {"DICT_KEYS_MATCH", "DICT_KEYS", "MAPPING_KEYS_CHECK"}
_CONTAINS = {
    "DICT_CONTAINS": True,
    "SET_CONTAINS": True,
    "DICT_NOT_CONTAINS": False,
    "SET_NOT_CONTAINS": False,
}


def _class_id(cls: type) -> list[str]:
    return [cls.__module__, cls.__qualname__]


_IDENTITY_KINDS = (
    "CLASS_MATCH",
    "ID_MATCH",
    "MODULE_MATCH",
    "NN_MODULE",
    "CLOSURE_MATCH",
    "FUNCTION_MATCH",
)


def _check_for(kind: str, value: Any, guard, attr: str | None = None) -> tuple[str, Any]:
    """``(check kind, expected)`` for a guard of ``kind`` on ``value`` (the value the
    expression has at capture; ``attr``: a HASATTR guard's attribute name). Raises
    ValueError where a pair cannot check it."""
    kw = getattr(guard.create_fn, "keywords", None) or {}
    if kind in guard_sources.VALUE_KINDS or (
        kind in ("ID_MATCH",) and (value is None or type(value) is bool)
    ):
        return _value_check(value)
    if kind == "NUMPY_VALUE":
        import numpy as np

        if isinstance(value, np.generic) and literal_type(value.item()) is not None:
            return "npscalar", [type(value).__name__, value.item()]
        raise ValueError(
            f"it is a numpy {type(value).__name__} whose values the graph holds; pass it "
            "as a tensor argument"
        )
    if kind == "NOT_NONE_MATCH":
        return "notnone", None
    if kind == "TYPE_MATCH":
        return "type", _class_id(type(value))
    if kind in _IDENTITY_KINDS:
        return _identity_check(kind, value)
    if kind == "HASATTR":
        if attr is None:
            raise ValueError("its attribute name could not be read from the guard")
        return "hasattr", [attr, hasattr(value, attr)]
    if kind == "NOT_PRESENT_IN_GENERIC_DICT":
        return "absent", kw["attr"]
    if kind in _LENGTH:
        return "len", len(value)
    if kind in _KEYS:
        keys = list(value.keys())
        if literal_type(keys) is None:
            return "len", len(keys)
        return "keys", keys
    if kind in _CONTAINS:
        key = kw.get("key")
        if literal_type(key) is None:
            raise ValueError(f"its key is a {type(key).__qualname__}, which a pair cannot record")
        return "contains", [key, _CONTAINS[kind] != bool(kw.get("invert"))]  # (<= 2.12: invert=)
    if kind == "EMPTY_NN_MODULE_HOOKS_DICT":
        return "empty", None
    raise ValueError(f"a {kind} guard has no check a pair can run")


def _value_check(value: Any) -> tuple[str, Any]:
    """The check of a guard on a value (EQUALS_MATCH and its kin): compared with what it
    was, as a literal, an Enum member, a dtype, a device, a code fingerprint or a set."""
    import torch

    if isinstance(value, enum.Enum):
        return "enum", [*_class_id(type(value)), value.name]
    if isinstance(value, torch.dtype):
        return "dtype", str(value)
    if isinstance(value, torch.device):
        return "device", str(value)
    if isinstance(value, types.CodeType):
        return "code", code_fingerprint(value)
    if isinstance(value, (set, frozenset)) and all(literal_type(x) is not None for x in value):
        return "set", [type(value).__name__, sorted(value, key=repr)]
    if literal_type(value) is None:
        raise ValueError(f"its value is a {type(value).__qualname__}, which a pair cannot record")
    return "eq", value


def _identity_check(kind: str, value: Any) -> tuple[str, Any]:
    """The structural check that stands for an identity guard (an object's identity
    cannot be compared across processes): a module by name, a class by module and
    qualname, a function by its code's fingerprint, a Module by its class."""
    import torch

    if isinstance(value, types.ModuleType):
        return "module", value.__name__
    if isinstance(value, type):
        return "class", _class_id(value)
    if isinstance(value, enum.Enum):
        return "enum", [*_class_id(type(value)), value.name]
    if isinstance(value, (types.FunctionType, types.MethodType)):
        return "code", code_fingerprint(value)
    if isinstance(value, (types.BuiltinFunctionType, types.BuiltinMethodType)):
        return "builtin", [getattr(value, "__module__", None) or "", value.__qualname__]
    if isinstance(value, torch.dtype):
        return "dtype", str(value)
    if isinstance(value, torch.device):
        return "device", str(value)
    if isinstance(value, torch.nn.Module) or kind == "NN_MODULE":
        return "type", _class_id(type(value))
    if code_of(value)[0] is not None:  # a user Triton kernel (triton.jit, triton.autotune)
        return "code", code_fingerprint(value)
    raise ValueError(
        f"it relies on the identity of a {type(value).__qualname__}, which cannot be "
        "compared across processes"
    )


def _epoch_covered(check: str, value: Any, base: Any, expr: str) -> bool:
    """True where a change of the checked value must go through what moves the state
    epoch (templates/assumed_state.py): a submodule's class (the registration hooks),
    a module's hook dicts and bookkeeping dicts (their registration), an attribute
    absent from a module (its name is watched). Such checks run with the full check
    only; every value, function and container the trace read is checked per call."""
    import torch

    if check == "empty":
        return True
    last = re.search(r"\.(\w+)$", expr)
    if (
        isinstance(base, torch.nn.Module)
        and last
        and last.group(1) in guard_sources.module_internals()
        and check in ("type", "len", "keys", "contains")
    ):
        return True
    if check in ("type", "class") and isinstance(value, torch.nn.Module):
        # a registered submodule (replaced through the registration hooks) or an argument;
        # one in a plain dict, a list or a global is not: its holder's version covers it
        return re.fullmatch(r"\w+", expr) is not None or _registered_in(base, expr)
    if check == "class" and expr.endswith(".__class__") and isinstance(base, torch.nn.Module):
        return True  # (`__class__` is watched: assigning it moves the epoch)
    if check == "absent" and isinstance(value, torch.nn.Module):
        return True
    return check == "module"


def _registered_in(base: Any, expr: str) -> bool:
    """Whether ``expr`` reads a submodule in ``base._modules`` (``m.sub``, ``m._modules['sub']``)."""
    import torch

    step = re.search(r"(?:\._modules\[['\"]([^'\"]+)['\"]\]|\.(\w+))$", expr)
    if not isinstance(base, torch.nn.Module) or step is None:
        return False
    return (step.group(1) or step.group(2)) in base._modules


def warn_recorder_only_for_backward(target: str | None) -> None:
    """Say that a training step's Python state is checked by the recorder alone."""
    warn_at_caller(
        "the function runs a backward, which torch.compile(fullgraph=True) does not "
        "trace: the Python state it read is checked by the recorder only (the "
        "attributes, hooks and globals of docs/assumed_state.md)",
        target=target,
    )


def guard_checks(fn: Callable, args: tuple, kwargs: dict, *, target: str) -> dict | None:
    """The checks of the guards Dynamo builds for ``fn(*args, **kwargs)``.

    Returns:
        ``{"params": the function's parameter list as source text (``*args, **kwargs``
        with ``"wrapper": True``: Dynamo's frame was a decorator's wrapper), "roots": [[kind,
        ...]] (``_R``), "checks": [[label, check kind, expression, expected, per call
        (bool), file:line, the expression of the dict whose version covers it or None]],
        "watched": [attribute names whose assignment moves the state epoch],
        "by_identity": [the covering expressions each call evaluates again and compares by
        identity, dict_covers.covering_dict], "slots": [[object expression, attribute]]
        compared by identity per call (dict_covers.slots), "left": {guard kind: count}
        left to other checks}``; None where this torch cannot hand over its guards or
        the call runs a backward (the recorder's checks alone: a warning says so).
    Raises:
        CaptureError: Dynamo cannot trace the call in one graph, or a guard has no
            check a pair can run (the message names the source and its line).
    """
    try:
        params_text, params = _signature(fn, target)
    except (ValueError, TypeError):  # a builtin (torch.relu): no Python code, no Python state read
        return {
            "params": "*args, **kwargs",
            "wrapper": True,
            "roots": [],
            "checks": [],
            "watched": [],
            "by_identity": [],
            "slots": [],
            "left": {},
        }
    free = set(getattr(getattr(inspect.unwrap(fn), "__code__", None), "co_freevars", ()))
    if isinstance(fn, types.MethodType) or (
        not isinstance(fn, types.FunctionType) and hasattr(fn, "forward")
    ):
        free.add("self")  # a bound method's or a module's own state: the pair's constant
    fn_globals = guard_sources.globals_of(fn)
    names = set(fn_globals)  # Dynamo installs names of its own there while it traces
    traced: list[types.CodeType] = []
    entries = _entries(fn, args, kwargs, traced, target)
    if entries is None:
        return None
    roots = guard_sources.Roots(fn_globals, names)
    namespace = _namespace(fn, args, kwargs)
    wrapper = bool(_frame_locals(entries) - params - free)
    if wrapper:  # Dynamo's frame is a wrapper's (fn, *args, **kwargs): a decorated function,
        # a module's decorated forward; the callable itself is the pair's constant
        params_text, params = "*args, **kwargs", {"args", "kwargs"}
        free |= {"fn", "self", "func"}
        namespace = _namespace(fn, args, kwargs, wrapper=True)
    found = _Translated()
    found.inputs = graph_attrs.input_tensors(args, kwargs)
    found.roots = (fn, *graph_attrs.module_arguments(args, kwargs))
    for entry in entries:
        _translate(entry, found, roots, namespace, params, free, target)
    checks = _with_supplements(found.checks, namespace, roots, traced)
    class_attributes.add_instance_shadowing(
        checks, found.by_identity, found.watched, namespace, roots
    )
    class_attributes.add_absence_checks(checks, found.by_identity, namespace, roots)
    dict_covers.keep_dict_covers(checks, namespace, roots)
    failed = failing(checks, namespace, roots)
    if failed:
        raise CaptureError(
            f"a guard does not hold on the capture's own state: {failed[0]} (a bug: "
            "please report it)",
            target=target,
        )
    slots = _slots(checks, found.by_identity, namespace, roots)
    return {
        "params": params_text,
        "wrapper": wrapper,
        "roots": roots.records,
        "checks": checks,
        "watched": sorted(found.watched),
        "by_identity": sorted({c[6] for c in checks if c[6] in found.by_identity}),
        "slots": slots,
        "left": dict(sorted(found.left.items())),
    }


def _entries(fn: Callable, args: tuple, kwargs: dict, traced: list, target: str) -> list | None:
    """Dynamo's guard entries for the call (dynamo_collect.collect), or None where the
    recorder's checks must do (a warning says why)."""
    try:
        with dynamo_collect.without_dynamic_marks(args, kwargs):
            return dynamo_collect.collect(fn, args, kwargs, traced)
    except Exception as e:  # noqa: BLE001 - Dynamo's refusal, named in the message
        first = str(e).split("\n")[0]
        if not dynamo_collect.has_guard_filter():
            warn_at_caller(
                "this torch has no guard_filter_fn (torch.compile's guards cannot be read): "
                "the Python state the call read is checked by the recorder only "
                "(docs/assumed_state.md)",
                target=target,
            )
            return None
        if "backward" in first or "autograd" in first:  # a training step: no backward in
            warn_recorder_only_for_backward(target)  # Dynamo's graph
            return None
        raise CaptureError(
            "torch.compile(fullgraph=True) cannot trace this function in one graph, so the "
            "Python values the trace read cannot all be checked per call: "
            f"{dynamo_collect.first_line(e)}. Make the function traceable in one graph (the "
            'message names the line), or pass options={"guards": "recorded"} to check only '
            "what the recorder sees (docs/assumed_state.md)",
            target=target,
        ) from None


class _Translated:
    """What the guard entries translate to, gathered entry by entry."""

    def __init__(self) -> None:
        self.checks: list[list] = []
        self.left: dict[str, int] = {}  # guard kind -> how many other checks cover
        self.watched: set[str] = set()
        self.seen: set[tuple] = set()
        self.by_identity: set[str] = set()  # covers a call evaluates again (covering_dict)
        self.inputs: set[int] = set()  # ids of the tensors the pair takes per call
        self.roots: tuple = ()  # the function and its module arguments (their tensors' names)


def _not_an_input(entry: Any, out: _Translated, roots, namespace, params, free, target) -> None:
    """Refuse a tensor Dynamo guarded that no served call passes (a global, a plain tensor
    attribute, a global module's parameter): its values at capture would be built in."""
    import torch

    try:
        rewritten = guard_sources.rewrite(entry.name, roots, params, free)
        if rewritten is None:  # (the pair's own: a module captured as the function)
            return
        expr, label = rewritten
        value = guard_sources.evaluate(expr, namespace, roots)
    except Exception:  # noqa: BLE001 - a path that is no value of its own: left to the driver
        return
    if (
        isinstance(value, torch.Tensor)
        and id(value) not in out.inputs
        and graph_attrs.memory_key(value) not in out.inputs
    ):
        where = dynamo_collect.user_line(entry.orig_guard)
        names = graph_attrs.reachable_tensors(out.roots)  # (named as graph_attrs names them)
        named = names.get(id(value)) or names.get(graph_attrs.memory_key(value) or 0) or label
        raise CaptureError(
            f"the function reads a tensor that is not an input ({named}"
            f"{', read at ' + where if where else ''}): a global, a closed-over tensor or an "
            "attribute that is not a registered parameter/buffer, whose values at capture "
            "would be built into the pair. Register it on the module (register_buffer) or "
            "pass it as an argument",
            target=target,
        )


def _translate(
    entry: Any,
    out: _Translated,
    roots: guard_sources.Roots,
    namespace: dict,
    params: set[str],
    free: set[str],
    target: str,
) -> None:
    """Add the check of one guard entry to ``out`` (or count it as left to others).

    Raises:
        CaptureError: the guard has no check a pair can run.
    """
    kind = entry.guard_type
    name = entry.name
    if kind == "TENSOR_MATCH" and name.startswith("___from_numpy(") and name.endswith(")"):
        kind, name = "NUMPY_VALUE", name[len("___from_numpy(") : -1]  # Dynamo's input, our constant
    if kind == "TENSOR_MATCH" and name:
        _not_an_input(entry, out, roots, namespace, params, free, target)
    torch_fn = guard_sources.torch_function(name, kind, roots)
    if (kind in LEFT_TO_OTHERS and not torch_fn) or not name:
        out.left[kind] = out.left.get(kind, 0) + 1
        return
    where = dynamo_collect.user_line(entry.orig_guard)
    kw = getattr(entry.orig_guard.create_fn, "keywords", None) or {}
    attr = kw.get("attr")
    if kind == "HASATTR" and attr is None:  # torch <= 2.12 names the attribute itself: base.attr
        split = re.match(r"^(.*)[.]([A-Za-z0-9_]+)$", name)
        if split:
            name, attr = split.group(1, 2)
    try:
        rewritten = torch_fn[:2] if torch_fn else guard_sources.rewrite(name, roots, params, free)
        if rewritten is None:
            return
        expr, label = rewritten
        value = guard_sources.evaluate(expr, namespace, roots)
        if torch_fn:  # (a torch function read off its module: named, not hashed)
            expr, check, expected = (
                torch_fn[2],
                "eq",
                guard_sources.evaluate(torch_fn[2], namespace, roots),
            )
        elif guard_sources.through_torch(
            expr, namespace, roots
        ) or guard_sources.module_bookkeeping(expr, namespace, roots, kind):
            out.left["torch's own classes"] = out.left.get("torch's own classes", 0) + 1
            return
        else:
            check, expected = _check_for(kind, value, entry.orig_guard, attr)
    except (ValueError, KeyError, SyntaxError) as err:
        raise CaptureError(
            f"the trace relies on {name} ({kind}{', read at ' + where if where else ''}), and "
            f"{err}. Pass it as an argument, or make it a plain value (bool, int, float, str, "
            "None, a tuple of them, a torch.dtype), then capture again",
            target=target,
        ) from None
    key = (check, expr, repr(expected))
    if key in out.seen:
        return
    out.seen.add(key)
    if check == "absent":
        out.watched.add(expected)
    if check == "hasattr":
        out.watched.add(expected[0])
    if check == "class" and expr.endswith(".__class__"):
        out.watched.add("__class__")
    base = guard_sources.base_of(expr, namespace, roots)
    epoch = _epoch_covered(check, value, base, expr)
    found = None if epoch else dict_covers.covering_dict(check, expr, value, base, namespace, roots)
    if torch_fn:  # (its module's dict holds it)
        found = (f"{torch_fn[0].rpartition('.')[0]}.__dict__", False)
    cover = found[0] if found else None
    if found and found[1]:
        out.by_identity.add(found[0])
    out.checks.append([label, check, expr, expected, not epoch and cover is None, where, cover])


def _with_supplements(
    checks: list[list], namespace: dict, roots: guard_sources.Roots, traced: list
) -> list[list]:
    """``checks`` and what class_attributes.py adds where Dynamo guards less than a pair
    needs (class attributes on older torch, the methods the trace called, defaults,
    shadowing), each check once."""

    def adding(more: list[list]) -> None:
        known = {(c[1], c[2]) for c in checks}
        checks.extend(c for c in more if (c[1], c[2]) not in known)

    adding(class_attributes.checks(checks, namespace, roots, dynamo_collect.collect))
    checks = class_attributes.inherited_per_call(checks, namespace, roots)
    adding(class_attributes.called_methods(checks, namespace, roots, set(traced)))
    adding(class_attributes.function_defaults(checks, namespace, roots, dynamo_collect.collect))
    adding(class_attributes.shadowing(checks, namespace, roots))
    return checks


def _slots(
    checks: list[list], by_identity: set[str], namespace: dict, roots: guard_sources.Roots
) -> list[list[str]]:
    """``guards["slots"]``: the ``[object expression, attribute]`` pairs on the paths of
    the checks a dict's version covers that can be rebound in place (dict_covers.slots),
    each once. A check covered by a dict met again per call (by identity) whose path has
    one runs per call instead (``checks`` is changed in place)."""
    out: dict[tuple[str, str], None] = {}
    for c in checks:
        found = dict_covers.slots(c[1], c[2]) if c[6] is not None else []
        if found and c[6] in by_identity:
            c[4], c[6] = True, None
            continue
        for expr, attr in found:
            try:
                getattr(guard_sources.evaluate(expr, namespace, roots), attr)
            except ValueError:  # an empty cell: compared as empty
                pass
            except Exception:  # noqa: BLE001 - none to compare (a Triton kernel's code is its .fn's)
                continue
            out[(expr, attr)] = None
    return [list(k) for k in out]


def kept_after(record: dict, fn: Callable, args: tuple, kwargs: dict) -> dict:
    """``record`` less the checks that no longer hold after the trace ran the function:
    values the function itself changes (a call counter) are its state, not assumptions."""
    namespace = _namespace(fn, args, kwargs, wrapper=record.get("wrapper", False))
    roots = guard_sources.resolver(record["roots"])
    out = [c for c in record["checks"] if not _fails(c, namespace, roots)]
    on_paths = {s for c in out if c[6] is not None for s in dict_covers.slots(c[1], c[2])}
    return {
        **record,
        "checks": out,
        "by_identity": [e for e in record.get("by_identity", ()) if any(c[6] == e for c in out)],
        "slots": [s for s in record.get("slots", ()) if tuple(s) in on_paths],
    }


def failing(checks: list, namespace: dict, roots) -> list[str]:
    """The labels of ``checks`` that do not hold in ``namespace``."""
    resolver = roots if callable(roots) else guard_sources.resolver(roots.records)
    return [c[0] for c in checks if _fails(c, namespace, resolver)]


def _fails(check: list, namespace: dict, resolver) -> bool:
    from ..templates.guard_values import holds

    try:
        value = eval(
            check[2],
            {"__builtins__": __builtins__, "_R": resolver(), **guard_sources.helpers()},
            namespace,
        )  # noqa: S307
    except Exception:  # noqa: BLE001 - a path that no longer resolves fails the check
        return True
    return not holds(check[1], value, check[3])


def _frame_locals(entries: list) -> set[str]:
    """The local names Dynamo's guards start from (``m`` in ``m.cfg.temp``, ``L['m']``)."""
    out: set[str] = set()
    for e in entries:
        try:
            tree = ast.parse(e.name, mode="eval")
        except SyntaxError:
            continue
        for n in ast.walk(tree):
            if (
                isinstance(n, ast.Subscript)
                and isinstance(n.value, ast.Name)
                and n.value.id == "L"
                and isinstance(n.slice, ast.Constant)
                and isinstance(n.slice.value, str)
            ):
                out.add(n.slice.value)
            elif (
                isinstance(n, ast.Name)
                and n.id not in ("G", "L")
                and not n.id.startswith("__")
                and n.id not in guard_sources.BUILTINS
            ):
                out.add(n.id)
    return out


def _namespace(fn: Callable, args: tuple, kwargs: dict, wrapper: bool = False) -> dict:
    """The function's parameters bound to the call's arguments, defaults applied; with
    ``wrapper``, the names of Dynamo's wrapper frame (``fn``, ``args``, ``kwargs``)."""
    if wrapper:
        return {"args": args, "kwargs": kwargs, "fn": fn}
    target = fn.forward if hasattr(fn, "forward") and not isinstance(fn, types.FunctionType) else fn
    sig = inspect.signature(target)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    if isinstance(target, types.MethodType):
        out["self"] = target.__self__
    return out


def _signature(fn: Callable, target: str) -> tuple[str, set[str]]:
    """The function's parameter list as source text (defaults that are not literals
    become ``_NODEFAULT``), and the names it binds."""
    sig = inspect.signature(fn)
    parts, names = [], set()
    saw_star = False
    for p in sig.parameters.values():
        names.add(p.name)
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            saw_star = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
            continue
        if p.kind is p.KEYWORD_ONLY and not saw_star:
            parts.append("*")
            saw_star = True
        text = p.name
        if p.default is not p.empty:
            text += "=" + (repr(p.default) if literal_type(p.default) is not None else "_NODEFAULT")
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY and not any(
            q.kind is q.POSITIONAL_ONLY for q in list(sig.parameters.values())[len(parts) :]
        ):
            parts.append("/")
    return ", ".join(parts), names
