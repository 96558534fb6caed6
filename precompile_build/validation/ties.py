"""Index results that differ from the reference only where the values they pick from tie.

An argmax (a greedy decoding step's next token) over values that two candidates reach
within rounding picks either, and compiled kernels, which sum in another order than
eager, may pick the other one: at batch 8 of an 8B Llama under max-autotune on an H200,
one of 8 tokens did. The mismatch fraction of such a value is not rounding that a
multiple of eager's error can allow (eager's own can be 0), so :func:`explain_flips`
asks the question the flip raises: at each element where the pair's index differs
from the reference's, do the two candidates' values differ by no more than rounding of
the size eager's own rounding of those two values shows could turn? Then the pair's
pick is one eager could have made, and the value is accepted; else it is refused as
before. Each value is judged alone, as every value of the validation is: two results
made from one pick are not checked against each other.

Only indices that reach the value unchanged are judged (``argmax``/``argmin``,
``max.dim``/``min.dim``'s indices, through views, casts, clones and a ``copy_`` into an
input buffer of as many elements); any other path returns no explanation.
"""

from __future__ import annotations

import operator
from typing import Any, Optional

# ops that hand their input's elements on in the same flat order
_ORDER_KEEPING = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "clone", "_to_copy",
                  "alias", "detach", "contiguous", "flatten", "convert_element_type", "to"}
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
    copies = [n for n in nodes if n.op == "call_function" and _name(n.target) == "copy_"
              and n.args and n.args[0] is placeholders[k]]
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
            if getattr(src, "op", None) == "call_function" and _name(src.target) in _PICKS_WITH_VALUES \
                    and len(src.args) > 1:
                return src, src.args[0], src.args[1], _PICKS_WITH_VALUES[_name(src.target)]
            return None
        if name == "copy" and len(node.args) > 1:  # functional copy(self, src): src's values
            node = node.args[1]
            continue
        if name not in _ORDER_KEEPING or not node.args:
            return None
        node = node.args[0]
    return None


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


def explain_flips(gm, value_index: int, n_out: int, inputs: list, written: set, device: str,
                  frozen, ref, multiple: Optional[float] = None) -> Optional[dict]:
    """Whether every element of an integer value where ``frozen`` differs from ``ref``
    picks a candidate that ties with the reference's within eager's rounding.

    Args:
        gm: the captured graph; ``value_index`` and ``n_out``: which value (an output,
            or input ``value_index - n_out`` after the call), as validate.compare counts.
        inputs: the flat inputs the value was computed from (not modified: the inputs
            in ``written`` are cloned for each run); ``device``: their device type.
        frozen: the pair's value; ``ref``: the reference run's (same shape).
        multiple: how many times eager's rounding the pair's may be (``options
            ["validation_multiple"]``; None: numerics.multiple_for the picked values).
    Returns:
        ``{"pick", "flips", "max_gap", "gap_of_allowed"}`` where every differing
        element is such a tie: ``flips`` elements differ; a gap is the reference's
        best value minus the pair's pick's (in the picked values' units, >= 0),
        allowed ``multiple`` times the sum of eager's errors at the two candidates
        (each may be off by ``multiple`` times eager's own rounding of it);
        ``gap_of_allowed`` the largest gap / allowed (0..1). None where one element is
        not such a tie (a candidate that is infinite, or that eager computes exactly:
        then a tie goes to the first index, as in eager), or the value is no int32/int64
        pick.
    Raises:
        nothing of its own: a graph that fails to run here gives None.
    """
    import torch

    from ..capturing.sharing import run_inputs
    from .numerics import has_random_ops, multiple_for
    from .reference import reference_run

    src = _source_node(gm, value_index, n_out)
    pick = _pick(src)
    if pick is None or not isinstance(pick[1], torch.fx.Node) or not isinstance(pick[2], int):
        return None
    if frozen.dtype not in (torch.int32, torch.int64):
        return None  # a narrower integer or a bool does not hold the index it was cast from
    pick_node, values_node, dim, sign = pick
    sub = _values_graph(gm, values_node, pick_node)
    if has_random_ops(sub):  # two runs differ by more than rounding: no measure of it
        return None
    try:
        with torch.no_grad():
            eager_vals = sub(*run_inputs(inputs, written))[0]
            ref_vals = reference_run(sub, inputs, device, written=written)[0][0]
    except Exception:  # noqa: BLE001 - no explanation; the caller refuses as before
        return None
    if not eager_vals.is_floating_point() or eager_vals.shape != ref_vals.shape:
        return None
    rows_e = eager_vals.movedim(dim, -1).reshape(-1, eager_vals.shape[dim]).to(torch.float64)
    rows_r = ref_vals.to(rows_e.device).movedim(dim, -1).reshape(-1, ref_vals.shape[dim]).to(torch.float64)
    f, r = frozen.reshape(-1).to(rows_e.device, torch.int64), ref.reshape(-1).to(rows_e.device, torch.int64)
    if f.numel() != rows_e.shape[0]:
        return None  # not one index per row: a path that moves elements
    differ = (f != r).nonzero().flatten()
    if differ.numel() == 0:
        return None
    picked, best_at = f[differ], r[differ]
    if bool(((picked < 0) | (picked >= rows_e.shape[1])).any()):
        return None
    e_best, e_theirs = rows_e[differ, best_at], rows_e[differ, picked]
    r_best, r_theirs = rows_r[differ, best_at], rows_r[differ, picked]
    both = torch.stack([e_best, e_theirs, r_best, r_theirs])
    if not bool(torch.isfinite(both).all()):
        return None  # an infinite candidate (a masked logit, an overflow) has no rounding to measure
    gaps = (r_best - r_theirs) * sign
    if bool((gaps < 0).any()):
        return None  # the reference's index is not its best: the values are not what it picked from
    # eager's own rounding of the two candidates: a value computed exactly (0/1 masks,
    # a count) has none, so a tie of such values falls to the first index, as in eager
    if multiple is None:
        multiple = multiple_for(eager_vals.dtype, eager_vals.numel(), tuple(eager_vals.shape))
    allowed = multiple * ((e_best - r_best).abs() + (e_theirs - r_theirs).abs())
    if bool(((allowed <= 0) | (gaps > allowed)).any()):
        return None
    return {"pick": "argmax" if sign > 0 else "argmin", "flips": int(differ.numel()),
            "max_gap": float(gaps.max()), "gap_of_allowed": float((gaps / allowed).max())}
