# ---- the Python state the trace assumed, checked per call ---------------------------
# Copied verbatim into every source half of the `frozen` and `eager` engines, after the
# driver (codegen.py); the values are written and decoded by state_values.py (copied
# before it, and imported by capturing/assumed_state.py at capture). Needs torch and
# the stdlib.
# PRECOMPILE_METADATA["assumed"] (capturing/assumed_state.py):
#   "reads":   [[model arg, submodule path, [attribute chain to a plain object],
#                [[attribute, kind, value], ...]], ...]  the attributes the trace read
#               (peft's `_disable_adapters`, `scaling`; a config's fields; class-level ones;
#               a hook object's own: chain step "_forward_hooks[k]", the k-th hook's
#               state holder, see _step)
#   "hooks":   {"modules": [[model arg, submodule path, kind, [hook names]]],
#               "global": [[kind, [hook names]]]}  the module hooks present at capture
#   "globals": [[module, name, kind, value]]  module-level values the reached code reads
# kind "=" : the value itself (a literal); "set": a set, as a sorted list.
# A call checks these in full when its models are checked in full (the driver's
# _full_params: a model seen first, or the state epoch moved); between, the values
# that can change without an assignment the epoch sees (dicts, lists, sets:
# `scaling[k] = 0.5`; class attributes) are compared on every call, and a hook registered anywhere (RemovableHandle.next_id)
# brings the full check back. An assignment to a recorded attribute name on a module
# or a recorded object moves the epoch (their classes' __setattr__ is wrapped once).
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import (
        _META,
        _MODULE_POS,
        HOOK_KINDS,
        CallError,
        global_hooks,
        module_hooks,
        state_decoded,
    )
# end stand-ins

_ASSUMED: dict = dict(_META.get("assumed") or {})
_READS = [
    (i, path, tuple(chain), [(a, state_decoded(k, v)) for a, k, v in attrs])
    for i, path, chain, attrs in _ASSUMED.get("reads", ())
]
_HOOKS = _ASSUMED.get("hooks") or {"modules": [], "global": []}
_GLOBALS = [(m, n, state_decoded(k, v)) for m, n, k, v in _ASSUMED.get("globals", ())]
# (`m.__dict__ = d` writes no dict: the assignment itself moves the epoch)
_WATCHED = frozenset(
    [a for _i, _p, _c, attrs in _READS for a, _v in attrs] + ["training", "__dict__"]
)
_HANDLES = torch.utils.hooks.RemovableHandle
_MISSING = object()


def _differs(got, want):
    # True and 1 compare equal; a flag that became a count (or back) is still a change
    return got != want or (type(got) is bool) != (type(want) is bool)


def _arg_label(i):
    """The name of the function's parameter that model argument ``i`` was passed as,
    where the call's arguments are plain positional leaves; else ``model argument i``."""
    names = _META.get("arg_names") or []
    pos = _MODULE_POS[i] if i < len(_MODULE_POS) else None
    return names[pos] if pos is not None and pos < len(names) else f"model argument {i}"


def _param_label(name):
    """How a message names the lifted tensor ``m<i>.<path>`` (``module_tensors``): under
    the parameter the model was passed as, ``model.fc.weight``."""
    head, _, rest = name.partition(".")
    if not (head[:1] == "m" and head[1:].isdigit()):
        return name
    arg = _arg_label(int(head[1:]))
    return f"{arg}.{rest}" if not arg.startswith("model argument") else f"{rest} of {arg}"


def _submodule(root, path):
    m = root
    for part in path.split(".") if path else ():
        m = m._modules.get(part) if m is not None else None
    return m


def _first_difference(want, got):
    """``"['k'] was A at capture, now B"`` for the first key or index that differs
    (one level), else the two values."""
    if type(want) is dict and type(got) is dict:
        for k in list(want) + [k for k in got if k not in want]:
            a, b = want.get(k, _MISSING), got.get(k, _MISSING)
            if a != b:
                shown = lambda x: "unset" if x is _MISSING else repr(x)  # noqa: E731
                return f"[{k!r}] was {shown(a)} at capture, now {shown(b)}"
    return f" was {want!r} at capture, now {got!r}"


def _step(obj, name):
    """One link of a read's chain: the attribute ``name`` of ``obj``, or for
    ``"_forward_hooks[k]"`` (capturing/assumed_state.py's hook step) the state holder of
    the k-th hook of that dict (a bound method's ``self``, else the hook); None where
    there is none."""
    d = getattr(obj, "__dict__", None) if obj is not None else None
    if not isinstance(d, dict):
        return None
    if not name.endswith("]"):
        return d.get(name)
    attr, _, k = name[:-1].partition("[")
    hooks = list((d.get(attr) or {}).values())
    hook = hooks[int(k)] if int(k) < len(hooks) else None
    return getattr(hook, "__self__", hook)


def _assumed_full(modules):
    """The full check of what the trace assumed of ``modules`` (the model arguments):
    every recorded attribute, the hooks of every submodule and torch's global hooks.
    Returns what a call compares between full checks: the dicts, lists and sets read,
    and the class attributes read (rebound with no assignment the epoch sees), as
    ``[(the instance's or class's __dict__, attribute, recorded value)]``. Raises
    CallError naming the first attribute or hook that differs."""
    target = _META["target"]
    watch = []
    for i, path, chain, attrs in _READS:
        obj = _submodule(modules[i], path) if i < len(modules) else None
        where = ".".join([_arg_label(i)] + ([path] if path else []) + list(chain))
        for name in chain:
            obj = _step(obj, name)
        if obj is None:
            raise CallError(
                f"target {target!r}: {where} is missing; the capture read its "
                f"attributes ({', '.join(a for a, _ in attrs)}). Pass a model of the "
                "captured structure"
            )
        d = obj.__dict__
        _watch_class(type(obj))
        for attr, want in attrs:
            holder = (
                d
                if attr in d
                else next((k.__dict__ for k in type(obj).__mro__ if attr in k.__dict__), d)
            )
            got = holder.get(attr, _MISSING)
            if got is _MISSING or _differs(got, want):
                diff = (
                    " was set at capture, now unset"
                    if got is _MISSING
                    else _first_difference(want, got)
                )
                raise CallError(
                    f"target {target!r}: {where}: {attr}{diff}. The pair was traced with the "
                    "captured value built in and would answer for it; set it back, or capture "
                    "this state too (another target)"
                )
            if holder is not d or type(want) in (dict, list, set):  # no assignment tells
                watch.append((holder, attr, want))
    _check_hooks(modules)
    return watch


def _check_hooks(modules):
    target = _META["target"]
    want = {(i, path, kind): names for i, path, kind, names in _HOOKS["modules"]}
    for i, mod in enumerate(modules):
        stack = [("", mod)]
        while stack:
            path, m = stack.pop()
            for kind, names in module_hooks(m):
                if want.get((i, path, kind)) != names:
                    _hook_error(target, i, path, kind, want.get((i, path, kind), []), names)
            for kind, _attr in HOOK_KINDS:
                if (i, path, kind) in want and not m.__dict__.get(_attr):
                    _hook_error(target, i, path, kind, want[(i, path, kind)], [])
            stack.extend(
                (f"{path}.{k}" if path else k, c) for k, c in m._modules.items() if c is not None
            )
    got = dict(global_hooks())
    for kind, names in list(_HOOKS["global"]) + [
        (k, []) for k in got if k not in dict(_HOOKS["global"])
    ]:
        if got.get(kind, []) != names:
            _hook_error(target, None, "", kind, names, got.get(kind, []))


def _hook_error(target, i, path, kind, want, got):
    where = (
        f"torch's global {kind} hooks"
        if i is None
        else f"the {kind} hooks of {'.'.join([_arg_label(i)] + ([path] if path else []))}"
    )
    raise CallError(
        f"target {target!r}: {where} were {want or 'none'} at capture, now {got or 'none'}; "
        "the graph ran the captured hooks (and no other): restore them, or capture again "
        "with these hooks"
    )


def _check_globals():
    """Module-level values the reached code read (``SCALES = {"x": 1.0}``), per call."""
    import sys as _sys

    for mod, name, want in _GLOBALS:
        m = _sys.modules.get(mod)
        got = m.__dict__.get(name, _MISSING) if m is not None else _MISSING
        if got is _MISSING and m is None:
            continue  # the module is not imported here: nothing of it can have changed
        if got is _MISSING or _differs(got, want):
            diff = (
                " was set at capture, now unset"
                if got is _MISSING
                else _first_difference(want, got)
            )
            raise CallError(
                f"target {_META['target']!r}: the global {mod}.{name}{diff}. The pair has the "
                "captured value built in; set it back, or capture again"
            )


def _watch_class(cls):
    """Wrap ``cls.__setattr__`` once so that an assignment of a watched attribute name
    moves the state epoch (what ends the cached verdict of a model)."""
    if cls.__dict__.get("_precompile_watched_setattr"):
        return
    box = _state_epoch()
    watched = torch.nn.modules.module._precompile_watched  # type: ignore[attr-defined]
    orig = cls.__setattr__

    def __setattr__(self, name, value, _orig=orig):
        _orig(self, name, value)
        if name in watched:  # in a trace too: dynamo replays the store without this wrapper
            box[0] += 1

    __setattr__.__wrapped__ = orig  # type: ignore[attr-defined]
    try:
        cls.__setattr__ = __setattr__
        cls._precompile_watched_setattr = True
    except (TypeError, AttributeError):  # a built-in class: no assignment to watch
        pass


def _state_epoch():
    """The process-wide model state epoch box ([int]), installed on first use: moved by
    torch's global registration hooks (a parameter, buffer or submodule assigned), by
    nn.Module.train/_apply (train(), eval(), to(), half(), ...), by an assignment of a
    watched attribute name (the attributes pairs read) on a module, and by a hook's
    removal (RemovableHandle.remove)."""
    M = torch.nn.modules.module
    box = getattr(M, "_precompile_state_epoch", None)
    if box is None:
        box = [0]

        def bump(*_args, _tracing=_TRACING):
            if not _tracing():
                box[0] += 1  # returns None: the registration hooks keep the value assigned

        for name in ("parameter", "buffer", "module"):
            hook = getattr(M, f"register_module_{name}_registration_hook", None)
            if hook is not None:
                hook(bump)
        for name in ("train", "_apply"):
            setattr(torch.nn.Module, name, _bumping(getattr(torch.nn.Module, name), box))
        M._precompile_state_epoch = box  # type: ignore[attr-defined]
    if getattr(M, "_precompile_watched", None) is None:  # (a pair of an older format made the box)
        M._precompile_watched = set()  # type: ignore[attr-defined]
        _HANDLES.remove = _bumping(_HANDLES.remove, box)  # type: ignore[method-assign]
        _watch_class(torch.nn.Module)
    M._precompile_watched.update(_WATCHED)  # type: ignore[attr-defined]
    register = torch.nn.Module.register_parameter
    if not getattr(register, "_precompile_bumps_none", False):
        torch.nn.Module.register_parameter = _none_bumping(register, box)  # type: ignore[method-assign]
    return box


def _none_bumping(orig, box):
    """``register_parameter`` that moves the epoch when a parameter is set to None
    (``lin.bias = None``): torch calls no registration hook for None."""

    def register_parameter(self, name, param, _orig=orig, _tracing=_TRACING):
        _orig(self, name, param)
        if param is None and not _tracing():
            box[0] += 1

    register_parameter.__doc__, register_parameter.__wrapped__ = orig.__doc__, orig  # type: ignore[attr-defined]
    register_parameter._precompile_bumps_none = True  # type: ignore[attr-defined]
    return register_parameter


# True while torch.compile's tracer (dynamo: a capture's too) runs the caller: the
# registration hooks do not move the epoch there. The trace would guard on its value, and
# code that builds a module as it runs (``self.layers[:n]`` makes a ModuleList:
# transformers' Llama) would move it at every call, so every call would compile again
# (torch.compile hit its recompile limit beside a loaded pair on the H200, session 16).
# A watched name assigned in a trace still moves it (the ``__setattr__`` wrapper: dynamo
# replays the store after its graph without the wrapper, so the move must be traced).
# Bound as a default argument: a traced function's globals lookup makes dynamo import
# the pair's module by name, which an exec'd pair does not have.
_TRACING = torch.compiler.is_compiling


def _bumping(orig, box):
    def wrapped(self, *args, _orig=orig, **kwargs):
        try:
            return _orig(self, *args, **kwargs)
        finally:
            box[0] += 1

    wrapped.__name__, wrapped.__doc__, wrapped.__wrapped__ = orig.__name__, orig.__doc__, orig  # type: ignore[attr-defined]
    return wrapped


def _assumed_same(watch, hook_id):
    """Between full checks: True while no hook was registered anywhere and every
    watched dict/list/set equals its recorded value."""
    if _HANDLES.next_id != hook_id:
        return False
    for holder, attr, want in watch:
        if holder.get(attr, _MISSING) != want:
            return False
    return True
