"""Which dict's version stands for a guard's check between full checks.

A check whose value lives in a dict reached from a model argument or a module (an
object's or a class's ``__dict__``, a plain dict, a module's globals) holds as long as
that dict's version (``torch._C._dynamo.guards.dict_version``: every write moves it)
has not moved: templates/guards.py compares the versions per call and runs the full
check when one moved (docs/assumed_state.md, "Cost"). Where no such dict exists (a
list on the way, an argument that may be another object next call), the check runs
per call.
"""

from __future__ import annotations

import ast
import collections
import types
from typing import Any

import torch

from ..templates.guard_values import _g_type_dict
from . import guard_sources


def covering_dict(
    check: str, expr: str, value: Any, base: Any, namespace: dict, roots: guard_sources.Roots
) -> tuple[str, bool] | None:
    """The dict whose version (``torch._C._dynamo.guards.dict_version``: any write moves
    it, ``obj.__dict__[k] = v`` and ``object.__setattr__`` too) tells that the checked
    value cannot have changed, as ``(expression, by_identity)``, or None (the check runs
    per call).

    The nearest holder of the value on its path: a plain dict it is an item of, the
    ``__dict__`` of the object or module it is an attribute of, a class's dict. A
    function's defaults, closure cells and code on the way (a library function's
    ``__defaults__``) count as held by the function's holder; what can be rebound in
    place on the way (``nonlocal``, ``f.__defaults__ = ...``) is compared by identity
    per call besides (:func:`slots`). The length or items of a list or set and the key
    order of an OrderedDict have no version: per call.

    ``by_identity`` is False where the path runs from a module argument, a module or a
    class through dicts only: the dict found at the full check is the one later calls
    meet while their models are the same (templates/guards.py keys its versions by the
    models). It is True where the path starts at another argument (a request's cache may
    be another object next call) or passes an item of a list: each call evaluates the
    expression again and compares the dict's identity and version, and the class of the
    object it belongs to, which therefore also covers a ``type`` check of that object."""
    found = _holder(check, expr, value, namespace, roots)
    if (
        found is None
        and check == "type"
        and type(getattr(value, "__dict__", None)) is dict
        and not isinstance(value, type)
    ):
        return (
            f"({expr}).__dict__",
            True,
        )  # reached through a list or an argument: its class compared per call
    return found


_PLAIN = (dict, collections.OrderedDict)
_CONTENTS = ("len", "keys", "contains", "empty")  # checks of a container's contents


def _holder(
    check: str, expr: str, value: Any, namespace: dict, roots: guard_sources.Roots
) -> tuple[str, bool] | None:
    """:func:`covering_dict` before its ``type`` rule: the holder of ``expr``'s value
    (:func:`_own_holder`, else the nearest one on its path: :func:`_holder_above`) and
    whether it is compared by identity (:func:`_by_identity`), or None."""
    node = ast.parse(expr, mode="eval").body
    if (
        check in _CONTENTS
        and type(value) not in (*_PLAIN, tuple)
        and type(value).__name__ != "mappingproxy"
    ):
        return None  # a list's or a set's contents move no version
    if check == "keys" and isinstance(value, collections.OrderedDict):
        return None  # (move_to_end reorders it and moves no version)
    holder = _own_holder(check, expr, value, node)
    if holder is None:
        holder = _holder_above(node, value, namespace, roots)
    if holder is None:
        return None
    if holder.startswith("_g_type_dict("):
        return holder, False  # a class: protected by the type check of whatever reached it
    by_identity = _by_identity(holder, namespace, roots)
    return None if by_identity is None else (holder, by_identity)


def _own_holder(check: str, expr: str, value: Any, node: ast.expr) -> str | None:
    """The dict a check of ``value`` itself reads: a plain dict's (or a class's
    mappingproxy's) contents, the ``__dict__`` an attribute's absence is checked in."""
    if check in _CONTENTS and type(value) in _PLAIN:
        return expr
    if (
        check in _CONTENTS
        and type(value).__name__ == "mappingproxy"
        and isinstance(node, ast.Attribute)
        and node.attr == "__dict__"
    ):
        return f"_g_type_dict({ast.unparse(node.value)})"  # a class's own names (type(m).__mro__[1].__dict__)
    if check in ("absent", "hasattr"):
        return (
            f"({expr}).__dict__"
            if isinstance(getattr(value, "__dict__", None), dict) and not isinstance(value, type)
            else None
        )
    return None


def _holder_above(
    node: ast.expr, value: Any, namespace: dict, roots: guard_sources.Roots
) -> str | None:
    """The nearest dict on the path of ``node`` that holds its value: walked up from
    the expression past ``type(x)`` and a function's internals; None where a part on
    the way is no value of its own or no dict holds it."""
    n = node
    while True:
        if isinstance(n, ast.Call) and len(n.args) == 1:  # type(x): the class, not a holder
            n = n.args[0]
            continue
        if isinstance(n, ast.Call) and generic_getattr(n):  # object.__getattribute__(x, 'a'): x.a
            parent, attr = (
                n.args[0],
                getattr(n.args[1], "value", ""),
            )  # (past x's class's own __getattribute__)
            try:
                p = guard_sources.evaluate(ast.unparse(parent), namespace, roots)
            except Exception:  # noqa: BLE001 - a part that is no value of its own
                return None
            if attr == "__dict__" and type(value) is dict:
                return ast.unparse(n)  # (the object's dict itself)
            if not (isinstance(getattr(p, "__dict__", None), dict) and attr in p.__dict__):
                return None
            return f"object.__getattribute__({ast.unparse(parent)}, '__dict__')"
        if not isinstance(n, (ast.Attribute, ast.Subscript)):
            return None
        parent = n.value
        try:
            p = guard_sources.evaluate(ast.unparse(parent), namespace, roots)
        except Exception:  # noqa: BLE001 - a part that is no value of its own
            return None
        if isinstance(p, type):
            if isinstance(n, ast.Attribute) and n.attr not in vars(p):
                return None  # inherited: a base's dict holds it, and the class's own may shadow it
            return f"_g_type_dict({ast.unparse(parent)})"
        if isinstance(n, ast.Subscript) and type(p) in _PLAIN:
            return ast.unparse(parent)
        if (
            isinstance(n, ast.Subscript)
            and type(p).__name__ == "mappingproxy"
            and isinstance(parent, ast.Attribute)
            and parent.attr == "__dict__"  # (a class's; any other proxy's dict is no class's)
            and isinstance(
                guard_sources.evaluate(ast.unparse(parent.value), namespace, roots), type
            )
        ):
            return f"_g_type_dict({ast.unparse(parent.value)})"
        if (
            isinstance(n, ast.Attribute)
            and isinstance(getattr(p, "__dict__", None), dict)
            and n.attr in p.__dict__
        ):
            return f"({ast.unparse(parent)}).__dict__"
        if not (
            isinstance(
                p, (tuple, types.CellType, types.FunctionType, types.MethodType, types.CodeType)
            )
            or isinstance(n, ast.Attribute)
            and n.attr
            in (
                "__defaults__",
                "__closure__",
                "__code__",
                "__kwdefaults__",
                "cell_contents",
                "fget",
            )
        ):
            return None
        n = parent  # a function's internals: held where the function is (rebound in place:
        # the slots compared per call, slots())


def _by_identity(holder: str, namespace: dict, roots: guard_sources.Roots) -> bool | None:
    """Whether each call evaluates ``holder`` again and compares the dict's identity:
    a list on its path, or a path from another argument than a module; None where a
    container on the way cannot be evaluated (the check runs per call)."""
    by_identity = False
    for part in ast.walk(ast.parse(holder, mode="eval").body):  # a list on the way: by identity
        if isinstance(part, ast.Subscript) and not (
            isinstance(part.value, ast.Name) and part.value.id == "_R"
        ):
            try:  # (an item replaced in one moves no version)
                container = guard_sources.evaluate(ast.unparse(part.value), namespace, roots)
            except Exception:  # noqa: BLE001 - unresolvable: per call
                return None
            if (
                type(container) not in (*_PLAIN, tuple)
                and type(container).__name__ != "mappingproxy"
                and not isinstance(container, types.ModuleType)
            ):
                by_identity = True
    root = ast.parse(holder, mode="eval").body
    while isinstance(root, (ast.Attribute, ast.Subscript, ast.Call)):
        root = (
            root.value
            if not isinstance(root, ast.Call)
            else root.args[0]
            if len(root.args) == 1 or generic_getattr(root)
            else root.func
        )
    if (
        isinstance(root, ast.Name)
        and root.id != "_R"
        and not isinstance(namespace.get(root.id), torch.nn.Module)
    ):
        by_identity = True  # another argument: maybe another object next call
    return by_identity


# what can be rebound in place on a function (its defaults, code) or a closure cell,
# moving no dict's version
_SLOT_ATTRS = ("__defaults__", "__kwdefaults__", "__code__", "cell_contents")


def slots(check: str, expr: str) -> list[tuple[str, str]]:
    """``[(object expression, attribute)]`` on the path of ``expr`` that can be rebound
    in place without moving a dict's version: a function's ``__defaults__``,
    ``__kwdefaults__`` and ``__code__``, a closure cell's ``cell_contents`` (a
    ``nonlocal`` assignment in a function sharing the cell); the code of a function a
    ``code`` check compares. templates/guards.py keeps what each held at the full check
    and compares it by identity per call (Dynamo checks these values on every call)."""
    node = ast.parse(expr, mode="eval").body
    out = [
        (ast.unparse(n.value), n.attr)
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and n.attr in _SLOT_ATTRS
    ]
    if check == "code" and not (isinstance(node, ast.Attribute) and node.attr == "__code__"):
        out.append((expr, "__code__"))
    return out


def generic_getattr(node: ast.AST) -> bool:
    """Whether ``node`` is ``object.__getattribute__(x, 'name')`` (how Dynamo reads an
    attribute past a class's own ``__getattribute__``, a transformers config's)."""
    return (
        isinstance(node, ast.Call)
        and ast.unparse(node.func) == "object.__getattribute__"
        and len(node.args) == 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    )


def keep_dict_covers(checks: list, namespace: dict, roots: guard_sources.Roots) -> None:
    """A check whose covering expression gives no plain dict here runs per call instead."""
    ok: dict[str, bool] = {}
    for c in checks:
        if c[6] is None:
            continue
        if c[6] not in ok:
            try:
                d = eval(
                    c[6],
                    {
                        "__builtins__": __builtins__,
                        "_R": guard_sources.resolver(roots.records)(),  # noqa: S307
                        "_g_type_dict": _g_type_dict,
                        **guard_sources.helpers(),
                    },
                    namespace,
                )
                ok[c[6]] = type(d).__name__ in ("dict", "OrderedDict")
            except Exception:  # noqa: BLE001 - a path that does not resolve: per call
                ok[c[6]] = False
        if not ok[c[6]]:
            c[4], c[6] = True, None
