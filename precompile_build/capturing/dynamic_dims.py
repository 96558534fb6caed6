"""Dynamic dimensions: sizes that stay symbolic in a captured pair.

A capture script marks a dimension of an example tensor with torch's own markers,
before the capture call::

    torch._dynamo.mark_dynamic(ids, 0, min=1, max=64)   # batch
    torch._dynamo.mark_dynamic(ids, 1, min=1, max=512)  # sequence length

(``torch._dynamo.decorators.mark_unbacked`` marks are read the same way.) Every
other dimension, and every parameter, stays specialised to its example size. A
marked dimension without ``min`` serves sizes from 1 (``min=0`` admits empty
tensors); without ``max`` it has no upper bound. A marked example must be dense.

The trace then runs on fake tensors whose marked sizes are symbols of one
``ShapeEnv`` (no duck sizing: two marked dims are unrelated unless the code makes
them equal), with ``backed_size_oblivious`` so that sizes 0 and 1 are not
specialised. After Inductor has compiled the graph (it may add guards of its own),
:func:`finish` reads what the pair needs at call time:

- each marked dim's symbol, refusing a capture where the code or the compiler
  specialised it to a constant or narrowed its range below what was declared;
- the guards (conditions over the symbols the compiled code relies on, e.g. two
  marked dims being equal), printed as Python expressions;
- each input's shape and strides as symbols / expressions.

The driver (driver.py) binds the symbols from the call's tensor sizes, checks the
ranges and guards, and refuses a call that breaks one with a CallError.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from precompile_runtime.pair_format import Dim, Dynamic

from ..errors import CaptureError
from . import unbacked
from .layouts import memory_layout

DEFAULT_MIN = 1  # an unmarked lower bound: serve every non-empty size


@dataclass
class SymbolicTrace:
    """What :func:`finish` needs after the trace (and after Inductor's compile)."""

    shape_env: Any
    inputs: list  # fake flat inputs (parameters, then user tensors): what Inductor compiles for
    fakes: list  # fake user tensors, in tensor_inputs order
    marks: list  # per user tensor: {dim: (min, max|None)}
    paths: list  # per user tensor: its argument path, for messages


def marked_dims(t) -> dict[int, tuple[int, int | None]]:
    """``{dim: (min, max or None)}`` from torch's mark_dynamic / mark_unbacked markers
    on tensor ``t`` (empty when it has none). Negative dims are normalised."""
    marks: dict[int, tuple[int, int | None]] = {}
    ranges = {r.dim: (r.min, r.max) for r in getattr(t, "_dynamo_dynamic_range", ())}
    ranges.update(getattr(t, "_dynamo_unbacked_bounds", {}) or {})
    dims = set(getattr(t, "_dynamo_dynamic_indices", ())) | set(
        getattr(t, "_dynamo_unbacked_indices", ())
    )
    for d in sorted(dims):
        lo, hi = ranges.get(d, (None, None))
        marks[d % max(t.dim(), 1)] = (
            DEFAULT_MIN if lo is None else int(lo),
            None if hi is None else int(hi),
        )
    return marks


def _fmt(lo: int, hi: int | None) -> str:
    return f"[{lo}, {'inf' if hi is None else hi}]"


def check_marks(t, marks: dict, path: str, target: str) -> None:
    for d, (lo, hi) in marks.items():
        size = t.shape[d]
        if lo < 0:
            raise CaptureError(
                f"{path} dim {d} is marked with min={lo}; sizes start at 0", target=target
            )
        if hi is not None and hi < lo:
            raise CaptureError(
                f"{path} dim {d} is marked with the empty range {_fmt(lo, hi)}", target=target
            )
        if hi == lo:
            raise CaptureError(
                f"{path} dim {d} is marked dynamic with the one-size range "
                f"{_fmt(lo, hi)}: that is a static size; drop the mark, or widen the range",
                target=target,
            )
        if memory_layout(t) != "dense":
            raise CaptureError(
                f"{path} has dims marked dynamic but is a view with gaps "
                f"(shape {list(t.shape)}, stride {list(t.stride())}), whose strides do not follow "
                "from its sizes; pass a dense example (.contiguous()) and dense tensors at call time",
                target=target,
            )
        if size < lo or (hi is not None and size > hi):
            raise CaptureError(
                f"{path} dim {d} is marked dynamic in {_fmt(lo, hi)} but the "
                f"example has size {size}; pass an example inside the range",
                target=target,
            )


def fake_inputs(example: list, n_params: int, marks: list, paths: list, target: str):
    """Fake tensors for ``example`` (lifted parameters first, then user tensors):
    marked dims of user tensors become symbols with the declared range, everything
    else is static. Returns ``(fakes, SymbolicTrace)``."""
    from torch._dynamo.source import LocalSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
        StrictMinMaxConstraint,
    )
    from torch.utils._sympy.numbers import int_oo
    from torch.utils._sympy.value_ranges import ValueRanges

    shape_env = ShapeEnv(duck_shape=False)
    mode = FakeTensorMode(shape_env=shape_env)
    fakes = []
    for i, t in enumerate(example):
        dims = marks[i - n_params] if i >= n_params else {}
        if dims:
            check_marks(t, dims, paths[i - n_params], target)
        ctx: Any = StatelessSymbolicContext(
            dynamic_sizes=[
                DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(t.dim())
            ],
            constraint_sizes=[
                StrictMinMaxConstraint(
                    vr=ValueRanges(dims[d][0], int_oo if dims[d][1] is None else dims[d][1]),
                    warn_only=False,
                )
                if d in dims
                else None
                for d in range(t.dim())
            ],
        )
        fakes.append(mode.from_tensor(t, source=LocalSource(f"input{i}"), symbolic_context=ctx))
    return fakes, SymbolicTrace(
        shape_env=shape_env, inputs=fakes, fakes=fakes[n_params:], marks=marks, paths=paths
    )


def size_oblivious():
    """Trace and compile without specialising sizes 0 and 1 of marked dims."""
    from torch.fx.experimental import _config

    return _config.patch(backed_size_oblivious=True)  # type: ignore[attr-defined]  # (torch config modules get patch at import)


def compile_context(graph_module):
    """Around Inductor's compile of a symbolic trace: the sizes stay oblivious as in
    the trace; standalone_compile(dynamic_shapes="from_graph") finds the trace's fake
    mode on the output nodes (it reads ``example_value``, make_fx writes ``val``); and
    Inductor's FX graph cache and AOTAutograd's cache are off: they key their guards
    on SymInt *arguments*, ours are tensor sizes, so a cache hit would skip the guards
    the compiler added (a pair would claim sizes its code does not hold for)."""
    from torch._inductor import config

    unbacked.show_fake_mode(graph_module)
    stack = contextlib.ExitStack()
    stack.enter_context(size_oblivious())
    # AOTAutograd's tensorify pass turns Python float math on sizes (BatchNorm's
    # N/(N-1)) into tensors for graphs whose size symbols are SymInt *inputs*, as
    # Dynamo's are; ours are tensor sizes, which it cannot look up (KeyError). It
    # exists to avoid recompiles on float arguments, which a pair never has: skip it.
    from torch._functorch._aot_autograd import graph_compile

    if hasattr(graph_compile, "_apply_tensorify_python_scalars"):
        stack.enter_context(
            mock.patch.object(graph_compile, "_apply_tensorify_python_scalars", lambda gm: None)
        )
    stack.enter_context(config.patch({"fx_graph_cache": False, "fx_graph_remote_cache": False}))
    stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
    # without the caches standalone_compile warns that it cannot save its own
    # artifact; the frozen engine never uses that artifact
    log = logging.getLogger("torch._inductor.standalone_compile")
    stack.callback(log.setLevel, log.level)
    log.setLevel(logging.ERROR)
    return stack


def _printer():
    from torch.utils._sympy.printers import PythonPrinter

    return PythonPrinter().doprint


def finish(sym: SymbolicTrace, target: str) -> tuple[Dynamic, list[dict[str, list[Dim]]]]:
    """Read the symbols, ranges and guards once tracing and compiling are done.

    Returns:
        ``(dynamic, shapes)``: ``dynamic`` is the metadata's ``{"symbols": {name:
        [min, max|None]}, "guards": [python expression, ...]}``; ``shapes`` has one
        ``{"shape": [...], "stride": [...]}`` per user tensor, each entry an int or a
        symbol / Python expression (str).
    Raises:
        CaptureError: a marked dim was specialised to a constant, tied to another dim
            by an expression, its range narrowed below the declared one, or a
            condition over it excludes sizes of that range.
    """
    import sympy
    from torch.utils._sympy.numbers import int_oo

    env, pexpr = sym.shape_env, _printer()

    def resolved(v):
        return (
            env.simplify(sympy.sympify(v.node.expr))
            if isinstance(v, torch.SymInt)
            else sympy.Integer(v)
        )

    symbols: dict[str, list] = {}
    where: dict[str, str] = {}  # symbol -> "argument 'x' dim 0", for messages
    shapes = []
    for fake, marks, path in zip(sym.fakes, sym.marks, sym.paths):
        shape: list[Dim] = []
        stride: list[Dim] = []
        for d, size in enumerate(fake.shape):
            expr = resolved(size)
            if d not in marks:
                shape.append(int(expr))
                continue
            lo, hi = marks[d]
            if expr.is_number:
                raise CaptureError(
                    f"{path} dim {d} is marked dynamic but the captured code "
                    f"specialised it to {int(expr)} (a Python branch on the size, a fixed-size "
                    "view, or a constant-sized partner tensor); make that code size-agnostic, or "
                    "drop the mark to capture this size only",
                    target=target,
                )
            if not isinstance(expr, sympy.Symbol):
                raise CaptureError(
                    f"{path} dim {d} is marked dynamic but the captured code "
                    f"ties it to another marked dim as {pexpr(expr)}; mark only the independent dim",
                    target=target,
                )
            name = str(expr)
            vr = env.var_to_range[expr]
            got_lo = int(vr.lower)
            got_hi = (
                int(vr.upper)
                if vr.upper.is_integer
                and vr.upper.is_finite is not False
                and vr.upper not in (int_oo, sympy.oo)
                else None
            )
            if got_lo > lo or (got_hi is not None and (hi is None or got_hi < hi)):
                fix_hi = hi if got_hi is None else got_hi if hi is None else min(hi, got_hi)
                size_one = lo <= 1 and got_lo == 2
                why = (
                    (
                        " (its strides or kernels differ at size 1, e.g. a reshape after a transpose;"
                        " serve size 1 from a target captured at that size)"
                    )
                    if size_one
                    else ""
                )
                advice = "mark it with that range"
                if size_one and fix_hi != hi:
                    # the compiler's guards for size 1 can cap the range too (a Conv2d batch
                    # marked [1, 64] holds for [2, 15] here, [2, 64] marked from 2): raise
                    # the lower bound first and keep the declared upper one
                    fix_hi, advice = (
                        hi,
                        "mark it from 2 (an upper bound may come from allowing size 1)",
                    )
                raise CaptureError(
                    f"{path} dim {d} is marked dynamic in {_fmt(lo, hi)} but the "
                    f"captured code only holds for {_fmt(got_lo, got_hi)}{why}; {advice} "
                    f"(torch._dynamo.mark_dynamic(t, {d}, min={got_lo}, max={fix_hi})) or make the code "
                    "size-agnostic",
                    target=target,
                )
            symbols[name] = [max(lo, got_lo), hi]
            where.setdefault(name, f"{path} dim {d}")
            shape.append(name)
        for s in fake.stride():
            expr = resolved(s)
            stride.append(int(expr) if expr.is_number else pexpr(expr))
        shapes.append({"shape": shape, "stride": stride})
    conditions = [g.expr for g in env.guards]
    conditions += [a.expr for asserts in env.deferred_runtime_asserts.values() for a in asserts]
    guards = []
    for cond in conditions:
        cond = env.simplify(cond)
        if cond == sympy.true:
            continue
        unknown = {str(s) for s in cond.free_symbols} - set(symbols)
        if unknown:
            raise CaptureError(
                f"the captured code relies on {pexpr(cond)}, over sizes that "
                f"are not marked dims ({', '.join(sorted(unknown))}); this engine serves only "
                "conditions over marked dims: capture with engine='torch' or drop the marks",
                target=target,
            )
        text = pexpr(cond)
        if text not in guards:
            guards.append(text)
    for text in guards:
        _check_guard_keeps_range(text, symbols, where, target)
    return {"symbols": symbols, "guards": guards}, shapes


_RANGE_SCAN = 4096  # sizes of a range checked against a one-symbol guard


def _check_guard_keeps_range(guard: str, symbols: dict, where: dict, target: str) -> None:
    """A guard over one symbol (``s0 % 2 == 0``) excludes sizes of its range: refuse,
    as the user declared every size in it. (A guard over several symbols relates
    inputs, e.g. two batch sizes equal, and is checked per call.)"""
    used = [name for name in symbols if re.search(rf"\b{name}\b", guard)]
    if len(used) != 1:
        return
    name = used[0]
    lo, hi = symbols[name]
    top = lo + _RANGE_SCAN if hi is None else min(hi, lo + _RANGE_SCAN)
    bad = [n for n in range(lo, top + 1) if not eval_expr(guard, {name: n})]
    if bad:
        shown = re.sub(rf"\b{name}\b", "size", guard)
        raise CaptureError(
            f"{where[name]} is marked dynamic in {_fmt(lo, hi)} but the "
            f"captured code relies on {shown} (sizes {bad[:4]} break it): "
            "make the code size-agnostic, or capture the sizes you need as separate targets",
            target=target,
        )


def example_sizes(
    dynamic: Dynamic, shapes: Sequence[Mapping[str, Any]], example_user: list
) -> list[dict[str, int]]:
    """Symbol assignments to validate a pair with besides the example: the lower
    bound of every range and the example size plus one (within range), each kept
    only when it satisfies the guards."""
    current: dict[str, int] = {}
    for spec, t in zip(shapes, example_user):
        for entry, size in zip(spec["shape"], t.shape):
            if isinstance(entry, str):
                current[entry] = int(size)
    out = []
    for pick in (lambda lo, hi, n: lo, lambda lo, hi, n: n + 1 if hi is None or n < hi else n - 1):
        sizes = {s: max(lo, pick(lo, hi, current[s])) for s, (lo, hi) in dynamic["symbols"].items()}
        if (
            sizes != current
            and sizes not in out
            and all(eval_expr(g, sizes) for g in dynamic["guards"])
        ):
            out.append(sizes)
    return out


def describe(sizes: dict[str, int], shapes: Sequence[Mapping[str, Any]], paths: list[str]) -> str:
    """``"argument 'x' dim 0 = 1, ..."`` for symbol sizes, in argument order."""
    where: dict[str, str] = {}
    for spec, path in zip(shapes, paths):
        for d, entry in enumerate(spec["shape"]):
            if isinstance(entry, str):
                where.setdefault(entry, f"{path} dim {d}")
    return ", ".join(f"{where[s]} = {n}" for s, n in sizes.items())


def eval_expr(expr: str | int, sizes: dict[str, int]):
    """Evaluate a printed shape expression / guard with the symbols bound to ``sizes``
    (the same evaluation the driver does at call time)."""
    if isinstance(expr, int):
        return expr
    scope = {"__builtins__": {}, "math": math, "torch": torch, "max": max, "min": min, "abs": abs}
    return eval(expr, scope, dict(sizes))


def resized(t, spec: Mapping[str, Any], sizes: dict[str, int]):
    """A tensor like example ``t`` at the sizes ``sizes`` (values repeated or cut along
    each dim, so integer inputs such as token ids stay valid), with the strides the
    capture expects."""
    shape = [eval_expr(e, sizes) for e in spec["shape"]]
    stride = [eval_expr(e, sizes) for e in spec["stride"]]
    data = t
    for d, n in enumerate(shape):
        have = data.shape[d]
        if n > have:
            reps = [1] * data.dim()
            reps[d] = -(-n // max(have, 1))
            data = (
                data.repeat(*reps)
                if have
                else torch.zeros(
                    [*data.shape[:d], n, *data.shape[d + 1 :]], dtype=data.dtype, device=data.device
                )
            )
        data = data.narrow(d, 0, n)
    out = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(data)
