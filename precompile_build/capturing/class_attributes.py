"""Checks of the class attributes an older Dynamo reads without a guard.

torch 2.11's Dynamo reads a class attribute (``Consts.K``, ``type(self).SCALE``) as a
constant and installs no guard on it: torch.compile itself then serves the stale
value after ``Consts.K = 4.0`` (torch 2.13 guards it with ``CONSTANT_MATCH``). A pair
built there would answer for the captured value with no word, so where a probe shows
the torch in hand misses such guards, every plain class attribute of a user class the
trace reached (a class the guards check, the class of a checked instance) is checked
as dynamo_guards.py checks a value: more than the trace read, never less.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ..templates.guard_values import literal_type
from . import guard_sources


class _Probe:
    K = 1.0


def _probe_fn(x):
    return x * _Probe.K


@functools.cache
def dynamo_guards_them(collect: Callable[[Callable, tuple, dict], list]) -> bool:
    """Whether this torch's Dynamo guards a class attribute it read (a ``CONSTANT_MATCH``
    or ``EQUALS_MATCH`` on ``_Probe.K``), asked through ``collect`` (dynamo_guards.py's:
    the guard entries of a call); one probe compile per process."""
    import torch

    entries = collect(_probe_fn, (torch.ones(1),), {})
    return any(e.name.endswith("_Probe'].K") or e.name.endswith("_Probe.K") for e in entries
               if e.guard_type in guard_sources.VALUE_KINDS)


def _user_class(cls: type) -> bool:
    module = getattr(cls, "__module__", "") or ""
    return cls is not object and module not in ("builtins", "types", "abc", "enum", "typing") \
        and module.split(".")[0] not in ("torch", "functools", "collections")


def checks(found: list[list], namespace: dict, roots: guard_sources.Roots,
           collect: Callable[[Callable, tuple, dict], list]) -> list[list]:
    """The checks (dynamo_guards.py's shape: label, "eq", expression, value, per call,
    where, cover) of the plain attributes of the user classes that ``found`` checks by
    class (``class``) or reaches as an instance's class (``type``); none where Dynamo
    guards class attributes itself (:func:`dynamo_guards_them`, asked through ``collect``)."""
    if dynamo_guards_them(collect):
        return []
    out: list[list] = []
    seen: set[str] = set()
    for label, kind, expr, _expected, _per_call, where, _cover in found:
        if kind not in ("class", "type"):
            continue
        cls_expr, cls_label = (expr, label) if kind == "class" else (f"type({expr})", f"type({label})")
        try:
            cls: Any = guard_sources.evaluate(cls_expr, namespace, roots)
        except Exception:  # noqa: BLE001 - a path that no longer resolves: nothing to add
            continue
        if not isinstance(cls, type) or not _user_class(cls) or cls_expr in seen:
            continue
        seen.add(cls_expr)
        names: dict[str, bool] = {}  # name -> defined in the class's own dict
        for klass in cls.__mro__:
            if not _user_class(klass):
                continue
            for name, value in vars(klass).items():
                if not name.startswith("__") and name not in names and literal_type(value) is not None:
                    names[name] = klass is cls
        for name, own in names.items():
            value = getattr(cls, name)
            if literal_type(value) is None:
                continue
            cover = f"_g_type_dict({cls_expr})" if own else None
            out.append([f"{cls_label}.{name}", "eq", f"{cls_expr}.{name}", value, cover is None, where, cover])
    return out
