# ---- the guards' values: how a pair records and compares what Dynamo guarded --------
# Copied verbatim into every source half of the `frozen` and `eager` engines (before
# the driver, codegen.py) and imported by capturing/dynamo_guards.py at capture: one
# definition records the expected values (PRECOMPILE_METADATA["guards"]) and checks
# them. Needs only the stdlib (torch where a value is a torch.dtype or device).
import hashlib as _ghashlib
import sys as _gsys
import types as _gtypes

_GUARD_SCALARS = (bool, int, float, str, type(None))


def literal_type(v):
    """The name of ``v``'s type where a pair can record ``v`` as a literal (a bool,
    int, float, str or None, or a tuple/list/dict of them, nested), else None."""
    t = type(v)
    if t in _GUARD_SCALARS:
        if t is float and v != v:
            return None  # NaN never equals itself
        return t.__name__ if v is not None else "NoneType"
    if t in (tuple, list):
        return t.__name__ if all(literal_type(x) is not None for x in v) else None
    if t is dict:
        ok = all(type(k) in _GUARD_SCALARS and literal_type(x) is not None for k, x in v.items())
        return "dict" if ok else None
    return None


def _code_parts(co, out):
    out.append(co.co_qualname if hasattr(co, "co_qualname") else co.co_name)
    out.append(co.co_code.hex())
    out.append(
        repr(
            (
                co.co_names,
                co.co_varnames,
                co.co_freevars,
                co.co_cellvars,
                co.co_argcount,
                co.co_kwonlyargcount,
                co.co_flags,
            )
        )
    )
    for c in co.co_consts:
        if isinstance(c, _gtypes.CodeType):
            _code_parts(c, out)
        else:
            out.append(repr(c))
    return out


def code_of(fn):
    """``(code object, wrappers)`` of a function, a method, a code object, or a Triton
    kernel (``triton.jit``'s JITFunction, ``triton.autotune``'s Autotuner: their
    Python function is ``.fn``); ``wrappers`` names the classes unwrapped on the way.
    ``precompile_runtime.packaged``'s routing wrapper stands for the function it wraps.
    ``(None, "")`` for anything else."""
    f, wrappers = getattr(fn, "__func__", fn), ""
    routed = getattr(f, "__precompile_routed__", None)
    if routed is not None and routed is f:
        f = routed.__wrapped__  # precompile_runtime.packaged's wrapper: the capture traced this
    for _ in range(3):  # an Autotuner of a JITFunction of a function
        if isinstance(f, _gtypes.CodeType):
            return f, wrappers
        co = getattr(f, "__code__", None)
        if co is not None:
            return co, wrappers
        if not (type(f).__module__ or "").startswith("triton.") or getattr(f, "fn", None) is None:
            break
        wrappers += f"{type(f).__module__}.{type(f).__qualname__}>"
        f = f.fn
    return None, ""


def code_fingerprint(fn):
    """sha256 (hex) of what a function's code does: its qualname, bytecode, constants
    (nested code objects included), names and flags; not its file or line numbers. Two
    lambdas that compute differently differ; the same function in another install of
    the same Python does not. A Triton kernel's is its Python function's, with the
    kernel's classes."""
    co, wrappers = code_of(fn)
    if co is None:
        return "no-code:" + type(getattr(fn, "__func__", fn)).__qualname__
    return _ghashlib.sha256((wrappers + "\n".join(_code_parts(co, []))).encode()).hexdigest()


_CODE_SEEN: dict = {}  # (id(code), wrappers) -> (code, fingerprint): the code is kept, so its id is not reused


def _g_code_is(fn, want):
    """True where ``fn``'s code has the fingerprint ``want`` (cached per code object)."""
    co, wrappers = code_of(fn)
    seen = _CODE_SEEN.get((id(co), wrappers))
    if seen is None or seen[0] is not co:
        seen = (co, code_fingerprint(fn))
        if co is not None:
            _CODE_SEEN[(id(co), wrappers)] = seen
    return seen[1] == want


def _g_type_dict(cls):
    """The dict behind a class's ``__dict__`` (a read-only mapping proxy): its version
    moves with every assignment to the class (templates/guards.py)."""
    import gc

    return next((d for d in gc.get_referents(cls.__dict__) if type(d) is dict), None)


def _g_odict_getitem(d, k):
    return dict.__getitem__(d, k)


def _g_dataclass_fields(obj):
    import dataclasses

    return [f.name for f in dataclasses.fields(obj)]


def _g_namedtuple_fields(cls):
    return cls._fields


class _GuardAbsentRoot:
    """A root whose module this process cannot import: the capture's helper, whose
    values are the pair's constants; checks that start from it hold."""


_G_ABSENT = _GuardAbsentRoot()


def resolve_roots(records):
    """The objects of ``PRECOMPILE_METADATA["guards"]["roots"]``: ``["module", name]`` a
    module (imported where it is not yet), ``["qualname", module, qualname]`` a class or
    function of one; :data:`_G_ABSENT` where the module cannot be imported."""
    import importlib

    out = []
    for rec in records:
        obj: object
        try:
            obj = _gsys.modules.get(rec[1]) or importlib.import_module(rec[1])
            if rec[0] == "qualname":
                for part in rec[2].split("."):
                    obj = getattr(obj, part)
        except Exception:  # an import that fails: the capture's own helper module
            obj = _G_ABSENT
        out.append(obj)
    return out


_G_NUMBERS = (int, float)


def _same_value(got, want):
    if type(got) is not type(want):  # 2 and 2.0 compute alike; True and 1 do not
        return type(got) in _G_NUMBERS and type(want) in _G_NUMBERS and got == want
    if type(want) in (tuple, list):
        return len(got) == len(want) and all(_same_value(a, b) for a, b in zip(got, want))
    if type(want) is dict:
        return list(got) == list(want) and all(_same_value(got[k], want[k]) for k in want)
    return got == want


def holds(kind, value, expected):
    """True where ``value`` (what a guard's expression gives now) passes a check of
    ``kind`` against ``expected`` (what the capture recorded); the generated per-call
    code of the source half computes the same, inline."""
    if kind == "eq":
        return _same_value(value, expected)
    if kind in ("dtype", "device"):
        return type(value).__name__ == kind and str(value) == expected
    if kind == "notnone":
        return value is not None
    if kind == "set":
        return (
            type(value).__name__ == expected[0]
            and len(value) == len(expected[1])
            and all(x in value for x in expected[1])
        )
    if kind == "npscalar":
        return (
            type(value).__name__ == expected[0]
            and hasattr(value, "item")
            and _same_value(value.item(), expected[1])
        )
    if kind in ("type", "class"):
        cls = type(value) if kind == "type" else value
        return (
            isinstance(cls, type)
            and cls.__qualname__ == expected[1]
            and (expected[0] == "__main__" or cls.__module__ == expected[0])
        )
    if kind == "module":
        return isinstance(value, _gtypes.ModuleType) and value.__name__ == expected
    if kind == "enum":
        return holds("type", value, expected[:2]) and getattr(value, "name", None) == expected[2]
    if kind == "code":
        return _g_code_is(value, expected)
    if kind == "builtin":
        return (
            getattr(value, "__qualname__", None) == expected[1]
            and (getattr(value, "__module__", None) or "") == expected[0]
        )
    if kind == "hasattr":
        return hasattr(value, expected[0]) is expected[1]
    if kind == "absent":
        return expected not in getattr(value, "__dict__", {})
    if kind == "len":
        return len(value) == expected
    if kind == "keys":
        return list(value.keys()) == expected
    if kind == "contains":
        return (expected[0] in value) is expected[1]
    if kind == "empty":
        return not value
    raise ValueError(f"unknown check kind {kind!r}")


def guard_condition(kind, expr, expected):
    """The check as one Python expression over the guard's expression ``expr`` (the
    generated per-call code, codegen.py); True where it holds."""
    e = f"({expr})"
    if kind == "eq":
        if expected is None:
            return f"{e} is None"
        if type(expected) is bool:
            return f"{e} is {expected!r}"
        if type(expected) in (int, float):
            return f"type(_v := {e}) in _G_NUMBERS and _v == {expected!r}"
        return f"type(_v := {e}) is {type(expected).__name__} and _v == {expected!r}"
    if kind in ("dtype", "device"):
        return f"type(_v := {e}).__name__ == {kind!r} and str(_v) == {expected!r}"
    if kind == "notnone":
        return f"{e} is not None"
    if kind in ("npscalar", "set"):
        return f"_g_holds({kind!r}, {e}, {expected!r})"
    if kind in ("type", "class", "enum"):
        mod, qual = expected[0], expected[1]
        head = f"(_t := type(_v := {e}))" if kind != "class" else f"(_t := {e})"
        cond = f"{head}.__qualname__ == {qual!r}"
        if mod != "__main__":
            cond += f" and _t.__module__ == {mod!r}"
        if kind == "enum":
            cond += f" and _v.name == {expected[2]!r}"
        return cond
    if kind == "module":
        return f"{e}.__name__ == {expected!r}"
    if kind == "code":
        return f"_g_code_is({e}, {expected!r})"
    if kind == "builtin":
        return f"_g_holds('builtin', {e}, {expected!r})"
    if kind == "hasattr":
        return f"hasattr({e}, {expected[0]!r}) is {expected[1]!r}"
    if kind == "absent":
        return f"{expected!r} not in {e}.__dict__"
    if kind == "len":
        return f"len({e}) == {expected!r}"
    if kind == "keys":
        return f"list({e}.keys()) == {expected!r}"
    if kind == "contains":
        return f"({expected[0]!r} in {e}) is {expected[1]!r}"
    if kind == "empty":
        return f"not {e}"
    raise ValueError(f"unknown check kind {kind!r}")


_g_holds = holds
