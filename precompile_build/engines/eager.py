"""The `eager` engine: the captured ATen graph, no kernels.

The pair holds the calling convention and the graph; the cache is an envelope with
no blobs. Useful where no compiler works, to inspect what was traced, and as the
reference the other engines are tested against.
"""

from __future__ import annotations

import hashlib

import torch

from precompile_runtime.envelope import Envelope, dumps
from precompile_runtime.fingerprint import host_fingerprint

from ..capturing import sharing
from ..capturing.tracing import TracedCall, run_real_call, trace_call
from ..validation import numerics
from . import codegen

JUDGES_EAGER_CALL = True  # api.py hands capture_pair the real call (real_call=)

# how far the graph, run op by op, may be from the real call: the same ATen ops,
# so rounding only (another decomposition of a composite op at most)
_TOLERANCE = {"torch.float16": 1e-2, "torch.bfloat16": 5e-2}


def capture_pair(
    fn,
    args,
    kwargs,
    *,
    target: str,
    device: str,
    options: dict,
    real_call=None,
    traced: TracedCall | None = None,
    real: dict | None = None,
) -> tuple[bytes, bytes]:
    """Capture one call of ``fn`` as an eager pair.

    Args:
        real_call: runs the user's call for real, once (api.py); its results
            judge the traced graph, as in the frozen engine (``options["eager_check"]``:
            ``"refuse"`` default, ``"warn"``, ``"off"``).
        traced, real: the frozen engine's trace of this call and its real call's
            results (tracing.run_real_call), when its compiler failed and the target
            falls back to this engine: used instead of tracing and calling again.
    Returns:
        ``(source_bytes, cache_bytes)``.
    Raises:
        CaptureError: the call cannot be traced (see tracing.trace_call), or the traced
            graph computes something else than the real call (a branch eager took and
            the trace did not).
    """
    if traced is None:
        traced = trace_call(
            fn,
            args,
            kwargs,
            target=target,
            tracer=options.get("tracer"),
            guards=options.get("guards", "dynamo"),
        )
    traced.finish_dynamic(target)
    if real is None and real_call is not None:
        real = run_real_call(traced, real_call)
    if real is not None:
        _judge_by_eager_call(traced, real, target, options)
    metadata = codegen.pair_metadata(traced.metadata, "eager", [])
    if options.get("fallback_reason"):  # the frozen engine's compiler failed (api.py)
        metadata["fallback"] = {"from": "frozen", "reason": options["fallback_reason"]}
    source = codegen.render(metadata, codegen.graph_source(traced.graph_module), None).encode()
    env = Envelope(
        engine="eager",
        code_hash=hashlib.sha256(source).hexdigest(),
        fingerprint=host_fingerprint(traced.metadata["device"]),
        meta={"target": target},
    )
    return source, dumps(env)


def _judge_by_eager_call(traced: TracedCall, real: dict, target: str, options: dict) -> None:
    """The graph on the example inputs against the real call's results (outputs, then
    gradients): CaptureError (or a warning, ``options["eager_check"]``) when they differ
    beyond rounding. The mode, running the call and when to skip are shared with the
    frozen engine (numerics.eager_check_mode, tracing.run_real_call,
    numerics.eager_check_skipped); the comparison is this engine's own: the graph and
    the call run the same ATen ops, so rounding is all that may differ (the frozen
    engine judges its kernels against an fp64 reference instead)."""
    mode = numerics.eager_check_mode(options, target)
    if mode == "off" or numerics.eager_check_skipped(traced.graph_module, real):
        return
    if real["structure"]:
        numerics.warn_or_refuse(numerics.eager_structure_message(real["structure"]), mode, target)
        return
    with torch.no_grad():
        got = traced.graph_module(
            *sharing.run_inputs(traced.example_inputs, sharing.written_inputs(traced.graph_module))
        )
    for i, (g, w) in enumerate(zip(got, real["outputs"])):
        if w is None:
            continue
        tol = _TOLERANCE.get(str(w.dtype), 1e-4)
        same = (
            g.shape == w.shape
            and g.dtype == w.dtype
            and (
                torch.allclose(g.float(), w.float(), rtol=tol, atol=tol, equal_nan=True)
                if w.is_floating_point()
                else torch.equal(g, w)
            )
        )
        if same:
            continue
        diff = (g.float() - w.float()).abs().max().item() if g.shape == w.shape else None
        msg = (
            f"the traced graph's value {i} differs from what the eager call "
            f"returned at capture"
            + (
                f" (max abs difference {diff:.3g})"
                if diff is not None
                else f" (shape {list(g.shape)} vs {list(w.shape)})"
            )
            + f": {numerics.EAGER_PATH}"
        )
        numerics.warn_or_refuse(msg, mode, target)
        return
