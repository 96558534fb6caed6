"""Validation at capture (frozen engine): the pair's frozen kernels judged against the
traced graph, within the memory the model needs.

:func:`validate` runs the rendered source with its kernels per case (the example
inputs; for dynamic dims, other sizes) and :func:`compare` judges each value
(numerics.judge) against the wide reference of the graph (reference.py). The runs
share the inputs the graph only reads with the caller (sharing.py): no run copies
the weights; each result is dropped as soon as it is judged.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import torch

from ..capturing import dynamic_dims, sharing
from ..capturing.tracing import TracedCall
from ..errors import CaptureError, warn_at_caller
from ..process.stats import timed
from . import numerics, reference, ties
from .numerics import sig


def validate(
    source: str,
    blobs: dict[str, bytes],
    traced: TracedCall,
    target: str,
    options: dict,
    real: dict | None = None,
) -> dict:
    """Run the source with its frozen kernels and judge it against an fp64 reference of
    the traced graph (numerics.py), on the example inputs and, for dynamic dims, at
    other sizes (dynamic_dims.example_sizes); on the example inputs also against the
    eager call's own results ``real`` (:func:`.tracing.run_real_call`).

    Returns:
        the numbers for ``PRECOMPILE_METADATA["validation"]``.
    Raises:
        CaptureError: a value is refused; the message gives the numbers.
    """
    problem = numerics.option_problem(options, "validation_multiple")
    if problem:
        raise CaptureError(f"{problem}", target=target)
    cases = [("the example inputs", traced.example_inputs)]
    dynamic = traced.metadata.get("dynamic")
    if dynamic:
        n_params = len(traced.metadata["params"])
        params, user = traced.example_inputs[:n_params], traced.example_inputs[n_params:]
        specs = traced.metadata["tensor_inputs"]
        for sizes in dynamic_dims.example_sizes(dynamic, specs, user):
            inputs = (
                params
                + [dynamic_dims.resized(t, s, sizes) for t, s in zip(user, specs)]
                + user[len(specs) :]
            )  # the trace-made constants (graph_attrs.py)
            cases.append(
                ("sizes " + dynamic_dims.describe(sizes, specs, traced.symbolic.paths), inputs)
            )
    report: dict = {
        "rule": "frozen_error <= multiple * eager_error + floor (relative RMS vs the reference)",
        "cases": [],
    }
    with tempfile.TemporaryDirectory(prefix="precompile-validate-") as kdir:
        for name, data in blobs.items():
            path = os.path.join(kdir, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        namespace: dict = {"__name__": f"precompile_validate_{target}"}
        exec(compile(source, f"<{target}.py>", "exec"), namespace)
        call = namespace["_make_call"](namespace["_load_kernels"](kdir))
        for what, inputs in cases:
            case = compare(
                call,
                traced,
                inputs,
                what,
                target,
                options,
                real if inputs is traced.example_inputs else None,
            )
            for key in ("reference", "fallback_ops"):
                report[key] = case.pop(key)
            for key in ("checked", "spilled_to_cpu"):
                if key in case:
                    report[key] = case.pop(key)
            if "eager_call" in case:
                report["eager_call"] = case.pop("eager_call")
            report["cases"].append(case)
    return report


# what to change when the pair fails at other sizes than the example's
_OTHER_SIZES = (
    "the compiled code does not hold at these sizes inside the declared ranges: "
    "narrow the marks (min=, max=) to exclude them, or capture with engine='eager'"
)
_MAX_SUGGESTED = 100  # a larger multiple than this is never rounding: not offered
_NUMERIC_FIX = (
    "if this is rounding you accept (a deep bf16/fp16 model), allow a larger multiple "
    "with options={{'validation_multiple': {m:g}}}; else capture with engine='eager' "
    "(the graph, no kernels) or engine='torch', and report the kernel"
)


_PICK_FIX = (
    "{n} of its picks are neither eager's nor the reference's, and {why}: the compiled code "
    "picks something else. Capture with engine='eager' (the graph, no kernels) or "
    "engine='torch', and report the kernel"
)


_SEED = 20240607  # any fixed seed: both sides of a comparison start from it


def _labels(traced: TracedCall, n_values: int) -> list[str]:
    """What each compared value is: outputs, gradients, then the flat inputs."""
    meta = traced.metadata
    names, n_user = traced.tensor_labels or meta["param_names"], meta["num_user_outputs"]
    labels = [f"output {i}" for i in range(n_user)]
    labels += [f"gradient of {names[i]}" for i in meta["grad_param_indices"]]
    labels += [f"parameter/buffer {n} after the call" for n in names]
    labels += [f"tensor argument {i} after the call" for i in range(n_values - len(labels))]
    return labels


@dataclass
class _Case:
    """What the steps of :func:`compare` share about the case they judge."""

    traced: TracedCall
    inputs: list
    what: str
    target: str
    example: bool  # the example inputs (else other sizes of dynamic dims)
    fix: str  # what to change when the frozen code fails on this case
    written: set  # the indexes of the inputs the graph may write (sharing.written_inputs)


def compare(
    call,
    traced: TracedCall,
    inputs: list,
    what: str,
    target: str,
    options: dict,
    real: dict | None = None,
) -> dict:
    """Run the graph (own dtypes and fp64 reference) and the frozen wrapper on
    ``inputs`` (described by ``what``; clones of those the graph may write, the others
    shared and checked to come back unchanged); judge outputs, gradients and inputs
    written in place (numerics.judge); on the example inputs also the eager call's
    results ``real``. Returns this case's numbers; raises CaptureError on a refusal."""
    example = inputs is traced.example_inputs
    case = _Case(
        traced,
        inputs,
        what,
        target,
        example,
        _FAILED_FIX if example else _OTHER_SIZES,
        sharing.written_inputs(traced.graph_module),
    )
    # the shared inputs: a digest now, another after the runs (no copy of the weights)
    digests = {i: sharing.checksum(t) for i, t in enumerate(inputs) if i not in case.written}
    a = sharing.run_inputs(inputs, case.written)
    b = sharing.run_inputs(inputs, case.written)
    cuda = sorted({t.device.index or 0 for t in inputs if t.device.type == "cuda"})
    # both runs draw from one RNG state (random ops), the caller's state is kept
    with torch.no_grad(), torch.random.fork_rng(devices=cuda):
        want, got = _run_graph_and_frozen(case, call, a, b)
        labels = _labels(traced, len(want) + len(inputs))
        _check_shared_unchanged(case, digests, labels, len(want))
        with timed("validate_reference"):
            ref_out, ref_in, info = _reference(traced, inputs, target, what, case.written)
    if ref_out is None:  # outputs and the inputs the graph writes (caches, running stats)
        idx = sorted(case.written)
        return {
            **_without_reference(
                list(want) + [a[i] for i in idx],
                list(got) + [b[i] for i in idx],
                labels[: len(want)] + [labels[len(want) + i] for i in idx],
                target,
                what,
            ),
            **info,
        }
    values = list(zip(want, got, ref_out)) + list(zip(a, b, ref_in))
    verdicts, worst = _judge_values(
        case, values, len(want), labels, info, options.get("validation_multiple")
    )
    result: dict = {"case": what, "values": sum(v is not None for v in verdicts), **info}
    if worst is not None:
        result["worst"] = {"value": labels[worst], **verdicts[worst].numbers()}
    if real is not None:
        result["eager_call"] = _against_eager_call(
            real, got, b, ref_out, ref_in, verdicts, labels, len(want), traced, target, options
        )
    return result


# what to change when the frozen wrapper fails or writes on the example inputs
_FAILED_FIX = (
    "this torch's Inductor output needs something the frozen engine does not "
    "provide. Use engine='eager' (or 'torch')"
)


def _run_graph_and_frozen(case: _Case, call, a: list, b: list) -> tuple:
    """The graph on ``a`` and the frozen wrapper on ``b``, each from the seed
    :data:`_SEED` (inside compare's no_grad and forked RNG): ``(want, got)``.
    CaptureError when either fails or they return different numbers of values."""
    torch.manual_seed(_SEED)
    try:
        with timed("validate_graph"):
            want = case.traced.graph_module(*a)
    except Exception as e:  # only at sizes other than the example's
        raise CaptureError(
            f"the captured function itself fails at {case.what} "
            f"({type(e).__name__}: {e}); declare ranges that exclude these sizes (min=, max=)",
            target=case.target,
        ) from e
    torch.manual_seed(_SEED)
    try:
        with timed("validate_frozen"):
            got = call(list(b))
    except Exception as e:
        raise CaptureError(
            f"the frozen wrapper failed on {case.what} ({type(e).__name__}: {e}); {case.fix}",
            target=case.target,
        ) from e
    if len(want) != len(got):
        raise CaptureError(
            f"the frozen wrapper returns {len(got)} outputs, the graph "
            f"{len(want)}; refusing to write a pair that computes something else",
            target=case.target,
        )
    return want, got


def _check_shared_unchanged(case: _Case, digests: dict, labels: list[str], n_out: int) -> None:
    """CaptureError when an input both runs shared (one the graph leaves alone) came
    back with another digest: the frozen kernels wrote to the caller's tensor."""
    for i, d in digests.items():
        if sharing.checksum(case.inputs[i]) != d:
            raise CaptureError(
                f"the frozen kernels wrote to {labels[n_out + i]}, which "
                f"the traced graph leaves alone, on {case.what} (the run shares it with your model: "
                f"this process's copy is changed); refusing to write a pair that computes "
                f"something else; {case.fix}",
                target=case.target,
            )


def _judge_values(
    case: _Case, values: list, n_out: int, labels: list[str], info: dict, multiple
) -> tuple[list, int | None]:
    """Judge each ``(graph, frozen, reference)`` value: the outputs, then the inputs
    after the call. Returns a numerics.Verdict per value (None for one not judged) and
    the index of the worst (the largest ratio), or None; CaptureError on a refusal."""
    mutated = set(case.traced.metadata["mutated_inputs"])
    ref_name = info["reference"] + (
        f" (ops without {info['reference']} kernels: {', '.join(info['fallback_ops'])})"
        if info["fallback_ops"]
        else ""
    )
    worst = None
    verdicts: list = []  # a numerics.Verdict per value, None for one not judged
    for i, (w, g, r) in enumerate(values):
        if i >= n_out and i - n_out not in case.written:
            verdicts.append(None)  # shared: the digests found it unchanged
            continue
        if i >= n_out and i - n_out not in mutated and torch.equal(w, case.inputs[i - n_out]):
            # an input the graph leaves alone (one it writes through an op without an
            # alias annotation, e.g. native_batch_norm's running stats, is judged below)
            if not torch.equal(w, g):
                raise CaptureError(
                    f"the frozen kernels wrote to {labels[i]}, which the traced "
                    f"graph leaves alone, on {case.what}; refusing to write a pair that computes "
                    f"something else; {case.fix}",
                    target=case.target,
                )
            verdicts.append(None)
            continue
        v, picked = _judge_value(case, i, n_out, w, g, r, multiple)
        verdicts.append(v)
        if v.problem:
            raise _refusal(case, v, picked, i, labels[i], ref_name)
        if worst is None or v.ratio > verdicts[worst].ratio:
            worst = i
    return verdicts, worst


def _judge_value(case: _Case, i: int, n_out: int, w, g, r, multiple) -> tuple:
    """numerics.judge of value ``i``, with the ``validation_multiple`` option applied
    and, for a pick (an integer result such as a next token), ties.judge_pick's
    verdict: ``(verdict, picked)`` (picked: None where it was not judged as a pick)."""
    traced = case.traced
    v = numerics.judge(w, g, r, training=bool(traced.metadata["grad_param_indices"]))
    if multiple is not None and v.problem and v.problem.startswith("error beyond"):
        v.multiple = float(multiple)
        v.problem = None if v.frozen_error <= v.allowed else v.problem
    picked = None
    if (
        not w.is_floating_point()
        and (v.problem is None or v.problem.startswith("error beyond"))
        and v.frozen_error > 0
    ):
        # a pick (a next token) is judged element by element, not by a mismatch
        # fraction: eager's, the reference's, or a tie within rounding (ties.py)
        picked = ties.judge_pick(
            traced.graph_module,
            i,
            n_out,
            case.inputs,
            case.written,
            traced.metadata["device"],
            w,
            g,
            r,
            float(multiple) if multiple is not None else None,
        )
        if picked is not None and picked["accepted"]:
            v.problem = None
            v.floor = max(v.floor, v.frozen_error - v.multiple * v.eager_error)
            v.near_ties = picked if picked["flips"] else None
        elif picked is not None:
            v.problem = v.problem or "picks beyond rounding"
    return v, picked


def _refusal(case: _Case, v, picked, i: int, label: str, ref_name: str) -> CaptureError:
    """The CaptureError for value ``i`` (``label``) whose verdict ``v`` has a problem:
    the numbers, and what to change (a larger multiple, another engine, the ranges)."""
    numbers = v.describe().format(ref=ref_name) if math.isfinite(v.frozen_error) else ""
    need = _suggest(v)
    if picked is not None:  # a multiple of a mismatch fraction says nothing of a pick
        why = (
            f"their candidates do not tie within {picked['multiple']:g} x eager's rounding of "
            "their difference"
            if "multiple" in picked
            else "no rounding measures them (an infinite, exactly computed or random candidate)"
        )
        suggestion = _PICK_FIX.format(n=picked["flips"], why=why) if case.example else _OTHER_SIZES
    elif not math.isfinite(need):
        suggestion = case.fix
    elif need <= _MAX_SUGGESTED:
        suggestion = _NUMERIC_FIX.format(m=need)
    else:
        suggestion = (
            f"that is {v.frozen_error / max(v.eager_error, 1e-300):.3g} x eager's error, far "
            "past rounding: the compiled code computes something else. Capture with "
            "engine='eager' (the graph, no kernels) or engine='torch', and report the kernel"
        )
    return CaptureError(
        f"the frozen kernels' value {i} ({label}) differs from the "
        f"traced graph on {case.what}; {v.problem}"
        + (f": {numbers}" if numbers else "")
        + "; refusing to write a pair that computes something else"
        + ("" if case.example else f"; {_OTHER_SIZES}")
        + ("" if not case.example else f"; {suggestion}"),
        target=case.target,
    )


def _reference(traced: TracedCall, inputs: list, target: str, what: str, written):
    """reference.reference_run in fp64, else fp32 (an op the interpreter cannot widen,
    e.g. a user kernel that takes a dict of tensors); CaptureError if neither runs.
    Where neither fits in memory (reference.py widens one op at a time and moves to
    the CPU, so only an op larger than the host can hold), ``(None, None, info)``:
    the caller judges the values against the graph run instead."""
    errors, memory = [], False
    for dtype in (None, torch.float32):
        try:
            return reference.reference_run(
                traced.graph_module, inputs, traced.metadata["device"], dtype, written=written
            )
        except Exception as e:  # noqa: BLE001 - the graph ran in its own dtypes: the widening broke it
            memory = memory or reference._is_oom(e)
            errors.append(f"{type(e).__name__}: {e}")
    if memory:
        return (
            None,
            None,
            {
                "reference": "none",
                "fallback_ops": [],
                "checked": "no wider-dtype reference fits in memory ("
                + errors[-1][:200]
                + "): the values are checked elementwise "
                "against the graph run in its own dtypes",
            },
        )
    raise CaptureError(
        f"the traced graph does not run in a wider dtype on {what} "
        f"(fp64: {errors[0][:300]}; fp32: {errors[1][:300]}), so the frozen kernels cannot be "
        "judged against a reference; capture with engine='eager' and report the op",
        target=target,
    )


# elementwise tolerances (rtol = atol) where no reference fits in memory: the graph
# run and the kernels round differently, by about the dtype's resolution
_NO_REFERENCE_TOL = {"torch.float16": 1e-2, "torch.bfloat16": 5e-2}


def _without_reference(want, got, labels, target: str, what: str) -> dict:
    """Judge the frozen results against the graph run alone (no reference fitted in
    memory): each floating value elementwise within its dtype's tolerance
    (``_NO_REFERENCE_TOL``, else 1e-4), others equal. Returns the case's numbers;
    raises CaptureError on the first value outside."""
    worst = (0.0, None)
    for i, (w, g) in enumerate(zip(want, got)):
        if g.shape != w.shape or g.dtype != w.dtype:
            ok, diff = False, float("inf")
        elif w.is_floating_point():
            tol = _NO_REFERENCE_TOL.get(str(w.dtype), 1e-4)
            ok = bool(torch.allclose(g, w, rtol=tol, atol=tol, equal_nan=True))
            # the values' own dtype: no wide copy on the path taken for want of memory
            diff = float((g - w).abs().max()) if w.numel() else 0.0
        else:
            ok = bool(torch.equal(g, w))
            diff = 0.0 if ok else 1.0
        if not ok:
            raise CaptureError(
                f"the frozen kernels' value {i} ({labels[i]}) differs from the "
                f"traced graph on {what} beyond its dtype's tolerance (max |frozen - graph| "
                f"{diff:.3g}; no wider-dtype reference fits in memory); refusing to write a pair "
                "that computes something else; capture with engine='eager' and report the kernel",
                target=target,
            )
        if diff >= worst[0]:
            worst = (diff, labels[i])
    return {
        "case": what,
        "values": len(want),
        "worst": {"value": worst[1], "max_abs_diff": sig(worst[0])},
    }


def _suggest(v) -> float:
    """A multiple that would accept ``v`` (rounded up to a readable number)."""
    need = (v.frozen_error - v.floor) / v.eager_error if v.eager_error > 0 else math.inf
    if not math.isfinite(need):
        return float("inf")
    return float(f"{need * 1.25:.2g}")


def _against_eager_call(
    real: dict,
    got,
    b,
    ref_out,
    ref_in,
    verdicts,
    labels,
    n_out: int,
    traced: TracedCall,
    target: str,
    options: dict,
) -> dict:
    """The frozen results vs the eager call's own results on the example
    inputs. Within the allowed difference: ok; up to numerics.EAGER_WARN_BAND times
    it: a warning; beyond: CaptureError (``options['eager_check']``: ``'warn'`` only
    warns, ``'off'`` skips). Returns the numbers."""
    mode = numerics.eager_check_mode(options, target)
    if mode == "off":
        return {"outcome": "off"}
    skipped = numerics.eager_check_skipped(traced.graph_module, real)
    if skipped:
        return {"outcome": f"skipped: {skipped}"}
    if real.get("structure"):
        numerics.warn_or_refuse(numerics.eager_structure_message(real["structure"]), mode, target)
        return {"outcome": "warned", "structure": real["structure"]}
    pairs = [
        (i, real["outputs"][i], got[i], ref_out[i])
        for i in range(min(n_out, len(real["outputs"])))
        if real["outputs"][i] is not None
    ]
    pairs += [
        (n_out + i, t, b[i], ref_in[i])
        for i, t in real["inputs"].items()
        if verdicts[n_out + i] is not None
    ]
    worst = None
    for i, r, g, ref in pairs:
        v = verdicts[i]
        if v is None:
            continue
        diff, allowed, max_abs, close = numerics.judge_against_eager_call(r, g, ref, v)
        ratio = diff / allowed if allowed > 0 else (0.0 if diff == 0 else math.inf)
        if close:  # every element within ELEMENTWISE_TOL of the eager call's: accepted
            ratio = min(ratio, 1.0)
        if worst is None or ratio > worst[0]:
            worst = (ratio, i, diff, allowed, max_abs, v, close)
    if worst is None:
        return {"outcome": "ok", "values": 0}
    ratio, i, diff, allowed, max_abs, v, close = worst
    numbers = {
        "value": labels[i],
        "difference": numerics.sig(diff) if math.isfinite(diff) else "inf",
        "allowed": numerics.sig(allowed),
        "max_abs_diff": numerics.sig(max_abs) if math.isfinite(max_abs) else "inf",
        "max_abs_value": numerics.sig(v.scale),
        "values": len(pairs),
    }
    if close and diff > allowed:  # accepted elementwise, not by the RMS: say so
        numbers["elementwise_close"] = numerics.ELEMENTWISE_TOL
    if ratio <= 1:
        return {"outcome": "ok", **numbers}
    text = (
        f"the frozen result's value {i} ({labels[i]}) differs from what "
        f"the eager call returned at capture: relative RMS difference {diff:.3g} (allowed "
        f"{allowed:.3g}, {ratio:.3g} x that), max |frozen - eager call| {max_abs:.3g} at values "
        f"up to {v.scale:.3g}. The traced graph does not compute what eager computed: "
        f"{numerics.EAGER_PATH}, or the function depends on state the capture does not see"
    )
    if ratio <= numerics.EAGER_WARN_BAND or mode == "warn":
        warn_at_caller(
            text + "; written anyway (options={'eager_check': 'refuse'} refuses)"
            if mode == "warn"
            else text + "; written anyway (within "
            f"{numerics.EAGER_WARN_BAND:g} x the allowed difference; "
            "options={'eager_check': 'off'} skips this check)",
            target=target,
        )
        return {"outcome": "warned", **numbers}
    raise CaptureError(
        text + "; refusing to write the pair. Make eager and the trace take one "
        "path, or pass options={'eager_check': 'warn'} to keep the graph's result",
        target=target,
    )
