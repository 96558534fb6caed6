# ---- plain Python values and hooks, as a pair records and compares them -------------
# Copied verbatim into every source half of the `frozen` and `eager` engines (before the
# driver, codegen.py) and imported by capturing/assumed_state.py at capture: one
# definition writes the recorded values (PRECOMPILE_METADATA["assumed"]) and reads them
# back for the per-call checks of assumed_state.py. Needs only the stdlib (torch for
# the global hooks, imported where it is used).
import math as _amath

_STATE_SCALARS = (bool, int, float, str, type(None))
_STATE_MAX_ITEMS = 64
HOOK_KINDS = (
    ("forward", "_forward_hooks"),
    ("forward_pre", "_forward_pre_hooks"),
    ("backward", "_backward_hooks"),
    ("backward_pre", "_backward_pre_hooks"),
)


def _state_scalar(v):
    return type(v) in _STATE_SCALARS and not (type(v) is float and not _amath.isfinite(v))


def _state_plain(v, depth):
    if _state_scalar(v):
        return True
    if depth >= 2 or type(v) not in (tuple, list, dict) or len(v) > _STATE_MAX_ITEMS:
        return False
    if type(v) is dict:
        return all(_state_scalar(k) and _state_plain(x, depth + 1) for k, x in v.items())
    return all(_state_plain(x, depth + 1) for x in v)


def state_value(v):
    """``(kind, value)`` that records ``v`` as a literal, or None where ``v`` is not a
    plain value: a bool/int/float (finite)/str/None, a tuple/list/dict of them (two
    levels, at most 64 items each; dict keys scalars), or a set/frozenset of scalars
    (kind ``"set"``, the items sorted by repr)."""
    if type(v) in (set, frozenset):
        if len(v) <= _STATE_MAX_ITEMS and all(_state_scalar(x) for x in v):
            return ("set", sorted(v, key=repr))
        return None
    return ("=", v) if _state_plain(v, 0) else None


def state_decoded(kind, value):
    """The value :func:`state_value` recorded, as a call compares it."""
    return set(value) if kind == "set" else value


def hook_name(fn):
    """``module.qualname`` of a hook (a partial's or bound method's function; a
    callable object's class): what names it across processes."""
    f = getattr(fn, "func", fn)
    f = getattr(f, "__func__", f)
    qual = getattr(f, "__qualname__", None) or type(f).__qualname__
    mod = getattr(f, "__module__", None) or type(f).__module__
    return f"{mod}.{qual}"


def module_hooks(module):
    """``[(kind, [hook names])]`` of the hook dicts of ``module`` that are not empty."""
    out = []
    for kind, attr in HOOK_KINDS:
        d = module.__dict__.get(attr)
        if d:
            out.append((kind, [hook_name(h) for h in d.values()]))
    return out


def global_hooks():
    """``[(kind, [hook names])]`` of torch's global module hooks that are set."""
    import torch.nn.modules.module as M

    out = []
    for kind, _attr in HOOK_KINDS:
        d = getattr(M, f"_global{_attr}", None)
        if d:
            out.append((kind, [hook_name(h) for h in d.values()]))
    return out
