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
import contextlib
import enum
import inspect
import re
import types
from typing import Any, Callable

from ..errors import CaptureError, warn_at_caller
from ..templates.guard_values import code_fingerprint, literal_type

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

_VALUE = {"CONSTANT_MATCH", "EQUALS_MATCH", "BOOL_MATCH", "NONE_MATCH", "CONSTANT_SUBCLASS_MATCH",
          "DICT_VERSION"}
_LENGTH = {"SEQUENCE_LENGTH", "LIST_LENGTH", "TUPLE_ITERATOR_LEN", "LENGTH_CHECK"}
_KEYS = {"DICT_KEYS_MATCH", "DICT_KEYS", "MAPPING_KEYS_CHECK"}
_CONTAINS = {"DICT_CONTAINS": True, "SET_CONTAINS": True, "DICT_NOT_CONTAINS": False, "SET_NOT_CONTAINS": False}
_HELPERS = {"___odict_getitem": "_g_odict_getitem", "___dataclass_fields": "_g_dataclass_fields",
            "___namedtuple_fields": "_g_namedtuple_fields"}
_BUILTINS = {"type", "dict", "list", "len", "getattr", "tuple", "id", "str", "int", "object"}
_TORCH_ROOT = re.compile(r"^__import_torch(_dot_|$)")


class _Collected(Exception):
    """Raised from the guard filter once Dynamo handed over the guards: nothing runs."""


def _user_line(guard) -> str:
    stack: Any = getattr(guard, "user_stack", None) or getattr(guard, "stack", None)
    try:
        frame = stack[-1]
        return f"{frame.filename}:{frame.lineno}"
    except (TypeError, IndexError, AttributeError):
        return ""


def collect(fn: Callable, args: tuple, kwargs: dict) -> list:
    """The guard entries (torch's ``GuardFilterEntry``) Dynamo builds for
    ``fn(*args, **kwargs)`` traced as one graph; the function does not run.

    Raises:
        the exception Dynamo raised where it cannot trace the call in one graph
        (``torch._dynamo.exc.Unsupported`` and friends).
    """
    import torch
    import torch._dynamo

    box: list = []

    def keep(entries):
        box.extend(entries)
        raise _Collected

    def backend(gm, _example):
        return gm.forward

    compiled = torch.compile(fn, backend=backend, fullgraph=True,
                             options={"guard_filter_fn": keep})
    patch = torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True,
                                       suppress_errors=False)
    try:
        with patch, _quiet_dynamo():
            compiled(*args, **kwargs)
    except Exception as e:  # Dynamo wraps what the filter raised
        if not box:
            raise _root_cause(e) from None
    return box


@contextlib.contextmanager
def _quiet_dynamo():
    import logging

    log = logging.getLogger("torch._dynamo")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None and not isinstance(e, _Collected):
        e = e.__cause__
    return e


class _Roots:
    """The roots the checks' expressions start from: Dynamo's ``G['X']`` (a global of
    the captured function's module) as ``_R[k]`` or ``_R[k].X``, where ``_R`` holds
    modules and module-level classes and functions, resolved at serving time by name
    (templates/guard_values.py's ``resolve_roots``)."""

    def __init__(self, fn_globals: dict, names: set[str] | None = None):
        self.fn_globals = fn_globals
        self.names = set(fn_globals) if names is None else names  # before Dynamo installs its own
        self.module = fn_globals.get("__name__")
        self.records: list[list] = []
        self.labels: list[str] = []
        self.exprs: dict[str, str | None] = {}

    def _root(self, record: list, label: str) -> int:
        if record in self.records:
            return self.records.index(record)
        self.records.append(record)
        self.labels.append(label)
        return len(self.records) - 1

    def expression(self, name: str) -> str | None:
        """The expression for global ``name`` of the captured function, or None where
        it is the pair's constant (a value of the capture script), a builtin, or
        torch's own module."""
        if name not in self.exprs:
            self.exprs[name] = self._expression(name)
        return self.exprs[name]

    def _expression(self, name: str) -> str | None:
        if name.startswith(("__builtins_dict__", "___")):  # builtins; Dynamo's own installed names
            return None
        if not name.startswith("__import_") and name not in self.names:
            return None  # a constant Dynamo installed in the module for its graph
        if name.startswith("__import_"):
            if _TORCH_ROOT.match(name):
                return None
            mod = name[len("__import_"):].replace("_dot_", ".")
            return f"_R[{self._root(['module', mod], mod)}]"
        value = self.fn_globals.get(name)
        if isinstance(value, types.ModuleType):
            if value.__name__ == "torch" or value.__name__.startswith("torch."):
                return None
            return f"_R[{self._root(['module', value.__name__], value.__name__)}]"
        if self.module != "__main__" and isinstance(self.module, str):
            return f"_R[{self._root(['module', self.module], self.module)}].{name}"
        owner = getattr(value, "__module__", None)
        qual = getattr(value, "__qualname__", None)
        if isinstance(value, (type, types.FunctionType)) and isinstance(owner, str) and owner != "__main__" \
                and isinstance(qual, str) and "<locals>" not in qual:
            return f"_R[{self._root(['qualname', owner, qual], owner + '.' + qual)}]"
        return None  # the capture script's own value: the pair's constant


def _rewrite(name: str, roots: _Roots, params: set[str], free: frozenset[str] | set[str] = frozenset()) -> tuple[str, str] | None:
    """``(expression over _R and the parameters, label)`` for Dynamo's source name
    ``name``, or None where it starts from the pair's constants or torch's modules.
    Raises ValueError where it names something a pair cannot reach."""
    tree = ast.parse(name, mode="eval")
    dropped = False

    class Rewriter(ast.NodeTransformer):
        def visit_Subscript(self, node):  # noqa: N802 - ast's name
            nonlocal dropped
            base = node.value
            if isinstance(base, ast.Name) and base.id in ("G", "L") and isinstance(node.slice, ast.Constant) \
                    and isinstance(node.slice.value, str):
                key = node.slice.value
                if base.id == "L":
                    if key not in params:
                        raise ValueError(f"the local {key!r} is no parameter of the function")
                    return ast.copy_location(ast.Name(id=key, ctx=ast.Load()), node)
                text = roots.expression(key)
                if text is None:
                    dropped = True
                    return node
                return ast.copy_location(ast.parse(text, mode="eval").body, node)
            return self.generic_visit(node)

        def visit_Call(self, node):  # noqa: N802
            nonlocal dropped
            f = node.func
            if isinstance(f, ast.Name) and f.id == "__import__" and len(node.args) == 1 \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                mod = node.args[0].value
                if mod == "torch" or mod.startswith("torch."):
                    dropped = True
                    return node
                return ast.copy_location(ast.parse(f"_R[{roots._root(['module', mod], mod)}]", mode="eval").body,
                                         node)
            return self.generic_visit(node)

        def visit_Name(self, node):  # noqa: N802
            nonlocal dropped
            if node.id in free and node.id not in params:  # the function's closure: the pair's constant
                dropped = True
                return node
            if node.id in _HELPERS:
                return ast.copy_location(ast.Name(id=_HELPERS[node.id], ctx=ast.Load()), node)
            if node.id not in params and node.id not in _BUILTINS and node.id not in ("G", "L", "_R"):
                raise ValueError(f"the name {node.id!r} is no parameter of the function")
            return node

    expr = ast.unparse(Rewriter().visit(tree))
    if dropped:
        return None
    label = re.sub(r"_R\[(\d+)\]", lambda m: roots.labels[int(m.group(1))], expr)
    return expr, _readable(label)


_MODULE_DICTS = re.compile(r"\._(?:modules|parameters|buffers)\[(['\"])([^'\"]+)\1\]")


def _readable(label: str) -> str:
    """``m._modules['layers']._modules['0']`` as ``m.layers[0]``: the model's own names."""
    return _MODULE_DICTS.sub(lambda m: f"[{m.group(2)}]" if m.group(2).isdigit() else f".{m.group(2)}", label)


def _class_id(cls: type) -> list[str]:
    return [cls.__module__, cls.__qualname__]


def _check_for(kind: str, value: Any, guard) -> tuple[str, Any]:
    """``(check kind, expected)`` for a guard of ``kind`` on ``value`` (the value the
    expression has at capture). Raises ValueError where a pair cannot check it."""
    import torch

    kw = getattr(guard.create_fn, "keywords", None) or {}
    if kind in _VALUE or (kind in ("ID_MATCH",) and (value is None or type(value) is bool)):
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
    if kind == "NUMPY_VALUE":
        import numpy as np

        if isinstance(value, np.generic) and literal_type(value.item()) is not None:
            return "npscalar", [type(value).__name__, value.item()]
        raise ValueError(f"it is a numpy {type(value).__name__} whose values the graph holds; pass it "
                         "as a tensor argument")
    if kind == "NOT_NONE_MATCH":
        return "notnone", None
    if kind == "TYPE_MATCH":
        return "type", _class_id(type(value))
    if kind in ("CLASS_MATCH", "ID_MATCH", "MODULE_MATCH", "NN_MODULE", "CLOSURE_MATCH", "FUNCTION_MATCH"):
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
        raise ValueError(f"it relies on the identity of a {type(value).__qualname__}, which cannot be "
                         "compared across processes")
    if kind == "HASATTR":
        return "hasattr", [kw["attr"], hasattr(value, kw["attr"])]
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
        return "contains", [key, _CONTAINS[kind]]
    if kind == "EMPTY_NN_MODULE_HOOKS_DICT":
        return "empty", None
    raise ValueError(f"a {kind} guard has no check a pair can run")


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
    if isinstance(base, torch.nn.Module) and last and last.group(1) in _module_internals() \
            and check in ("type", "len", "keys", "contains"):
        return True
    if check in ("type", "class") and isinstance(value, torch.nn.Module):
        return True
    if check == "absent" and isinstance(value, torch.nn.Module):
        return True
    return check == "module"


def guard_checks(fn: Callable, args: tuple, kwargs: dict, *, target: str) -> dict | None:
    """The checks of the guards Dynamo builds for ``fn(*args, **kwargs)``.

    Returns:
        ``{"params": the function's parameter list as source text, "roots": [[kind,
        ...]] (``_R``), "checks": [[label, check kind, expression, expected, per call
        (bool), file:line]], "watched": [attribute names whose assignment moves the
        state epoch], "left": {guard kind: count} left to other checks}``.
    Raises:
        CaptureError: Dynamo cannot trace the call in one graph, or a guard has no
            check a pair can run (the message names the source and its line).
    """
    params_text, params = _signature(fn, target)
    free = set(getattr(getattr(inspect.unwrap(fn), "__code__", None), "co_freevars", ()))
    if isinstance(fn, types.MethodType) or (not isinstance(fn, types.FunctionType) and hasattr(fn, "forward")):
        free.add("self")  # a bound method's or a module's own state: the pair's constant, as a closure
    fn_globals = _globals_of(fn)
    names = set(fn_globals)  # Dynamo installs names of its own there while it traces
    try:
        entries = collect(fn, args, kwargs)
    except Exception as e:  # noqa: BLE001 - Dynamo's refusal, named in the message
        first = str(e).split("\n")[0]
        if not _has_guard_filter():
            warn_at_caller("this torch has no guard_filter_fn (torch.compile's guards cannot be read): "
                           "the Python state the call read is checked by the recorder only "
                           "(docs/assumed_state.md)", target=target)
            return None
        if "backward" in first or "autograd" in first:  # a training step: Dynamo's graph has no backward
            warn_at_caller("the function runs a backward, which torch.compile(fullgraph=True) does not "
                           "trace: the Python state it read is checked by the recorder only (the "
                           "attributes, hooks and globals of docs/assumed_state.md)", target=target)
            return None
        raise CaptureError(
            "torch.compile(fullgraph=True) cannot trace this function in one graph, so the Python "
            f"values the trace read cannot all be checked per call: {_first_line(e)}. Make the "
            "function traceable in one graph (the message names the line), or pass "
            "options={\"guards\": \"recorded\"} to check only what the recorder sees "
            "(docs/assumed_state.md)", target=target) from None
    roots = _Roots(fn_globals, names)
    namespace = _namespace(fn, args, kwargs)
    checks: list[list] = []
    left: dict[str, int] = {}
    watched: set[str] = set()
    seen: set[tuple] = set()
    for entry in entries:
        kind = entry.guard_type
        name = entry.name
        if kind == "TENSOR_MATCH" and name.startswith("___from_numpy(") and name.endswith(")"):
            kind, name = "NUMPY_VALUE", name[len("___from_numpy("):-1]  # Dynamo's graph input, our constant
        if kind in LEFT_TO_OTHERS or not name:
            left[kind] = left.get(kind, 0) + 1
            continue
        where = _user_line(entry.orig_guard)
        try:
            rewritten = _rewrite(name, roots, params, free)
            if rewritten is None:
                continue
            expr, label = rewritten
            value = _evaluate(expr, namespace, roots)
            if _through_torch(expr, namespace, roots) or _module_bookkeeping(expr, namespace, roots, kind):
                left["torch's own classes"] = left.get("torch's own classes", 0) + 1
                continue
            check, expected = _check_for(kind, value, entry.orig_guard)
        except (ValueError, KeyError, SyntaxError) as err:
            raise CaptureError(
                f"the trace relies on {name} ({kind}{', read at ' + where if where else ''}), and "
                f"{err}. Pass it as an argument, or make it a plain value (bool, int, float, str, "
                "None, a tuple of them, a torch.dtype), then capture again", target=target) from None
        key = (check, expr, repr(expected))
        if key in seen:
            continue
        seen.add(key)
        if check == "absent":
            watched.add(expected)
        if check == "hasattr":
            watched.add(expected[0])
        base = _base_of(expr, namespace, roots)
        checks.append([label, check, expr, expected, not _epoch_covered(check, value, base, expr), where])
    failed = failing(checks, namespace, roots)
    if failed:
        raise CaptureError(f"a guard does not hold on the capture's own state: {failed[0]} (a bug: "
                           "please report it)", target=target)
    return {"params": params_text, "roots": roots.records, "checks": checks, "watched": sorted(watched),
            "left": dict(sorted(left.items()))}


def kept_after(record: dict, fn: Callable, args: tuple, kwargs: dict) -> dict:
    """``record`` less the checks that no longer hold after the trace ran the function:
    values the function itself changes (a call counter) are its state, not assumptions."""
    namespace = _namespace(fn, args, kwargs)
    roots = _resolver(record["roots"])
    out = [c for c in record["checks"] if not _fails(c, namespace, roots)]
    return {**record, "checks": out}


def failing(checks: list, namespace: dict, roots) -> list[str]:
    """The labels of ``checks`` that do not hold in ``namespace``."""
    resolver = roots if callable(roots) else _resolver(roots.records)
    return [c[0] for c in checks if _fails(c, namespace, resolver)]


def _fails(check: list, namespace: dict, resolver) -> bool:
    from ..templates.guard_values import holds

    try:
        value = eval(check[2], {"__builtins__": __builtins__, "_R": resolver(), **_helpers()}, namespace)  # noqa: S307
    except Exception:  # noqa: BLE001 - a path that no longer resolves fails the check
        return True
    return not holds(check[1], value, check[3])


def _helpers() -> dict:
    from ..templates import guard_values

    return {v: getattr(guard_values, v) for v in _HELPERS.values()}


def _module_bookkeeping(expr: str, namespace: dict, roots: _Roots, kind: str) -> bool:
    """True for a value guard on nn.Module's own bookkeeping (``_non_persistent_buffers_set``,
    ``_state_dict_hooks``): its parameters, buffers and submodules are the driver's
    checks, and its hook dicts are checked by their own guards."""
    import torch

    last = re.search(r"\.(\w+)$", expr)
    if kind not in _VALUE or not last or last.group(1) not in _module_internals():
        return False
    return isinstance(_base_of(expr, namespace, roots), torch.nn.Module)


def _module_internals() -> frozenset[str]:
    import torch

    return frozenset(vars(torch.nn.Module()))


def _base_of(expr: str, namespace: dict, roots: _Roots) -> Any:
    """The object the last attribute or item of ``expr`` is read from (None: none)."""
    node = ast.parse(expr, mode="eval").body
    if not isinstance(node, (ast.Attribute, ast.Subscript)):
        return None
    try:
        return _evaluate(ast.unparse(node.value), namespace, roots)
    except Exception:  # noqa: BLE001 - no base to speak of
        return None


def _through_torch(expr: str, namespace: dict, roots: _Roots) -> bool:
    """True where ``expr`` reaches its value through a class or module of torch's own
    (``type(m.lin).__mro__[1].__dict__``): torch's internals, not the model's state."""
    tree = ast.parse(expr, mode="eval").body
    for node in ast.walk(tree):
        if node is tree or not isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            continue
        try:
            v = _evaluate(ast.unparse(node), namespace, roots)
        except Exception:  # noqa: BLE001 - a part that is no value of its own
            continue
        name = v.__name__ if isinstance(v, types.ModuleType) else v.__module__ if isinstance(v, type) else ""
        if name == "torch" or name.startswith("torch."):
            return True
    return False


def _evaluate(expr: str, namespace: dict, roots: _Roots) -> Any:
    return eval(expr, {"__builtins__": __builtins__, "_R": _resolver(roots.records)(), **_helpers()}, namespace)  # noqa: S307


def _resolver(records: list) -> Callable[[], list]:
    from ..templates.guard_values import resolve_roots

    return lambda: resolve_roots(records)


def _namespace(fn: Callable, args: tuple, kwargs: dict) -> dict:
    """The function's parameters bound to the call's arguments, defaults applied."""
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
                q.kind is q.POSITIONAL_ONLY for q in list(sig.parameters.values())[len(parts):]):
            parts.append("/")
    return ", ".join(parts), names


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    where = next((line.strip() for line in text if "File " in line or ", line " in line), "")
    return first + (f" ({where})" if where else "")


def _has_guard_filter() -> bool:
    """Whether this torch hands guards to a ``guard_filter_fn`` (torch 2.8 and later)."""
    import torch._dynamo.types

    return hasattr(torch._dynamo.types, "GuardFilterEntry")


def in_process_group() -> bool:
    """True inside an initialised torch.distributed process group: a rank's call is
    traced with its collectives by export or make_fx alone (its Python state is checked
    by assumed_state.py's recording; docs/assumed_state.md)."""
    import torch

    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_count(record: dict | None) -> int:
    """How many Python-state checks a pair's guard record holds (0 where none)."""
    return len(record["checks"]) if record else 0


def _globals_of(fn: Callable) -> dict:
    """The globals Dynamo's ``G[...]`` names: those of the function's code (a module's
    or a bound method's: its class's ``forward``)."""
    f = inspect.unwrap(fn)
    if isinstance(f, types.MethodType):
        f = f.__func__
    if not isinstance(f, types.FunctionType):
        f = getattr(type(f), "forward", None)
    return getattr(f, "__globals__", {}) or {}
