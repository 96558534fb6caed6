"""Index results that differ from the reference only where the values they pick from tie.

An argmax (a greedy decoding step's next token) over values that two candidates reach
within rounding picks either, and compiled kernels, which sum in another order than
eager, may pick the other one: at batch 8 of an 8B Llama under max-autotune on an H200,
one of 8 tokens did. The mismatch fraction of such a value is not rounding that a
multiple of eager's error can allow (eager's own can be 0), so :func:`explain_flips`
asks the question the flip raises: at each element where the pair's index differs
from the reference's, do the two candidates' values differ by no more than rounding of
the size eager's own values show in that row could turn? Then the pair's pick is one
eager could have made, and the value is accepted; else it is refused as before.

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


def _pick(node) -> Optional[tuple[Any, int, float]]:
    """Walk back through order-keeping ops to an index pick: ``(values node, dim, sign)``."""
    while node is not None and getattr(node, "op", None) == "call_function":
        name = _name(node.target)
        if name in _PICKS and node.args:
            dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
            return (node.args[0], dim, _PICKS[name]) if dim is not None else None
        if node.target is operator.getitem and node.args[1] == 1:
            src = node.args[0]
            if getattr(src, "op", None) == "call_function" and _name(src.target) in _PICKS_WITH_VALUES \
                    and len(src.args) > 1:
                return src.args[0], src.args[1], _PICKS_WITH_VALUES[_name(src.target)]
            return None
        if name == "copy" and len(node.args) > 1:  # functional copy(self, src): src's values
            node = node.args[1]
            continue
        if name not in _ORDER_KEEPING or not node.args:
            return None
        node = node.args[0]
    return None


def _values_graph(gm, node):
    """A copy of ``gm`` whose one output is ``node``'s value (the rest of the graph kept
    as it is: its writes to inputs still run, on the caller's clones)."""
    import torch.fx

    graph = torch.fx.Graph()
    remap: dict = {}
    for n in gm.graph.nodes:
        if n.op == "output":
            break
        remap[n] = graph.node_copy(n, lambda x: remap[x])
    graph.output((remap[node],))
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
        best value minus the pair's pick's (in the picked values' units), allowed
        ``2 * multiple`` times the RMS of eager's error over that row (each side may
        be off by ``multiple`` times eager's rounding); ``gap_of_allowed`` the largest
        gap / allowed (<= 1). None where one element is not, or the value does not
        come from a pick.
    Raises:
        nothing of its own: a graph that fails to run here gives None.
    """
    import torch

    from ..capturing.sharing import run_inputs
    from .numerics import has_random_ops, multiple_for
    from .reference import reference_run

    src = _source_node(gm, value_index, n_out)
    pick = _pick(src)
    if pick is None or not isinstance(pick[0], torch.fx.Node) or not isinstance(pick[1], int):
        return None
    values_node, dim, sign = pick
    sub = _values_graph(gm, values_node)
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
    f, r = frozen.reshape(-1).to(rows_e.device), ref.reshape(-1).to(rows_e.device, frozen.dtype)
    if f.numel() != rows_e.shape[0]:
        return None  # not one index per row: a path that moves elements
    differ = (f != r).nonzero().flatten()
    if differ.numel() == 0:
        return None
    picked = f[differ]
    if bool(((picked < 0) | (picked >= rows_e.shape[1])).any()):
        return None
    best, theirs = rows_r[differ, r[differ]], rows_r[differ, picked]
    gaps = (best - theirs) * sign
    noise = (rows_e[differ] - rows_r[differ]).square().mean(dim=1).sqrt()
    if multiple is None:
        multiple = multiple_for(eager_vals.dtype, eager_vals.numel(), tuple(eager_vals.shape))
    allowed = 2 * multiple * noise
    if not bool(torch.isfinite(gaps).all()) or bool((gaps > allowed).any()):
        return None
    ratio = torch.where(allowed > 0, gaps / allowed, torch.zeros_like(gaps))  # gap 0: an exact tie
    return {"pick": "argmax" if sign > 0 else "argmin", "flips": int(differ.numel()),
            "max_gap": float(gaps.max()), "gap_of_allowed": float(ratio.max())}
