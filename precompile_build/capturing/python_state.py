"""Python state a captured call changes: found by comparing snapshots.

A pair replays the call's tensor work; its Python code ran once, at capture (the
trace, then the real call), and never runs when the pair is served. So a function
that appends to a module-level list, bumps a global or closure counter, or sets an
attribute on a plain object does so at capture only. :func:`snapshot` records,
cheaply and without copying anything, the state such code can reach:

- the globals each reached function names (``co_names``: read, rebound or called
  through) and its closure cells, for the captured function and the user-code
  functions it names (followed :data:`MAX_FUNCTIONS` deep in all), and for the
  ``forward`` of the user-code ``nn.Module`` classes among the arguments;
- of each such value: scalars and tuples of them by value, lists/dicts/sets by
  identity and length, other objects by identity, and a plain object's ``__dict__``
  entry by entry (the same tokens);
- the arguments that are plain objects or containers, and the non-tensor
  attributes of the user-code modules among them.

"User code" is any file outside torch, the standard library and site-packages:
library modules (transformers' and timm's caches) are not looked into.
:func:`changes` compares two snapshots and names each change, with the line of
the reached code that names it where there is one. What it cannot see: an item
replaced in a container (same length), state reached only through objects
deeper than one attribute, state of library code, files and other processes
(docs/capture-contract.md, "Randomness and Python side effects").
"""

from __future__ import annotations

import collections
import dis
import functools
import os
import sys
import sysconfig
import types
from collections.abc import Iterator
from typing import Any, Callable

import torch

from ..templates.state_values import HOOK_KINDS

MAX_FUNCTIONS = 64
"""How many functions a snapshot follows from the captured one (bounds its cost)."""

_SCALARS = (type(None), bool, int, float, complex, str, bytes)
_CONTAINERS = (list, dict, set, bytearray, collections.deque)
_library_roots: tuple[str, ...] | None = None


def _library_dirs() -> tuple[str, ...]:
    global _library_roots  # noqa: PLW0603 - a process-wide cache, computed once
    if _library_roots is None:
        paths = sysconfig.get_paths()
        roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
        roots |= {
            p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))
        }
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "__file__", None):
            roots.add(os.path.dirname(os.path.dirname(str(torch.__file__))))
        here = os.path.dirname(os.path.abspath(__file__))
        roots.add(here)
        _library_roots = tuple(os.path.realpath(r) + os.sep for r in roots)
    return _library_roots


def _user_file(path: Any) -> bool:
    return (
        isinstance(path, str)
        and not path.startswith("<")
        and not os.path.realpath(path).startswith(_library_dirs())
    )


def _user_function(f: Any) -> bool:
    return isinstance(f, types.FunctionType) and _user_file(f.__code__.co_filename)


def _user_class(cls: type) -> bool:
    module = sys.modules.get(getattr(cls, "__module__", ""), None)
    return _user_file(getattr(module, "__file__", None))


def _token(v: Any, depth: int = 0) -> Any:
    """What identifies ``v`` for a comparison: scalars and small tuples by value
    (a float recomputed equal is no change), containers by identity and length,
    anything else by identity."""
    if isinstance(v, _SCALARS):
        return ("=", type(v).__name__, repr(v) if isinstance(v, float) else v)
    if isinstance(v, tuple) and depth < 2 and len(v) <= 16:
        return ("t", tuple(_token(x, depth + 1) for x in v))
    if isinstance(v, _CONTAINERS):
        return ("c", type(v).__name__, id(v), len(v))
    return ("id", type(v).__name__, id(v))


def _skipped(v: Any) -> bool:
    """Values whose state is not the capture's to judge here: modules, functions,
    classes (their code is followed instead), tensors and nn.Modules (the capture's
    own inputs)."""
    return isinstance(
        v,
        (
            types.ModuleType,
            types.FunctionType,
            types.BuiltinFunctionType,
            types.MethodType,
            type,
            torch.Tensor,
            torch.nn.Module,
        ),
    )


def _plain(v: Any) -> bool:
    return (
        hasattr(v, "__dict__")
        and isinstance(getattr(v, "__dict__", None), dict)
        and not _skipped(v)
        and _user_class(type(v))
    )


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _callee(v: Any) -> Any:
    """The function that calling ``v`` runs, where it is a plain Python one."""
    if isinstance(v, functools.partial):
        v = v.func
    if isinstance(v, types.MethodType):
        v = v.__func__
    if isinstance(v, torch.nn.Module):
        v = type(v).forward
    elif not isinstance(v, types.FunctionType) and callable(v) and not isinstance(v, type):
        v = type(v).__call__
    return v if isinstance(v, types.FunctionType) else None


def reached(fn: Callable, args: tuple, kwargs: dict) -> list[types.FunctionType]:
    """The captured function and the user-code functions it reaches by global name or
    closure, breadth first, at most :data:`MAX_FUNCTIONS`; plus the ``forward`` of
    user-code module classes among the arguments and the user-code hooks registered on
    those modules or globally (a call runs them too)."""
    start = [_callee(fn)]
    hook_dicts = [
        getattr(torch.nn.modules.module, f"_global{attr}", None) or {} for _, attr in HOOK_KINDS
    ]
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.nn.Module):
            start += [type(m).forward for m in a.modules() if _user_class(type(m))]
            hook_dicts += [
                m.__dict__.get(attr) or {} for m in a.modules() for _, attr in HOOK_KINDS
            ]
    start += [_callee(h) for d in hook_dicts for h in d.values()]
    seen: dict[int, types.FunctionType] = {}
    queue = collections.deque(f for f in start if isinstance(f, types.FunctionType))
    while queue and len(seen) < MAX_FUNCTIONS:
        f = queue.popleft()
        if id(f) in seen:
            continue
        seen[id(f)] = f
        values = [f.__globals__.get(n) for c in _codes(f.__code__) for n in c.co_names]
        values += [_cell(c) for c in f.__closure__ or ()]
        for v in values:
            g = _callee(v) if not isinstance(v, type) else None
            if g is not None and _user_function(g) and id(g) not in seen:
                queue.append(g)
    return [f for f in seen.values() if _user_function(f) or f is start[0]]


def global_names(f: types.FunctionType) -> set[str]:
    """The names ``f``'s code (nested code included) may read as globals: its
    ``co_names`` that are not dunders (attribute names among them; a caller keeps those
    that ``f.__globals__`` holds)."""
    return {n for c in _codes(f.__code__) for n in c.co_names if not n.startswith("__")}


_EMPTY = object()


def _cell(c: Any) -> Any:
    try:
        return c.cell_contents
    except ValueError:  # an empty cell
        return _EMPTY


def _record(out: dict, key: tuple, what: str, v: Any) -> None:
    """``out[key] = (what, token)``, and for a plain object or a user module one more
    entry per ``__dict__`` item."""
    if v is _EMPTY or (not isinstance(v, torch.nn.Module) and _skipped(v)):
        return
    if isinstance(v, torch.nn.Module):
        if not _user_class(type(v)):
            return
        internal = _module_internals()
        items = {
            k: x
            for k, x in vars(v).items()
            if k not in internal and not isinstance(x, torch.Tensor)
        }
    else:
        out[key] = (what, _token(v))
        if not _plain(v):
            return
        items = vars(v)
    for k, x in list(items.items()):
        if not (k.startswith("__") and k.endswith("__")):
            out[(*key, "attr", k)] = (f"attribute `{k}` of {what}", _token(x))
    out[(*key, "keys")] = (what, ("keys", tuple(sorted(map(str, items)))))


_internals: frozenset[str] | None = None


def _module_internals() -> frozenset[str]:
    global _internals  # noqa: PLW0603 - a process-wide cache, computed once
    if _internals is None:
        _internals = frozenset(vars(torch.nn.Module()))
    return _internals


def snapshot(fn: Callable, args: tuple, kwargs: dict) -> dict:
    """The state :func:`changes` compares (see the module docstring): ``{key:
    (description, token)}``, plus ``"functions"``, the reached functions (for lines).
    Never raises: an object that fails to be read (a ``__getattr__`` that raises
    something odd) gives an empty snapshot, so the check is skipped, never the capture."""
    try:
        return _snapshot(fn, args, kwargs)
    except Exception:  # noqa: BLE001 - never raises: the check is skipped, never the capture
        return {}


def _snapshot(fn: Callable, args: tuple, kwargs: dict) -> dict:
    out: dict = {}
    functions = reached(fn, args, kwargs)
    for f in functions:
        module = f.__globals__.get("__name__", "?")
        for n in sorted(global_names(f)):
            key = ("global", module, n)
            if key in out or (*key, "keys") in out:
                continue
            v = f.__globals__.get(n, _EMPTY)
            if v is _EMPTY:
                if n in _stored_globals(f.__code__):  # `global n; n = ...` creates it
                    out[key] = (f"the global `{n}` of module {module}", ("missing",))
                continue
            _record(out, key, f"the global `{n}` of module {module}", v)
        for name, c in zip(f.__code__.co_freevars, f.__closure__ or ()):
            what = f"the closure variable `{name}` of {f.__qualname__}"
            _record(out, ("cell", id(c), name), what, _cell(c))
    for i, a in enumerate((*args, *kwargs.items())):
        label, v = (f"argument {i}", a) if i < len(args) else (f"argument {a[0]}=", a[1])
        if isinstance(v, torch.nn.Module):
            for name, m in v.named_modules():
                _record(
                    out, ("arg", i, name), f"the module {name or type(m).__name__} ({label})", m
                )
        elif isinstance(v, _CONTAINERS) or _plain(v):
            _record(out, ("arg", i), f"the {type(v).__name__} passed as {label}", v)
    out["functions"] = functions
    return out


def _stored_globals(code: types.CodeType) -> set:
    return {
        i.argval
        for c in _codes(code)
        for i in dis.get_instructions(c)
        if i.opname in ("STORE_GLOBAL", "DELETE_GLOBAL")
    }


def _line_of(functions: list, key: tuple) -> str:
    """``file:line`` of the reached code that most likely made the change: a store of
    the name (or attribute), else its first use."""
    stores: tuple[str, ...]
    uses: tuple[str, ...]
    if key[0] == "global":
        name, stores, uses = key[2], ("STORE_GLOBAL", "DELETE_GLOBAL"), ("LOAD_GLOBAL", "LOAD_NAME")
        if len(key) > 3 and key[3] == "attr":
            name, stores, uses = key[4], ("STORE_ATTR", "DELETE_ATTR"), ()
    elif len(key) > 2 and key[-2] == "attr":
        name, stores, uses = key[-1], ("STORE_ATTR", "DELETE_ATTR"), ()
    elif key[0] == "cell":
        name, stores, uses = key[2], ("STORE_DEREF", "DELETE_DEREF"), ("LOAD_DEREF",)
    else:
        return ""
    first = ""
    for f in functions:
        for c in _codes(f.__code__):
            line = None
            for i in dis.get_instructions(c):
                if i.starts_line is not None and not isinstance(i.starts_line, bool):
                    line = i.starts_line
                pos = getattr(i, "positions", None)
                line = getattr(pos, "lineno", None) or line
                if i.argval != name or line is None:
                    continue
                where = f"{c.co_filename}:{line}"
                if i.opname in stores:
                    return where
                if i.opname in uses and not first:
                    first = where
    return first


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two :func:`snapshot` s of one call, as phrases naming the
    object (``"the list `LOG` of module m: 0 items before the capture, 2 after (at
    m.py:12)"``); empty when nothing changed."""
    if "functions" not in before or "functions" not in after:  # a snapshot failed: no verdict
        return []
    out = []
    functions = before.get("functions", [])
    for key, entry in before.items():
        if key == "functions" or key[-1] == "keys":
            continue
        what, token = entry
        now = after.get(key)
        if now is None:
            if key[-2:-1] == ("attr",):
                out.append((key, f"{what} was deleted"))
            continue
        if now[1] == token:
            continue
        if token[0] == now[1][0] == "c" and token[2] != now[1][2]:
            out.append((key, f"{what} was rebound to another {now[1][1]}"))
            continue
        out.append((key, f"{what}: {_shown(token)} before the capture, {_shown(now[1])} after"))
    for key, entry in after.items():
        if key == "functions":
            continue
        what, token = entry
        if key[-1] == "keys" and key in before and before[key][1] != token:
            added = sorted(set(token[1]) - set(before[key][1][1]))
            for k in added:
                out.append(((*key[:-1], "attr", k), f"attribute `{k}` was set on {what}"))
    result = []
    for key, text in out:
        try:
            line = _line_of(functions, key)
        except Exception:  # noqa: BLE001 - bytecode this Python cannot list: the change without its line
            line = ""
        result.append(text + (f" (at {line})" if line else ""))
    return list(dict.fromkeys(result))


def _shown(token: Any) -> str:
    kind = token[0]
    if kind == "=":
        return repr(token[2]) if token[1] != "float" else token[2]
    if kind == "c":
        return f"{token[3]} item{'s' if token[3] != 1 else ''}"
    if kind == "missing":
        return "unset"
    if kind == "t":
        return "a tuple"
    return f"a {token[1]} (id {token[2]:#x})"
