"""Index results that differ from the reference only where the values they pick from tie.

An argmax (a greedy decoding step's next token) over values that two candidates reach
within rounding picks either, and compiled kernels, which sum in another order than
eager, may pick the other one: at batch 8 of an 8B Llama under max-autotune on an H200,
one of 8 tokens did. The mismatch fraction of such a value is not rounding that a
multiple of eager's error can judge: eager's own can be 0, and where eager flips one
tie, a multiple of its fraction would let the pair pick anything at as many other
elements. :func:`judge_pick` asks, element by element, the question a flip raises: is
the pair's pick eager's, the reference's, or a candidate whose value differs from the
reference's best by no more than rounding of the size eager's own error on that
difference shows could turn? Each value is judged alone, as every value of the
validation is: two results made from one pick are not checked against each other.

Only indices that reach the value unchanged are judged (``argmax``/``argmin``,
``max.dim``/``min.dim``'s indices, through views, int32/int64 casts, clones and a
``copy_`` into an int32/int64 input buffer of as many elements); any other integer
value keeps the mismatch-fraction rule of numerics.judge.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

import torch

from ..capturing.sharing import run_inputs
from . import reference
from .numerics import has_random_ops, multiple_for

# ops that hand their input's elements on in the same flat order
_ORDER_KEEPING = {
    "view",
    "_unsafe_view",
    "reshape",
    "unsqueeze",
    "squeeze",
    "clone",
    "_to_copy",
    "alias",
    "detach",
    "contiguous",
    "flatten",
    "convert_element_type",
    "to",
}
_PICKS = {"argmax": 1.0, "argmin": -1.0}  # the sign that makes the pick a maximum
_PICKS_WITH_VALUES = {"max": 1.0, "min": -1.0}  # .dim overloads: (values, indices)


def _name(target) -> str:
    return str(getattr(target, "__name__", target)).split(".")[0]


def _source_node(gm, value_index: int, n_out: int):
    """The graph node whose result is value ``value_index`` (an output, or what the graph
    copies into input ``value_index - n_out``); None where it is not found."""
    nodes = list(gm.graph.nodes)
    if value_index < n_out:
        out = next(n for n in nodes if n.op == "output").args[0]
        outs = out if isinstance(out, (list, tuple)) else [out]
        return outs[value_index] if value_index < len(outs) else None
    placeholders = [n for n in nodes if n.op == "placeholder"]
    k = value_index - n_out
    if k >= len(placeholders):
        return None
    copies = [
        n
        for n in nodes
        if n.op == "call_function"
        and _name(n.target) == "copy_"
        and n.args
        and n.args[0] is placeholders[k]
    ]
    return copies[-1].args[1] if copies else None


def _pick(node) -> Optional[tuple[Any, Any, int, float]]:
    """Walk back through order-keeping ops to an index pick: ``(pick node, values node,
    dim, sign)``."""
    while node is not None and getattr(node, "op", None) == "call_function":
        name = _name(node.target)
        if name in _PICKS and node.args:
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            return (node, node.args[0], dim, _PICKS[name]) if dim is not None else None
        if node.target is operator.getitem and node.args[1] == 1:
            src = node.args[0]
            if (
                getattr(src, "op", None) == "call_function"
                and _name(src.target) in _PICKS_WITH_VALUES
                and len(src.args) > 1
            ):
                return src, src.args[0], src.args[1], _PICKS_WITH_VALUES[_name(src.target)]
            return None
        if name == "copy" and len(node.args) > 1:  # functional copy(self, src): src's values
            if not _holds_indices(node):
                return None
            node = node.args[1]
            continue
        if name not in _ORDER_KEEPING or not node.args or not _holds_indices(node):
            return None
        node = node.args[0]
    return None


def _holds_indices(node) -> bool:
    """The node's result keeps every index exactly: int32 or int64 (a cast to int8 or
    bf16 wraps or rounds them); unknown without the trace's ``meta["val"]``."""
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype in (torch.int32, torch.int64)


def _values_graph(gm, node, pick):
    """A copy of ``gm`` up to (not including) ``pick``, whose one output is ``node``'s
    value as the pick saw it: nothing after the pick (a write into the same buffer)
    runs. Its writes before the pick run on the caller's clones."""
    import torch.fx

    graph = torch.fx.Graph()
    remap: dict = {}
    for n in gm.graph.nodes:
        if n is pick or n.op == "output":
            break
        remap[n] = graph.node_copy(n, lambda x: remap[x])
    graph.output((graph.call_function(torch.clone, (remap[node],)),))
    return torch.fx.GraphModule(gm, graph)


def judge_pick(
    gm,
    value_index: int,
    n_out: int,
    inputs: list,
    written: set,
    device: str,
    eager,
    frozen,
    ref,
    multiple: Optional[float] = None,
) -> Optional[dict]:
    """Judge an integer value that an argmax/argmin (or max/min indices) picks, element
    by element: each element must be eager's pick, the reference's, or a candidate that
    ties with the reference's within eager's rounding.

    Args:
        gm: the captured graph; ``value_index`` and ``n_out``: which value (an output,
            or input ``value_index - n_out`` after the call), as validate.compare counts.
        inputs: the flat inputs the value was computed from (not modified: the inputs
            in ``written`` are cloned for each run); ``device``: their device type.
        eager, frozen, ref: the value from the graph run in its own dtypes, from the
            pair, from the reference run (one shape).
        multiple: how many times eager's rounding the pair's may be (``options
            ["validation_multiple"]``; None: numerics.multiple_for the picked values).
    Returns:
        None where the value is no int32/int64 pick this module follows (the caller's
        rule stands). Else ``{"accepted", "pick", "flips", "multiple", "max_gap",
        "gap_of_allowed"}`` (the last three once the gaps were measured): ``flips`` elements are neither eager's nor the
        reference's; each is accepted when the reference's best value minus the pair's
        pick's (its gap, in the values' units, >= 0) is at most ``multiple`` times
        eager's error on that difference, or 0 while eager rounds the two candidates
        (a kernel that sums them in another order can break the tie either way); an
        infinite candidate, or a tie of values eager computes exactly (the first
        index wins, as in eager), is refused. ``gap_of_allowed``: the largest gap /
        allowed of the accepted.
    Raises:
        nothing of its own: a graph that fails to run here counts as refused.
    """
    pick = _pick(_source_node(gm, value_index, n_out))
    if (
        pick is None
        or not isinstance(pick[1], torch.fx.Node)
        or not isinstance(pick[2], int)
        or frozen.dtype not in (torch.int32, torch.int64)
    ):
        return None
    pick_node, values_node, dim, sign = pick
    name = "argmax" if sign > 0 else "argmin"
    dev = eager.device
    e, f, r = (t.reshape(-1).to(dev, torch.int64) for t in (eager, frozen, ref))
    differ = ((f != r) & (f != e)).nonzero().flatten()
    refused = {"accepted": False, "pick": name, "flips": int(differ.numel())}
    if differ.numel() == 0:
        return {"accepted": True, "pick": name, "flips": 0}
    sub = _values_graph(gm, values_node, pick_node)
    if has_random_ops(sub):  # two runs differ by more than rounding: no measure of it
        return refused
    try:
        with torch.no_grad():
            eager_vals = sub(*run_inputs(inputs, written))[0]
            ref_vals = reference.reference_run(sub, inputs, device, written=written)[0][0]
    except Exception:  # noqa: BLE001 - no measure of the rounding: refused
        return refused
    if (
        not eager_vals.is_floating_point()
        or eager_vals.shape != ref_vals.shape
        or eager_vals.numel() // eager_vals.shape[dim] != f.numel()
    ):
        return refused  # not one index per row: a path that moves elements
    rows_e = eager_vals.movedim(dim, -1).reshape(-1, eager_vals.shape[dim]).to(torch.float64)
    rows_r = (
        ref_vals.to(rows_e.device)
        .movedim(dim, -1)
        .reshape(-1, ref_vals.shape[dim])
        .to(torch.float64)
    )
    differ = differ.to(rows_e.device)
    picked, best_at = f.to(rows_e.device)[differ], r.to(rows_e.device)[differ]
    if bool(((picked < 0) | (picked >= rows_e.shape[1])).any()):
        return refused
    e_best, e_theirs = rows_e[differ, best_at], rows_e[differ, picked]
    r_best, r_theirs = rows_r[differ, best_at], rows_r[differ, picked]
    if not bool(torch.isfinite(torch.stack([e_best, e_theirs, r_best, r_theirs])).all()):
        return refused  # an infinite candidate (a masked logit, an overflow) has no rounding to measure
    gaps = (r_best - r_theirs) * sign
    if bool((gaps < 0).any()):
        return refused  # the reference's index is not its best: not the values it picked from
    # eager's error on the difference that decides the pick: an error both candidates
    # share (an offset added to the row) cannot reorder them
    if multiple is None:
        multiple = multiple_for(eager_vals.dtype, eager_vals.numel(), tuple(eager_vals.shape))
    allowed = multiple * ((e_best - e_theirs) - (r_best - r_theirs)).abs()
    rounded = ((e_best - r_best).abs() + (e_theirs - r_theirs).abs()) > 0
    ok = (gaps <= allowed) & ((allowed > 0) | ((gaps == 0) & rounded))
    ratio = torch.where(allowed > 0, gaps / allowed, torch.zeros_like(gaps))
    return {
        "accepted": bool(ok.all()),
        "pick": name,
        "flips": int(differ.numel()),
        "multiple": multiple,
        "max_gap": float(gaps.max()),
        "gap_of_allowed": float(ratio.max()),
    }
