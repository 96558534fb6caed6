"""Dynamo's guard sources as expressions a pair evaluates at serving time.

A guard names what it checks by a source: ``L['m'].cfg.temp`` (a local: the captured
function's parameter), ``G['GAIN']`` (a global of its module), ``type(m).SCALE``,
``m.post.__closure__[0].cell_contents``. :func:`rewrite` turns a source into an
expression over the function's parameters and ``_R`` (the roots: modules and module-level
classes and functions, resolved by name where the pair is served:
templates/guard_values.py's ``resolve_roots``), or says that the source starts from the
pair's constants (the capture script's globals, the function's closure, a module's or
bound method's own state) or from torch's own modules. The other functions evaluate such
expressions on the capture's state (dynamo_guards.py keeps a check only where it holds)
and tell torch's bookkeeping from the model's state.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import types
from typing import Any, Callable

import torch

from ..templates import guard_values
from ..templates.guard_values import resolve_roots

VALUE_KINDS = {
    "CONSTANT_MATCH",
    "EQUALS_MATCH",
    "BOOL_MATCH",
    "NONE_MATCH",
    "CONSTANT_SUBCLASS_MATCH",
    "DICT_VERSION",
}
"""The guard kinds that compare a value (dynamo_guards.py's "eq" checks)."""

_HELPERS = {
    "___odict_getitem": "_g_odict_getitem",
    "___dataclass_fields": "_g_dataclass_fields",
    "___namedtuple_fields": "_g_namedtuple_fields",
}
BUILTINS = {"type", "dict", "list", "len", "getattr", "tuple", "id", "str", "int", "object"}
# torch and Triton: the compiler stack a pair assumes as validated (Dynamo's guards on
# their internals, `triton.cdiv`'s code, would make the serving process import Triton)
_COMPILER_ROOT = re.compile(r"^__import_(?:torch|triton)(_dot_|$)")


def compiler_stack(module: str) -> bool:
    """Whether ``module`` is torch's or Triton's (or one of their submodules)."""
    return module.split(".")[0] in ("torch", "triton")


class Roots:
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
            if _COMPILER_ROOT.match(name):
                return None
            mod = name[len("__import_") :].replace("_dot_", ".")
            return f"_R[{self._root(['module', mod], mod)}]"
        value = self.fn_globals.get(name)
        if isinstance(value, types.ModuleType):
            if compiler_stack(value.__name__):
                return None
            return f"_R[{self._root(['module', value.__name__], value.__name__)}]"
        if self.module != "__main__" and isinstance(self.module, str):
            return f"_R[{self._root(['module', self.module], self.module)}].{name}"
        owner = getattr(value, "__module__", None)
        qual = getattr(value, "__qualname__", None)
        if (
            isinstance(value, (type, types.FunctionType))
            and isinstance(owner, str)
            and owner != "__main__"
            and isinstance(qual, str)
            and "<locals>" not in qual
        ):
            return f"_R[{self._root(['qualname', owner, qual], owner + '.' + qual)}]"
        return None  # the capture script's own value: the pair's constant


def rewrite(
    name: str, roots: Roots, params: set[str], free: frozenset[str] | set[str] = frozenset()
) -> tuple[str, str] | None:
    """``(expression over _R and the parameters, label)`` for Dynamo's source name
    ``name``, or None where it starts from the pair's constants or torch's modules.
    Raises ValueError where it names something a pair cannot reach."""
    tree = ast.parse(name, mode="eval")
    dropped = False

    class Rewriter(ast.NodeTransformer):
        def visit_Subscript(self, node):  # noqa: N802 - ast's name
            nonlocal dropped
            base = node.value
            if (
                isinstance(base, ast.Name)
                and base.id in ("G", "L")
                and isinstance(node.slice, ast.Constant)
                and isinstance(node.slice.value, str)
            ):
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
            if (
                isinstance(f, ast.Name)
                and f.id == "dict"
                and len(node.args) == 1
                and not node.keywords
                and isinstance(node.args[0], ast.Attribute)
                and node.args[0].attr == "__dict__"
            ):
                return self.visit(
                    node.args[0]
                )  # a class's __dict__ read in place, not copied per call
            if (
                isinstance(f, ast.Name)
                and f.id == "__import__"
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                mod = node.args[0].value
                if compiler_stack(mod):
                    dropped = True
                    return node
                return ast.copy_location(
                    ast.parse(f"_R[{roots._root(['module', mod], mod)}]", mode="eval").body, node
                )
            return self.generic_visit(node)

        def visit_Name(self, node):  # noqa: N802
            nonlocal dropped
            if (
                node.id in free and node.id not in params
            ):  # the function's closure: the pair's constant
                dropped = True
                return node
            if node.id in _HELPERS:
                return ast.copy_location(ast.Name(id=_HELPERS[node.id], ctx=ast.Load()), node)
            if (
                node.id not in params
                and node.id not in BUILTINS
                and node.id not in ("G", "L", "_R")
            ):
                raise ValueError(f"the name {node.id!r} is no parameter of the function")
            return node

    expr = ast.unparse(Rewriter().visit(tree))
    if dropped:
        return None
    label = re.sub(r"_R\[(\d+)\]", lambda m: roots.labels[int(m.group(1))], expr)
    return expr, readable(label)


_MODULE_DICTS = re.compile(r"\._(?:modules|parameters|buffers)\[(['\"])([^'\"]+)\1\]")


_TORCH_FUNCTION = re.compile(r"^G\[['\"](\w+)['\"]\]((?:\.\w+)+)$")
_FUNCTION_KINDS = ("CLOSURE_MATCH", "FUNCTION_MATCH", "BUILTIN_MATCH", "ID_MATCH")


def torch_function(name: str, kind: str, roots: Roots) -> tuple[str, str, str] | None:
    """``(expression, label, check)`` for Dynamo's identity guard on a function read as an
    attribute of one of torch's modules (``G['F'].silu``, ``G['torch'].sigmoid``,
    ``G['torch'].nn.functional.silu``), which :func:`rewrite` drops with the module; None
    for any other guard. The check compares what names the function (its type, module,
    qualname and code name: a replacement, even one made with ``functools.wraps``,
    differs) rather than its code's hash, which moves between torch releases; the dict of
    the module that holds it covers it per call, as Dynamo's guard catches
    ``F.silu = other``."""
    found = _TORCH_FUNCTION.match(name)
    if kind not in _FUNCTION_KINDS or found is None:
        return None
    key, path = found.group(1), found.group(2)[1:].split(".")
    if key.startswith("__import_"):
        module = key[len("__import_") :].replace("_dot_", ".") if _COMPILER_ROOT.match(key) else ""
        holder = sys.modules.get(module)
    else:
        holder = roots.fn_globals.get(key)
    for attr in path[:-1]:  # (torch.nn.functional.silu: the module that holds silu)
        holder = getattr(holder, attr, None)
    if (
        not isinstance(holder, types.ModuleType)
        or sys.modules.get(holder.__name__) is not holder  # (torch.ops.aten: no importable module)
        or not (holder.__name__ == "torch" or holder.__name__.startswith("torch."))
    ):
        return None
    module, attr = holder.__name__, path[-1]
    expr = f"_R[{roots._root(['module', module], module)}].{attr}"
    check = (
        f"[type({expr}).__name__, getattr({expr}, '__module__', None), "
        f"getattr({expr}, '__qualname__', None), "
        f"getattr(getattr({expr}, '__code__', None), 'co_name', None)]"
    )
    return expr, f"{module}.{attr}", check


def readable(label: str) -> str:
    """``m._modules['layers']._modules['0']`` as ``m.layers[0]``: the model's own names."""
    return _MODULE_DICTS.sub(
        lambda m: f"[{m.group(2)}]" if m.group(2).isdigit() else f".{m.group(2)}", label
    )


def helpers() -> dict:
    return {v: getattr(guard_values, v) for v in _HELPERS.values()}


def module_bookkeeping(expr: str, namespace: dict, roots: Roots, kind: str) -> bool:
    """True for a value guard on nn.Module's own bookkeeping (``_non_persistent_buffers_set``,
    ``_state_dict_hooks``): its parameters, buffers and submodules are the driver's
    checks, and its hook dicts are checked by their own guards."""
    last = re.search(r"\.(\w+)$", expr)
    if kind not in VALUE_KINDS or not last or last.group(1) not in module_internals():
        return False
    return isinstance(base_of(expr, namespace, roots), torch.nn.Module)


def module_internals() -> frozenset[str]:
    return frozenset(vars(torch.nn.Module()))


def base_of(expr: str, namespace: dict, roots: Roots) -> Any:
    """The object the last attribute or item of ``expr`` is read from (None: none)."""
    node = ast.parse(expr, mode="eval").body
    if not isinstance(node, (ast.Attribute, ast.Subscript)):
        return None
    try:
        return evaluate(ast.unparse(node.value), namespace, roots)
    except Exception:  # noqa: BLE001 - no base to speak of
        return None


def through_torch(expr: str, namespace: dict, roots: Roots) -> bool:
    """True where ``expr`` reaches its value through a class or module of torch's own
    (``type(m.lin).__mro__[1].__dict__``): torch's internals, not the model's state."""
    tree = ast.parse(expr, mode="eval").body
    for node in ast.walk(tree):
        if node is tree or not isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
            continue
        try:
            v = evaluate(ast.unparse(node), namespace, roots)
        except Exception:  # noqa: BLE001 - a part that is no value of its own
            continue
        name = (
            v.__name__
            if isinstance(v, types.ModuleType)
            else v.__module__
            if isinstance(v, type)
            else ""
        )
        if compiler_stack(name):
            return True
    return False


def evaluate(expr: str, namespace: dict, roots: Roots) -> Any:
    return eval(
        expr,
        {"__builtins__": __builtins__, "_R": resolver(roots.records)(), **helpers()},
        namespace,
    )  # noqa: S307


def resolver(records: list) -> Callable[[], list]:
    return lambda: resolve_roots(records)


def globals_of(fn: Callable) -> dict:
    """The globals Dynamo's ``G[...]`` names: those of the function's code (a module's
    or a bound method's: its class's ``forward``)."""
    f = inspect.unwrap(fn)
    if isinstance(f, types.MethodType):
        f = f.__func__
    if not isinstance(f, types.FunctionType):
        f = getattr(type(f), "forward", None)
    return getattr(f, "__globals__", {}) or {}
