# ---- the guards Dynamo built at capture, checked per call ---------------------------
# Copied verbatim into every source half of the `frozen` and `eager` engines, after the
# driver and the generated `_guards_full`/`_guards_call` (codegen.py renders them from
# PRECOMPILE_METADATA["guards"], capturing/dynamo_guards.py). Needs torch and the stdlib.
# PRECOMPILE_METADATA["guards"]:
#   "params": the function's parameter list (the generated checks bind the call to it)
#   "roots":  [["module", name] | ["qualname", module, qualname]]  what `_R[k]` is
#   "checks": [[label, kind, expression, expected, per call, "file:line"], ...]
#   "watched": attribute names whose assignment on a module moves the state epoch
#   "slots":  [[object expression, attribute]]  what can be rebound in place on the path
#             of a covered check (a function's __defaults__ or __code__, a closure cell's
#             contents: capturing/dict_covers.py's slots), compared by identity per call
# A call runs every check when its models are checked in full (a model seen first, the
# state epoch moved, a hook registered anywhere, a covering dict written or met anew),
# else the per-call ones: the values no dict's version stands for (a list's length and
# items). A dict reached from the models through dicts only is kept from the full check
# and its version compared (Python 3.12+: watched instead, dict_watch.py); one reached
# from another argument or through a list item is met again by `_guards_watch` and
# compared by identity, version and its object's class (capturing/dict_covers.py).
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import (
        _HANDLES,
        _META,
        CallError,
        _g_code_is,
        _g_dataclass_fields,
        _g_holds,
        _g_namedtuple_fields,
        _g_odict_getitem,
        _guard_bind,
        _guards_call,
        _guards_dicts,
        _guards_full,
        _guards_slots,
        _guards_watch,
        _state_epoch,
        _weakref,
        dict_watcher,
        resolve_roots,
    )
# end stand-ins

import sys as _sys
from collections import OrderedDict as _OrderedDict

_GUARDS: dict = dict(_META.get("guards") or {})
_G_CHECKS = list(_GUARDS.get("checks") or ())
_G_ROOTS: list = []  # resolved at the first call (resolve_roots imports the modules named)
_G_WATCHES = bool(_GUARDS.get("by_identity"))
_G_SLOT_ATTRS = [attr for _expr, attr in _GUARDS.get("slots") or ()]
_G_EMPTY_CELL = object()  # what an empty closure cell holds, for the comparison
# id(first model) -> ((epoch, hook registrations, tick), [(dict, its version)] (none where
# they are watched), {`_guards_watch` tuple: None}, weakrefs of the models, [(slot's
# object, attribute, what it held)], whether the dicts are watched) of the models' last
# full check: until one of
# these moves, the checks the dicts' versions cover hold (any write to a dict moves its
# version: `obj.__dict__[k] = v` too). The watch tuples of the last _G_WATCH_KEEP other
# arguments that passed (a server's requests, each with its cache, interleaved) are kept.
_G_WATCH_KEEP = 16
_G_SEEN: dict = {}
_G_EPOCH: list = []
_DICT_VERSION = getattr(
    getattr(getattr(torch._C, "_dynamo", None), "guards", None), "dict_version", None
)
# `_guards_watch` compares dicts by id and version, which names one dict's state only while
# versions are unique across dicts (CPython's global counter; a fresh dict takes the next)
_VERSIONS_UNIQUE = _DICT_VERSION is not None and len({_DICT_VERSION({}) for _ in range(2)}) == 2
# Python 3.12+: the full check watches each covering dict (dict_watch.py), and a call
# reads the watcher's tick in place of every dict's version
_G_TICK: list = []  # [dict_watcher()] where the interpreter has one: (tick(), watch(dict))
# A function's code and defaults are rebound through setters that raise CPython's
# `object.__setattr__` audit event (`object.__delattr__` for `f.__defaults__ = None` or a
# `del`: Objects/funcobject.c); a closure cell's contents raise none. With the audit hook
# in place (`_audit_code_writes`), such a write moves the state epoch, so only the cells
# are compared per call (bench/results/driver_overhead_guards_cpu.md).
_G_AUDITED_SLOTS = frozenset(("__code__", "__defaults__", "__kwdefaults__"))
# `x.__class__ = C` raises it too (Objects/typeobject.c), through object.__setattr__ as well:
# a class swapped on any object the checks reached moves the epoch (a type check covered
# by a dict's version would not see it)
_G_AUDITED_NAMES = _G_AUDITED_SLOTS | {"__class__"}
_G_AUDITED: list = []  # [True] once this process's hook moves the epoch on those writes


def _audit_code_writes(box):
    """Install, once per process, the audit hook that moves the state epoch ``box`` when
    a function's ``__code__``, ``__defaults__`` or ``__kwdefaults__`` or an object's
    ``__class__`` is assigned or deleted; return whether a write now moves it (False
    where another hook refused this one: every slot is then compared per call, and a
    class swapped is seen at the next full check). An audit hook cannot be removed: it
    costs a Python call per audit event in the process (an ``open``, an import,
    ``sys._getframe``) that compares the event's name and returns."""
    M = torch.nn.modules.module
    # (box, probe, probe's writes, names watched): a pair of another version may have
    # installed one that watches fewer names
    installed = getattr(M, "_precompile_code_audit", None)
    if installed is None or installed[0] is not box or installed[3:] != (_G_AUDITED_NAMES,):

        def probe():
            pass

        events, hits = ("object.__setattr__", "object.__delattr__"), [0]

        def _on_audit(event, args, _box=box, _watched=_G_AUDITED_NAMES, _events=events):
            if event in _events and len(args) > 1 and args[1] in _watched:
                if args[0] is probe:  # (the probe's write tells the hook runs: no state moved)
                    hits[0] += 1
                else:
                    _box[0] += 1

        _sys.addaudithook(_on_audit)  # (an existing hook may refuse it, silently)
        installed = (box, probe, hits, _G_AUDITED_NAMES)
        M._precompile_code_audit = installed  # type: ignore[attr-defined]
    _box, probe, hits, _names = installed
    before = hits[0]
    probe.__defaults__ = ()
    return hits[0] != before


def _models_stand(seen, now, modules):
    refs = seen[3]
    if seen[0] != now or len(refs) != len(modules):
        return False
    for r, m in zip(refs, modules):
        if r() is not m:
            return False
    if not seen[5]:  # (watched: a write would have moved the tick, which `now` holds)
        for d, v in seen[1]:  # (a loop calls dict_version faster than map does: bench/results)
            if _DICT_VERSION(d) != v:  # type: ignore[misc]
                return False
    try:
        for o, a, v in seen[4]:
            if getattr(o, a) is not v:
                return False
    except ValueError:  # a cell emptied since
        return False
    return True


def _slot_value(o, attr):
    try:
        return getattr(o, attr)
    except ValueError:  # an empty cell
        return _G_EMPTY_CELL


def _check_guards(args, kwargs, modules, full=False, kinds=None):
    """Run the guards' checks on a call; raise CallError naming the first that fails
    (with ``kinds``, only where that check is of one of these kinds)."""
    if not _G_ROOTS:
        resolved = resolve_roots(_GUARDS.get("roots") or ())
        box = _state_epoch()
        torch.nn.modules.module._precompile_watched.update(_GUARDS.get("watched") or ())  # type: ignore[attr-defined]
        audited = _audit_code_writes(box)
        watcher = dict_watcher()
        _G_EPOCH[:] = [box]
        _G_AUDITED[:] = [True] if audited else []
        _G_TICK[:] = [] if watcher is None else [watcher]
        _G_ROOTS.append(resolved)  # last: a call interrupted before it sets up again
    roots = _G_ROOTS[0]
    key = id(modules[0]) if modules else 0
    # (read before the full check watches the dicts: a write between is seen by the checks)
    now = (_G_EPOCH[0][0], _HANDLES.next_id, _G_TICK[0][0]() if _G_TICK else 0)
    seen = _G_SEEN.get(key) if _DICT_VERSION is not None else None
    try:
        full = (
            full
            or seen is None
            or not _models_stand(seen, now, modules)
            or (_G_WATCHES and _guards_watch(roots, *args, **kwargs) not in seen[2])
        )
        # (taken before the checks: a write while they run, from another thread, moves a
        # version, so the next call checks in full instead of trusting what was not seen)
        pre = _snapshot(roots, args, kwargs) if full and _DICT_VERSION is not None else None
        failed = (_guards_full if full else _guards_call)(roots, *args, **kwargs)
    except TypeError:  # arguments that do not bind: the driver's own checks name them
        return
    if failed >= 0:
        if kinds is None or _G_CHECKS[failed][1] in kinds:
            _guard_error(failed, roots, args, kwargs)
        return
    if pre is not None:
        _remember(key, now, modules, pre)


def _snapshot(roots, args, kwargs):
    """``(watch tuple, [(dict, its version)], [(slot's object, attribute, what it holds)],
    watched)`` of a call's covering dicts and slots (``watched``: each dict is watched,
    and the tick stands for their versions), or None where one does not resolve or is no
    plain dict (each call then checks in full)."""
    if _G_WATCHES and not _VERSIONS_UNIQUE:
        return None
    dicts = list({id(d): d for d in _guards_dicts(roots, *args, **kwargs)}.values())
    if not all(type(d) in (dict, _OrderedDict) for d in dicts):
        return None
    # watched before any version is read (the watch tuple's too): watching sets a bit of
    # the dict's version
    watched = bool(_G_TICK)
    if watched:
        try:
            for d in dicts:
                _G_TICK[0][1](d)
        except Exception:  # noqa: BLE001 - a dict the interpreter would not watch: versions
            watched = False
    watch = _guards_watch(roots, *args, **kwargs) if _G_WATCHES else ()
    if watch is None:
        return None
    objs = _guards_slots(roots, *args, **kwargs)
    if objs is None:
        return None
    try:
        # one entry per (object, attribute): paths through several layers meet one function
        slots = list(
            {
                (id(o), a): (o, a, _slot_value(o, a))
                for o, a in zip(objs, _G_SLOT_ATTRS)
                if not (_G_AUDITED and a in _G_AUDITED_SLOTS)
            }.values()
        )
    except Exception:  # noqa: BLE001 - an attribute that no longer exists: check in full
        return None
    # (watched, none is kept: a dict replaced whole, `obj.__dict__ = {...}`, is then freed,
    # which the watcher announces as a write)
    pairs = [] if watched else [(d, _DICT_VERSION(d)) for d in dicts]  # type: ignore[misc]
    return watch, pairs, slots, watched


def _remember(key, now, modules, pre):
    """Keep what a later call compares to stand for this full check's (``_G_SEEN``)."""
    watch, pairs, slots, watched = pre
    seen = _G_SEEN.get(key)
    if seen is not None and _models_stand(seen, now, modules):  # another request's arguments
        watches = seen[2]
        watches[watch] = None
        try:
            while len(watches) > _G_WATCH_KEEP:
                del watches[next(iter(watches))]  # the oldest
        except (RuntimeError, KeyError, StopIteration):  # another thread's call changed it: fine
            pass
        return
    refs = [_weakref.ref(m, lambda _r, k=key: _G_SEEN.pop(k, None)) for m in modules]  # type: ignore[misc]
    _G_SEEN[key] = (now, pairs, {watch: None}, refs, slots, watched)


def _guard_error(i, roots, args, kwargs):
    label, kind, expr, want, _per_call, where = _G_CHECKS[i][:6]
    names = {
        "_R": roots,
        "_g_code_is": _g_code_is,
        "_g_odict_getitem": _g_odict_getitem,
        "_g_dataclass_fields": _g_dataclass_fields,
        "_g_namedtuple_fields": _g_namedtuple_fields,
        "_g_holds": _g_holds,
    }
    try:
        got = eval(expr, names, _guard_bind(*args, **kwargs))  # noqa: S307 - the pair's own expression
    except Exception as e:  # noqa: BLE001 - the path no longer resolves: say how
        what = f"{label} cannot be read now ({type(e).__name__}: {e})"
    else:
        try:
            what = _guard_difference(label, kind, want, got)
        except Exception:  # noqa: BLE001 - a value of another shape than the check's (a len of None)
            what = f"{label} was {want!r} at capture ({kind}), now {got!r}"
    read = f" (read at {where})" if where else ""
    raise CallError(
        f"target {_META['target']!r}: {what}{read}. The pair was traced with the captured state "
        "built in and would answer for it; set it back, or capture this state too"
    )


def _class_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else repr(cls)


def _guard_difference(label, kind, want, got):
    """What differs, in words: the captured and the current value of ``label``."""
    if kind == "npscalar":
        return f"{label} was numpy.{want[0]}({want[1]!r}) at capture, now {got!r}"
    if kind == "set":
        return f"{label} was the {want[0]} {set(want[1])!r} at capture, now {got!r}"
    if kind == "len":
        return f"the length of {label} was {want!r} at capture, now {len(got)!r}"
    if kind in ("eq", "dtype", "device", "keys"):
        return f"{label} was {want!r} at capture, now {(list(got.keys()) if kind == 'keys' else got)!r}"
    if kind in ("type", "class", "enum"):
        cls = got if kind == "class" else type(got)
        now = _class_name(cls) + (f".{got.name}" if kind == "enum" and hasattr(got, "name") else "")
        return (
            f"{label} was a {'.'.join(want)} at capture, now {'a ' if kind == 'type' else ''}{now}"
        )
    if kind == "code":
        name = getattr(getattr(got, "__func__", got), "__qualname__", type(got).__qualname__)
        return f"{label} is another function than at capture (now {name}, whose code differs)"
    if kind == "absent":
        return f"{label}.{want} was not set at capture, now it is"
    if kind == "hasattr":
        return (
            f"{label}.{want[0]} was {'present' if want[1] else 'absent'} at capture, now "
            f"{'absent' if want[1] else 'present'}"
        )
    if kind == "contains":
        return (
            f"{label} {'held' if want[1] else 'did not hold'} the key {want[0]!r} at capture, now it "
            f"{'does not' if want[1] else 'does'}"
        )
    if kind == "empty":
        return f"{label} was empty at capture, now it holds {list(got.values()) if hasattr(got, 'values') else got!r}"
    if kind == "notnone":
        return f"{label} was set at capture, now None"
    return f"{label} was {want!r} at capture, now {got!r}"
