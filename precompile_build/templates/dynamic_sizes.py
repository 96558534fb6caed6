# ---- dynamic dims: symbols bound from the call's sizes, then ranges and guards ----
# Copied into every source half after driver.py (precompile_build/engines/codegen.py):
# the check of the user tensors of a capture with dynamic dims, which the driver runs
# where the metadata has "dynamic" (_DYN). Reads _META and the tensor checks of driver.py.
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import _META, CallError, _check_tensor, _layout_hint, _same_strides
# end stand-ins

import math as _math

_DYN = _META.get("dynamic")
_EVAL_SCOPE = {
    "__builtins__": {},
    "math": _math,
    "torch": torch,
    "max": max,
    "min": min,
    "abs": abs,
}
_CODE: dict = {}  # expression text -> code object


def _eval(expr, sizes):
    if isinstance(expr, int):
        return expr
    code = _CODE.get(expr)
    if code is None:
        code = _CODE[expr] = compile(expr, "<shape expression>", "eval")
    return eval(code, _EVAL_SCOPE, sizes)


def _fmt_shape(shape):
    """A captured shape for messages: static dims as numbers, dynamic ones as their
    range (``[2, 2..64]``; ``1..inf`` when unbounded)."""
    dims = []
    for w in shape:
        if isinstance(w, str):
            lo, hi = _DYN["symbols"][w]  # type: ignore[index]  # (a str dim: _DYN is set)
            w = f"{lo}..{'inf' if hi is None else hi}"
        dims.append(str(w))
    return "[" + ", ".join(dims) + "]"


def _check_dynamic(leaves):
    """Check the user tensors ``leaves`` ([(tensor, path)]) of a capture with dynamic
    dims: dtype/device, static dims exact, marked dims bound to their symbols (a
    symbol seen twice must have one size), then ranges, the capture's guards and,
    for frozen kernels, the strides at these sizes. Raises CallError."""
    sizes: dict = {}
    where: dict = {}
    for (t, path), spec in zip(leaves, _META["tensor_inputs"]):
        _check_tensor(t, spec, path, check_shape=False)
        shape = spec["shape"]
        bad = t.dim() != len(shape) or any(
            not isinstance(w, str) and g != w for g, w in zip(t.shape, shape)
        )
        for d, (g, w) in enumerate(zip(t.shape, shape)):
            if bad or not isinstance(w, str):
                continue
            if w in sizes and sizes[w] != g:
                raise CallError(
                    f"target {_META['target']!r}, {path} dim {d}: size {g}, but {where[w]} has "
                    f"size {sizes[w]} and the capture requires them equal"
                )
            sizes[w] = g
            where.setdefault(w, f"{path} dim {d}")
        if bad:
            raise CallError(
                f"target {_META['target']!r}, {path}: shape {list(t.shape)} (captured "
                f"{_fmt_shape(shape)}). "
                "Only the dims marked dynamic at capture may change size: pass what was "
                "captured, or capture again with these dims marked"
            )
    for name, n in sizes.items():  # in argument order
        lo, hi = _DYN["symbols"][name]  # type: ignore[index]  # (called when _DYN is set)
        if n < lo or (hi is not None and n > hi):
            raise CallError(
                f"target {_META['target']!r}, {where[name]}: size {n} is outside the range "
                f"[{lo}, {'inf' if hi is None else hi}] it was captured for; pass a size in "
                "range, or capture again with a wider mark_dynamic(..., min=, max=)"
            )
    for guard in _DYN["guards"]:  # type: ignore[index]
        if not _eval(guard, sizes):
            named = ", ".join(f"{s} = {n} ({where[s]})" for s, n in sizes.items())
            raise CallError(
                f"target {_META['target']!r}: the sizes {named} break the condition "
                f"{guard!r} that the captured code relies on; pass sizes that satisfy it"
            )
    if _META["engine"] == "frozen":
        for (t, path), spec in zip(leaves, _META["tensor_inputs"]):
            want = [_eval(e, sizes) for e in spec["stride"]]
            if not _same_strides(t, want):
                raise CallError(
                    f"target {_META['target']!r}, {path}: stride {list(t.stride())} (the captured "
                    f"layout at these sizes is {want}; {_layout_hint(want, t.shape)})"
                )
