"""Checks of class-level and function-level state that Dynamo reads without a guard.

Methods the trace called (:func:`called_methods`): Dynamo inlines them and guards what
they read, never which function each was, on every torch this project supports.
Function defaults on torch 2.11 (:func:`function_defaults`). And class attributes:

torch 2.11's Dynamo reads a class attribute (``Consts.K``, ``type(self).SCALE``) as a
constant and installs no guard on it: torch.compile itself then serves the stale
value after ``Consts.K = 4.0`` (torch 2.13 guards it with ``CONSTANT_MATCH``). A pair
built there would answer for the captured value with no word, so where a probe shows
the torch in hand misses such guards, every plain class attribute of a user class the
trace reached (a class the guards check, the class of a checked instance) is checked
as dynamo_guards.py checks a value: more than the trace read, never less.
"""

from __future__ import annotations

import ast
import functools
import inspect
import types
from typing import Any, Callable

import torch

from ..templates.guard_values import code_fingerprint, code_of, literal_type
from . import dict_covers, guard_sources


class _Probe:
    K = 1.0


def _probe_fn(x):
    return x * _Probe.K


@functools.cache
def dynamo_guards_them(collect: Callable[[Callable, tuple, dict], list]) -> bool:
    """Whether this torch's Dynamo guards a class attribute it read (a ``CONSTANT_MATCH``
    or ``EQUALS_MATCH`` on ``_Probe.K``), asked through ``collect`` (dynamo_guards.py's:
    the guard entries of a call); one probe compile per process."""
    entries = collect(_probe_fn, (torch.ones(1),), {})
    return any(
        e.name.endswith("_Probe'].K") or e.name.endswith("_Probe.K")
        for e in entries
        if e.guard_type in guard_sources.VALUE_KINDS
    )


def _probe_scaled(y, by=2.0):
    return y * by


def _probe_defaults_fn(x):
    return _probe_scaled(x)


@functools.cache
def dynamo_guards_defaults(collect: Callable[[Callable, tuple, dict], list]) -> bool:
    """Whether this torch's Dynamo guards a called function's default it read (a guard
    on ``_probe_scaled.__defaults__``; torch 2.11's reads it as a constant, unguarded),
    asked through ``collect``; one probe compile per process."""
    entries = collect(_probe_defaults_fn, (torch.ones(1),), {})
    return any("__defaults__" in e.name for e in entries)


def function_defaults(
    found: list[list],
    namespace: dict,
    roots: guard_sources.Roots,
    collect: Callable[[Callable, tuple, dict], list],
) -> list[list]:
    """On a torch whose Dynamo reads a called function's defaults unguarded
    (:func:`dynamo_guards_defaults`), the checks of the defaults of each function
    ``found`` checks by its code: ``expr.__defaults__`` and ``expr.__kwdefaults__``
    against their values where these are literals, covered as the function's check
    is. More than the trace read, never less; none on a torch that guards them."""
    if dynamo_guards_defaults(collect):
        return []
    out: list[list] = []
    for label, kind, expr, _expected, per_call, where, cover in found:
        if kind != "code":
            continue
        try:
            fn: Any = guard_sources.evaluate(expr, namespace, roots)
        except Exception:  # noqa: BLE001 - a path that no longer resolves: nothing to add
            continue
        fn = getattr(fn, "__func__", fn)
        for attr in ("__defaults__", "__kwdefaults__"):
            value = getattr(fn, attr, None) if isinstance(fn, types.FunctionType) else None
            if value is not None and literal_type(value) is not None:
                out.append(
                    [f"{label}.{attr}", "eq", f"{expr}.{attr}", value, per_call, where, cover]
                )
    return out


def _user_class(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return (
        cls is not object
        and module not in ("builtins", "types", "abc", "enum", "typing")
        and module.split(".")[0] not in ("torch", "functools", "collections")
    )


def checks(
    found: list[list],
    namespace: dict,
    roots: guard_sources.Roots,
    collect: Callable[[Callable, tuple, dict], list],
) -> list[list]:
    """The checks (dynamo_guards.py's shape: label, "eq", expression, value, per call,
    where, cover) of the plain attributes of the user classes that ``found`` checks by
    class (``class``) or reaches as an instance's class (``type``); none where Dynamo
    guards class attributes itself (:func:`dynamo_guards_them`, asked through ``collect``)."""
    if dynamo_guards_them(collect):
        return []
    out: list[list] = []
    seen: set[type] = set()
    for label, kind, expr, _expected, _per_call, where, _cover in found:
        if kind not in ("class", "type"):
            continue
        cls_expr, cls_label = (
            (expr, label) if kind == "class" else (f"type({expr})", f"type({label})")
        )
        try:
            cls: Any = guard_sources.evaluate(cls_expr, namespace, roots)
        except Exception:  # noqa: BLE001 - a path that no longer resolves: nothing to add
            continue
        if not isinstance(cls, type) or not _user_class(cls) or cls in seen:
            continue  # (a class reached twice: checked through the first path)
        seen.add(cls)
        names: dict[str, None] = {}  # (ordered)
        for klass in cls.__mro__:
            if not _user_class(klass):
                continue
            for name, value in vars(klass).items():
                if not name.startswith("__") and literal_type(value) is not None:
                    names.setdefault(name)
        for name in names:
            value = getattr(cls, name)
            if literal_type(value) is not None:
                out += (
                    through_class_dicts(
                        f"{cls_label}.{name}", "eq", cls_expr, cls, name, value, where
                    )
                    or []
                )
    return out


def called_methods(
    found: list[list], namespace: dict, roots: guard_sources.Roots, traced: set[types.CodeType]
) -> list[list]:
    """The checks (dynamo_guards.py's shape) of the methods the trace called on the classes
    that ``found`` checks (``class``) or reaches as an instance's class (``type``): each
    method, property getter, static or class method of a user class whose code Dynamo
    traced (``traced``: the tracing context's code objects) is checked by its code
    where the class resolves it (``type(x).__mro__[k].__dict__['name']``), covered by
    that class's dict version. Dynamo inlines such a method and guards what it read,
    not which function it was: ``Cls.method = other`` after the capture would serve
    the captured method's graph (torch.compile itself does, on torch 2.11 to 2.14)."""
    out: list[list] = []
    seen: set[type] = set()
    for label, kind, expr, _expected, _per_call, where, _cover in found:
        if kind not in ("class", "type"):
            continue
        cls_expr, cls_label = (
            (expr, label) if kind == "class" else (f"type({expr})", f"type({label})")
        )
        try:
            cls: Any = guard_sources.evaluate(cls_expr, namespace, roots)
        except Exception:  # noqa: BLE001 - a path that no longer resolves: nothing to add
            continue
        if not isinstance(cls, type) or cls in seen:
            continue
        seen.add(cls)
        resolved: set[str] = set()
        for k, klass in enumerate(cls.__mro__):
            for name, value in vars(klass).items():
                if name in resolved:
                    continue  # (shadowed by a class before: not what the call resolved)
                resolved.add(name)
                getter = isinstance(value, property)
                if (
                    not _user_class(klass)
                    or code_of(value.fget if getter else value)[0] not in traced
                ):
                    continue
                path = f"{cls_expr}.__mro__[{k}].__dict__[{name!r}]" + (".fget" if getter else "")
                out.append(
                    [
                        f"{cls_label}.{name}",
                        "code",
                        path,
                        code_fingerprint(value.fget if getter else value),
                        False,
                        where,
                        f"_g_type_dict({cls_expr}.__mro__[{k}])",
                    ]
                )
    return out


def through_class_dicts(
    label: str, kind: str, cls_expr: str, cls: type, name: str, expected: Any, where: str
) -> list[list] | None:
    """The checks of the class attribute ``cls.name`` (``cls_expr`` evaluates to ``cls``),
    each covered by a class's dict version, so that none runs per call: the value on
    the class whose own dict defines it (``cls.__mro__[k]``), and for each class before
    it in the method resolution order, that it defines no ``name`` of its own (an
    assignment there would shadow it). None where no class of the MRO holds the value
    itself (a descriptor, a metaclass attribute): the caller keeps its per-call check."""
    mro = cls.__mro__
    k = next((i for i, klass in enumerate(mro) if name in vars(klass)), None)
    if k is None or vars(mro[k])[name] is not getattr(cls, name):
        return None
    if k == 0:
        return [
            [label, kind, f"{cls_expr}.{name}", expected, False, where, f"_g_type_dict({cls_expr})"]
        ]
    out = [
        [
            label,
            kind,
            f"{cls_expr}.__mro__[{k}].{name}",
            expected,
            False,
            where,
            f"_g_type_dict({cls_expr}.__mro__[{k}])",
        ]
    ]
    for j in range(k):  # (no class before the definer may shadow it)
        out.append(
            [
                f"{label} (inherited from {mro[k].__qualname__}): {mro[j].__qualname__}'s own {name}",
                "eq",
                f"({name!r} in {cls_expr}.__mro__[{j}].__dict__)",
                False,
                False,
                where,
                f"_g_type_dict({cls_expr}.__mro__[{j}])",
            ]
        )
    return out


def inherited_per_call(
    checks: list[list], namespace: dict, roots: guard_sources.Roots
) -> list[list]:
    """``checks`` with each per-call check of an inherited class attribute (Dynamo's
    ``type(m).X`` where a base defines ``X``) replaced by :func:`through_class_dicts`'s."""
    out: list[list] = []
    for c in checks:
        label, kind, expr, expected, per_call, where, _cover = c
        head, dot, name = expr.rpartition(".")
        new = None
        if per_call and dot and name.isidentifier() and not name.startswith("__"):
            try:
                cls = guard_sources.evaluate(head, namespace, roots)
            except Exception:  # noqa: BLE001 - a path that is no class: as it was
                cls = None
            if isinstance(cls, type) and name not in vars(cls):
                new = through_class_dicts(label, kind, head, cls, name, expected, where)
        out += new or [c]
    return out


def shadowing(checks: list[list], namespace: dict, roots: guard_sources.Roots) -> list[list]:
    """For each check that reads a class attribute where a base defines it (Dynamo's
    ``type(x).__mro__[k].__dict__['name']``, on any class: a request object's, a cache's),
    the checks that no class before that base in the method resolution order defines
    ``name`` of its own (an assignment there would shadow it), each covered by that
    class's dict version: none runs per call."""
    out: list[list] = []
    seen: set[tuple[str, int, str]] = set()
    for label, _kind, expr, _expected, _per_call, where, *_cover in checks:
        for node in ast.walk(ast.parse(expr, mode="eval").body):
            found = _mro_item(node)
            if found is None or found in seen:
                continue
            seen.add(found)
            cls_expr, k, name = found
            try:
                cls = guard_sources.evaluate(cls_expr, namespace, roots)
            except Exception:  # noqa: BLE001 - a path that is no class: nothing to add
                continue
            if not isinstance(cls, type) or not 0 < k < len(cls.__mro__):
                continue
            for j in range(k):
                if name in vars(cls.__mro__[j]):
                    break  # (not what the trace resolved: leave it to the checks it has)
                out.append(
                    [
                        f"{label} (defined on {cls.__mro__[k].__qualname__}): "
                        f"{cls.__mro__[j].__qualname__}'s own {name}",
                        "eq",
                        f"({name!r} in {cls_expr}.__mro__[{j}].__dict__)",
                        False,
                        False,
                        where,
                        f"_g_type_dict({cls_expr}.__mro__[{j}])",
                    ]
                )
    return out


def _dict_item(node: ast.AST) -> tuple[ast.expr, str] | None:
    """``(OWNER, 'name')`` of ``OWNER.__dict__['name']``, else None."""
    if not (
        isinstance(node, ast.Subscript)
        and isinstance(node.slice, ast.Constant)
        and isinstance(node.slice.value, str)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "__dict__"
    ):
        return None
    return node.value.value, node.slice.value


def _mro_item(node: ast.AST) -> tuple[str, int, str] | None:
    """``(class expression, k, name)`` of ``CLS.__mro__[k].__dict__['name']``, else None."""
    found = _dict_item(node)
    if found is None:
        return None
    mro, name = found
    if not (
        isinstance(mro, ast.Subscript)
        and isinstance(mro.slice, ast.Constant)
        and isinstance(mro.slice.value, int)
        and isinstance(mro.value, ast.Attribute)
        and mro.value.attr == "__mro__"
    ):
        return None
    return ast.unparse(mro.value.value), mro.slice.value, name


def add_instance_shadowing(
    checks: list[list],
    by_identity: set[str],
    watched: set[str],
    namespace: dict,
    roots: guard_sources.Roots,
) -> None:
    """Add to ``checks`` that no class attribute the trace read is shadowed on its
    instance (:func:`instance_shadowing`), covered by the instance dict's version as an
    attribute's absence is (dict_covers.covering_dict); the covers a call evaluates
    again go to ``by_identity``, the names to ``watched`` (dynamo_guards.guard_checks)."""
    known = {(c[1], c[2]) for c in checks}
    for label, obj_expr, name, where in instance_shadowing(checks, namespace, roots):
        expr = f"({name!r} in ({obj_expr}).__dict__)"
        if ("eq", expr) in known:
            continue
        obj = guard_sources.evaluate(obj_expr, namespace, roots)
        cover = dict_covers.covering_dict("absent", obj_expr, obj, None, namespace, roots)
        if cover and cover[1]:
            by_identity.add(cover[0])
        watched.add(name)  # (a plain setattr on a module moves the epoch)
        checks.append([label, "eq", expr, False, cover is None, where, cover[0] if cover else None])


def add_absence_checks(
    checks: list[list],
    by_identity: set[str],
    namespace: dict,
    roots: guard_sources.Roots,
) -> None:
    """Add to ``checks`` what an attribute's absence (Dynamo's ``hasattr(x, 'name')`` that
    was False) rests on besides the instance's dict, each covered by a dict's version so
    that none runs per call: that no class of ``type(x).__mro__`` defines ``name`` (torch's
    own classes too: ``nn.Module.name = v`` makes it present), and for an ``nn.Module``,
    that ``name`` is in none of its ``_parameters``, ``_buffers``, ``_modules`` (what
    ``Module.__getattr__`` looks in; a direct ``m._buffers['name'] = t`` registers
    nothing). Covers a call evaluates again go to ``by_identity``."""
    known = {(c[1], c[2]) for c in checks}
    for label, kind, expr, expected, _per_call, where, _cover in list(checks):
        if kind != "hasattr" or expected[1] is not False:
            continue
        name = expected[0]
        try:
            obj = guard_sources.evaluate(expr, namespace, roots)
        except Exception:  # noqa: BLE001 - a path that is no value: nothing to add
            continue
        if isinstance(obj, type):
            continue  # (a class's absence: its own metaclass chain, left to Dynamo's guard)
        holders: list[tuple[str, str | None]] = [
            (f"type({expr}).__mro__[{j}].__dict__", f"_g_type_dict(type({expr}).__mro__[{j}])")
            for j, klass in enumerate(type(obj).__mro__)
            if not klass.__flags__ & _IMMUTABLE_TYPE  # (object, builtins: cannot change)
        ]
        if isinstance(obj, torch.nn.Module):
            holders += [(f"({expr}).{d}", None) for d in ("_parameters", "_buffers", "_modules")]
        for holder, cover in holders:
            check = f"({name!r} in {holder})"
            if ("eq", check) in known:
                continue
            known.add(("eq", check))
            if cover is None:
                value = guard_sources.evaluate(holder, namespace, roots)
                found = dict_covers.covering_dict("contains", holder, value, obj, namespace, roots)
                if found and found[1]:
                    by_identity.add(found[0])
                cover = found[0] if found else None
            checks.append(
                [f"{label}: no {name} in {holder}", "eq", check, False, cover is None, where, cover]
            )


_IMMUTABLE_TYPE = 1 << 8  # Py_TPFLAGS_IMMUTABLETYPE (CPython's Include/object.h)


def instance_shadowing(
    checks: list[list], namespace: dict, roots: guard_sources.Roots
) -> list[tuple[str, str, str, str]]:
    """For each check that reads a class attribute of an instance's class (Dynamo's
    ``type(x).__dict__['name']`` or ``type(x).__mro__[k].__dict__['name']``) that an
    entry of the instance's own ``__dict__`` would shadow (no data descriptor such as a
    property), ``(label, instance expression, name, file:line)``: the pair checks that
    ``name`` stays out of the instance's dict (``x.__dict__['name'] = v`` or
    ``object.__setattr__(x, 'name', v)`` would shadow it), each once."""
    out: list[tuple[str, str, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for label, _kind, expr, _expected, _per_call, where, *_cover in checks:
        for node in ast.walk(ast.parse(expr, mode="eval").body):
            found = _instance_class_item(node)
            if found is None or found in seen:
                continue
            seen.add(found)
            obj_expr, name = found
            try:
                obj = guard_sources.evaluate(obj_expr, namespace, roots)
            except Exception:  # noqa: BLE001 - a path that is no value: nothing to add
                continue
            if isinstance(obj, type) or type(getattr(obj, "__dict__", None)) is not dict:
                continue  # a class (its own dict is checked), or no instance dict (slots)
            attr = inspect.getattr_static(type(obj), name, None)
            if hasattr(type(attr), "__set__") or name in obj.__dict__:
                continue  # a data descriptor wins over the instance dict; already shadowed
            out.append((f"{label}: no {name} of its own on the instance", obj_expr, name, where))
    return out


def _instance_class_item(node: ast.AST) -> tuple[str, str] | None:
    """``(x, name)`` of ``type(x).__dict__['name']`` or ``type(x).__mro__[k].__dict__['name']``."""
    found = _dict_item(node)
    if found is None:
        return None
    cls, name = found
    if (
        isinstance(cls, ast.Subscript)
        and isinstance(cls.value, ast.Attribute)
        and cls.value.attr == "__mro__"
    ):
        cls = cls.value.value
    if not (
        isinstance(cls, ast.Call)
        and isinstance(cls.func, ast.Name)
        and cls.func.id == "type"
        and len(cls.args) == 1
    ):
        return None
    return ast.unparse(cls.args[0]), name
