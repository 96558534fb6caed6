"""Judge a compiled pair's numbers the way torch judges compiled code.

torch's accuracy checks (``torch._dynamo.utils.same(ref, res, fp64_ref=...)``, used
by the dynamo benchmark harness) do not compare compiled code with eager
elementwise: they run the model again in fp64 and accept the compiled result when
its error against that fp64 run is not much larger than eager's own::

    rmse(compiled, fp64) <= multiplier * rmse(eager, fp64) + floor

with ``multiplier`` 3 for bf16/fp16 (and for tensors of fewer than 1000 elements,
or 4-D ones over 1x1 maps) and 2 otherwise, and ``floor`` the suite's ``tol / 10``
(1e-3 inference, 1e-2 training: :data:`TOL_INFERENCE`, :data:`TOL_TRAINING`). Here
only the captured graph is at hand, so:

- the *reference* is the captured graph interpreted in fp64 (reference.py's
  ``reference_run``, which widens one op's inputs at a time): every floating dtype
  argument of the graph (``_to_copy(dtype=bf16)``, ``convert_element_type``,
  ``full(dtype=...)``) mapped to fp64, as torch's minifier does
  (``torch._dynamo.debug_utils.cast_dtype_args_to_fp64``). An op that has no fp64
  kernel on the device runs in fp32, else in its captured dtype, with its result
  widened again; those ops are listed as ``fallback_ops``. fp32 is the reference on
  devices without fp64 (MPS);
- *eager* is the graph run in its own dtypes (what the fallback path serves);
- *frozen* is the pair's compiled code.

Errors are root-mean-square differences divided by the reference's RMS (relative
RMSE); for integer and bool values, the fraction of elements that differ from the
reference; the RMS divided by is the larger of the reference's and eager's (a value
that is ~0 in exact arithmetic is rounding noise). :func:`judge` accepts a value,
as torch's ``same`` does, when it is elementwise close to eager (``allclose`` with
``ELEMENTWISE_TOL``) or ``frozen <= multiple * eager + floor`` where ``floor`` is
:func:`floor_for` (torch's ``tol / 10``, applied to relative errors); it refuses new
NaN/inf (non-finite where eager is finite), other shapes or dtypes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ..config.capture_options import EAGER_CHECKS, option_problem  # noqa: F401 - the engines' checks, re-exported
from ..errors import CaptureError, warn_at_caller
from ..process.world import fake_reason

# torch's same() first accepts values elementwise close to eager (its default tol)
ELEMENTWISE_TOL = 1e-4
# the band of the eager-call comparison: up to `EAGER_WARN_BAND` times the
# allowed difference it warns, beyond it refuses
EAGER_WARN_BAND = 4.0
_RANDOM_OPS = (
    "rand",
    "randn",
    "randint",
    "randperm",
    "bernoulli",
    "multinomial",
    "normal",
    "uniform",
    "exponential",
    "geometric",
    "cauchy",
    "log_normal",
    "native_dropout",
    "poisson",
    "random_",
    "rrelu",
)


def sig(x: float) -> float:
    """``x`` rounded to 3 significant digits (for metadata and messages)."""
    return float(f"{x:.3g}")


def has_random_ops(gm) -> bool:
    """True when the graph draws random numbers (two runs of it differ)."""
    for n in gm.graph.nodes:
        if n.op == "call_function":
            name = str(getattr(n.target, "__name__", n.target)).split(".")[0]
            if any(name == r or name == r + "_" or name.startswith(r + "_") for r in _RANDOM_OPS):
                return True
    return False


@dataclass
class Verdict:
    """The numbers and the verdict for one value (an output, a gradient, an input
    written in place), made by :func:`judge`.

    Errors are against the reference run (:func:`reference_run`): the RMS of the
    difference divided by the larger RMS of the reference and of eager (relative, no
    unit); for integer and bool values, the fraction of elements that differ (0..1).
    """

    eager_error: float
    """Error of the graph run in its own dtypes (what eager gets), >= 0."""
    frozen_error: float
    """Error of the pair's result, >= 0; ``inf`` when refused for another shape or
    dtype or for new NaN/inf."""
    multiple: float
    """How many times eager's error the frozen error may be (:func:`multiple_for`, or
    ``options["validation_multiple"]``)."""
    floor: float
    """Error always allowed (:func:`floor_for`): torch's tol / 10 (1e-4 for inference,
    1e-3 for a training step's values), at least the dtype's unit roundoff; 0 for
    integer and bool values."""
    max_abs: float
    """Largest elementwise ``|frozen - eager|`` in the value's own units, over the
    elements finite in eager, frozen and the reference (1.0/0.0 for bool: any
    differ); ``inf`` when refused for shape/dtype or new NaN/inf."""
    scale: float
    """Largest ``|reference|`` over the finite elements (the values' magnitude, in
    their units); 0 for integer and bool values."""
    problem: Optional[str] = None
    """Why the value is refused, a phrase for the message; None: accepted."""
    elementwise: bool = False
    """True: accepted because ``frozen`` is elementwise close to eager
    (:data:`ELEMENTWISE_TOL`) although beyond the multiple."""
    near_ties: Optional[dict] = None
    """An index value accepted because each element that is neither eager's nor the
    reference's picks a candidate that ties with the reference's within rounding
    (ties.judge_pick's numbers); ``floor`` then allows the mismatch fraction so judged."""

    @property
    def allowed(self) -> float:
        """The largest accepted frozen error: ``multiple * eager_error + floor``."""
        return self.multiple * self.eager_error + self.floor

    @property
    def ratio(self) -> float:
        """frozen error / allowed (<= 1: accepted by the multiple; 0 or inf when
        nothing is allowed and the error is 0 or not)."""
        return (
            self.frozen_error / self.allowed
            if self.allowed > 0
            else (0.0 if self.frozen_error == 0 else math.inf)
        )

    def numbers(self) -> dict[str, Any]:
        """The numbers for ``PRECOMPILE_METADATA["validation"]`` and the manifest
        (JSON types; floats to 3 significant digits)."""
        return {
            "eager_error": sig(self.eager_error),
            "frozen_error": sig(self.frozen_error),
            "multiple": self.multiple,
            "floor": sig(self.floor),
            "max_abs_diff": sig(self.max_abs),
            "max_abs_value": sig(self.scale),
            "accepted_by": "elementwise"
            if self.elementwise
            else "near ties"
            if self.near_ties
            else "multiple",
            **(
                {
                    "near_ties": {
                        k: sig(x) if isinstance(x, float) else x
                        for k, x in self.near_ties.items()
                        if k != "accepted"
                    }
                }
                if self.near_ties
                else {}
            ),
        }

    def describe(self) -> str:
        """The numbers as a sentence for a message; ``{ref}`` in it is left for the
        caller to fill with the reference's name (``.format(ref="float64")``)."""
        return (
            f"error vs the {{ref}} reference {self.frozen_error:.3g} (relative RMS), eager's "
            f"{self.eager_error:.3g}, allowed {self.multiple:g} x eager + {self.floor:.3g} = "
            f"{self.allowed:.3g}; max |frozen - eager| {self.max_abs:.3g} at values up to "
            f"{self.scale:.3g}"
        )


# torch._dynamo.utils.same(ref, res, fp64_ref) as the dynamo benchmark suites call it
# (benchmarks/dynamo/common.py check_accuracy): res_error <= multiplier * ref_error + tol / 10
MULTIPLE = 2.0  # fp32 and wider
MULTIPLE_LOW_PRECISION = 3.0  # bf16/fp16 results ("false alarms" with AMP, same())
MULTIPLE_SMALL = 3.0  # < SMALL_NUMEL elements, or a 4-D value over 1x1 maps: noise dominates
SMALL_NUMEL = 1000
# the suites' default tol (huggingface.py, timm_models.py get_tolerance_and_cosine_flag):
# inference 1e-3, training 1e-2 (a training step's parameters, gradients and buffers
# after a step); the floor is tol / 10
TOL_INFERENCE = 1e-3
TOL_TRAINING = 1e-2


def multiple_for(dtype, numel: int, shape: tuple[int, ...] | None = None) -> float:
    """torch's multiplier for a value of ``dtype`` with ``numel`` elements and, where
    known, ``shape``: :data:`MULTIPLE_LOW_PRECISION` for bf16/fp16,
    :data:`MULTIPLE_SMALL` for fewer than :data:`SMALL_NUMEL` elements or a 4-D value
    whose last two dims are 1 (``same()``'s 1x1 rule), else :data:`MULTIPLE`."""
    if dtype in (torch.bfloat16, torch.float16):
        return MULTIPLE_LOW_PRECISION
    one_by_one = shape is not None and len(shape) == 4 and shape[-1] == shape[-2] == 1
    return MULTIPLE_SMALL if numel < SMALL_NUMEL or one_by_one else MULTIPLE


def floor_for(dtype, training: bool) -> float:
    """The error always allowed for a floating value (relative RMS): torch's ``tol / 10``
    (:data:`TOL_TRAINING` for a training step's values, :data:`TOL_INFERENCE` else),
    at least ``dtype``'s unit roundoff (half its machine epsilon). torch adds it to
    absolute RMS errors; here errors are relative to the values' RMS, so for values
    of RMS below 1 this floor is the stricter one."""
    return max(torch.finfo(dtype).eps / 2, (TOL_TRAINING if training else TOL_INFERENCE) / 10)


def _error(x, ref, mask, denom) -> float:
    if not x.is_floating_point():
        return float((x != ref).double().mean()) if x.numel() else 0.0
    if mask is not None and not bool(mask.all()):
        x, ref = x[mask], ref[mask]
    if x.numel() == 0:
        return 0.0
    d = x.to(torch.float64) - ref.to(torch.float64)
    return float(torch.sqrt(torch.mean(d * d))) / denom


def judge(eager, frozen, ref, *, training: bool = False) -> Verdict:
    """Numbers and verdict for one value.

    Args:
        eager: the value from the graph run in its own dtypes (a tensor, any shape).
        frozen: the same value from the pair's compiled code; judged, not trusted:
            it may have another shape or dtype.
        ref: the same value from the reference run (:func:`reference_run`: fp64, or
            fp32), ``eager``'s shape; moved to ``eager``'s device here.
        training: the value comes from a training step (a graph with a backward):
            torch's training tolerance sets the floor (:func:`floor_for`).
    Returns:
        a :class:`Verdict`. Refused (``problem`` set): another shape or dtype than
        ``eager``; NaN/inf in ``frozen`` where ``eager`` is finite; ``frozen_error >
        multiple * eager_error + floor`` unless elementwise close to ``eager``.
        Errors are computed over the elements finite in ``eager`` and ``ref``.
    Raises:
        nothing of its own (a tensor op's error only for inputs that are no tensors).
    """
    if frozen.shape != eager.shape or frozen.dtype != eager.dtype:
        return Verdict(
            0.0,
            math.inf,
            0.0,
            0.0,
            math.inf,
            0.0,
            problem=f"shape {list(frozen.shape)} {frozen.dtype}, the graph gives "
            f"{list(eager.shape)} {eager.dtype}",
        )
    floating = eager.is_floating_point()
    ref = ref.to(eager.device)
    if not floating:
        ref = ref.to(eager.dtype)
    mult = multiple_for(eager.dtype, eager.numel(), tuple(eager.shape))
    mask, denom, scale, max_abs = None, 1.0, 0.0, 0.0
    if floating and eager.numel():
        st = _stats(eager, frozen, ref)
        n = st["n"]
        rms = math.sqrt(st["ref_sq"] / n) if n else 0.0
        # a value that is ~0 in exact arithmetic (a bias gradient before a norm) is
        # rounding noise: errors relative to that noise, not to ~1e-18
        rms_e = math.sqrt(st["a_sq"] / n) if n else 0.0
        denom = max(rms, rms_e) or 1.0
        scale, max_abs = st["ref_absmax"], st["max_abs"]
        floor = floor_for(eager.dtype, training)
        eager_error = math.sqrt(st["a_err_sq"] / n) / denom if n else 0.0
        if st["new_bad"]:
            return Verdict(
                eager_error,
                math.inf,
                mult,
                floor,
                math.inf,
                scale,
                problem=f"{st['new_bad']} NaN/inf element(s) where the graph's own result is finite",
            )
        v = Verdict(
            eager_error,
            math.sqrt(st["b_err_sq"] / n) / denom if n else 0.0,
            mult,
            floor,
            max_abs,
            scale,
        )
    else:
        floor = 0.0
        if eager.numel():
            max_abs = (
                float((frozen.to(torch.float64) - eager.to(torch.float64)).abs().max())
                if eager.dtype != torch.bool
                else float((frozen != eager).any())
            )
        v = Verdict(
            _error(eager, ref, mask, denom),
            _error(frozen, ref, mask, denom),
            mult,
            floor,
            max_abs,
            scale,
        )
    if v.frozen_error > v.allowed:
        v.problem = "error beyond the allowed multiple of eager's"
        if floating and _allclose(frozen, eager):
            v.problem, v.elementwise = None, True  # torch's first step: close to eager elementwise
    return v


CHUNK = 1 << 20
"""Elements per piece when judging a value: its fp64 temporaries (8 MiB each) stay
small whatever the value's size (a 128k-vocabulary model's logits for 128 tokens are
16M elements: whole fp64 copies of them held a GiB beyond the model's own peak)."""


def _pieces(*tensors):
    """The tensors (of one shape) in aligned pieces of about :data:`CHUNK` elements,
    each flattened: blocks of whole rows of dim 0, so that a non-contiguous tensor (a
    transposed result) is copied a piece at a time, never whole."""
    if all(t.is_contiguous() for t in tensors) or tensors[0].dim() < 2:
        flat = [t.reshape(-1) for t in tensors]
        for i in range(0, flat[0].numel(), CHUNK):
            yield [t[i : i + CHUNK] for t in flat]
        return
    rows = max(1, CHUNK // max(1, tensors[0][0].numel()))
    for i in range(0, tensors[0].shape[0], rows):
        yield [t[i : i + rows].reshape(-1) for t in tensors]


def _stats(a, b, ref) -> dict:
    """Sums over the elements finite in ``a`` and ``ref`` (``n`` of them), in fp64,
    piece by piece: ``ref_sq``, ``a_sq`` (sums of squares), ``a_err_sq``,
    ``b_err_sq`` (of ``a - ref``, ``b - ref``), ``ref_absmax``, ``max_abs`` (largest
    ``|b - a|`` where ``b`` is finite too) and ``new_bad`` (elements finite in ``a``
    but not in ``b``; where there are, ``b_err_sq`` is not meaningful)."""
    out = dict.fromkeys(("ref_sq", "a_sq", "a_err_sq", "b_err_sq", "ref_absmax", "max_abs"), 0.0)
    out["n"] = out["new_bad"] = 0
    f64 = torch.float64
    for pa, pb, pr in _pieces(a, b, ref):
        fin_a, fin_b = torch.isfinite(pa), torch.isfinite(pb)
        out["new_bad"] += int((fin_a & ~fin_b).sum())
        mask = fin_a & torch.isfinite(pr)
        r, x = pr[mask].to(f64), pa[mask].to(f64)
        if not r.numel():
            continue
        out["n"] += r.numel()
        out["ref_sq"] += float(r.square().sum())
        out["a_sq"] += float(x.square().sum())
        out["a_err_sq"] += float((x - r).square().sum())
        out["ref_absmax"] = max(out["ref_absmax"], float(r.abs().max()))
        both = fin_b[mask]
        y = pb[mask].to(f64)
        if bool(both.all()):
            out["b_err_sq"] += float((y - r).square().sum())
        if bool(both.any()):
            out["max_abs"] = max(out["max_abs"], float((y[both] - x[both]).abs().max()))
    return out


def _allclose(a, b) -> bool:
    """``torch.allclose(a, b)`` at :data:`ELEMENTWISE_TOL`, NaNs equal, piece by piece."""
    return all(
        bool(torch.allclose(pa, pb, atol=ELEMENTWISE_TOL, rtol=ELEMENTWISE_TOL, equal_nan=True))
        for pa, pb in _pieces(a, b)
    )


def eager_check_mode(options: dict, target: str) -> str:
    """``options["eager_check"]`` (default ``"refuse"``), validated: one of
    :data:`EAGER_CHECKS`. Raises CaptureError naming the target and the values."""
    problem = option_problem(options, "eager_check")
    if problem:
        raise CaptureError(f"{problem}", target=target)
    return options.get("eager_check", "refuse")


def eager_check_skipped(gm, real: dict) -> Optional[str]:
    """Why the eager-call check cannot compare (the graph ``gm`` draws random numbers,
    or the call drew from Python's RNG: ``real["python_rng"]`` of
    :func:`precompile_build.capturing.tracing.run_real_call`, or the capture runs
    one rank under the fake process group: process.world.fake_reason), or None:
    it can."""
    if has_random_ops(gm):
        return "the function draws random numbers"
    if real.get("python_rng"):  # the capture warns that the value is frozen (PythonStateWarning)
        return "the function draws from Python's random state"
    return fake_reason()  # collectives of the fake process group return no data


def warn_or_refuse(text: str, mode: str, target: str) -> None:
    """An eager-call check of ``target`` that failed (``text`` says how), in ``mode``
    (:func:`eager_check_mode`): ``"warn"`` warns at the user's line that the pair is
    written anyway; otherwise raises CaptureError saying nothing is written and how to
    keep the graph's result."""
    if mode == "warn":
        warn_at_caller(
            text + "; written anyway (options={'eager_check': 'refuse'} refuses)", target=target
        )
        return
    raise CaptureError(
        text + ", or pass options={'eager_check': 'warn'} to keep the graph's "
        "result; nothing written",
        target=target,
    )


EAGER_PATH = (
    "eager took another code path than the trace (a branch on values skipped under "
    "torch.compiler.is_compiling(): use torch.where / torch.cond for a real choice; an inference "
    "fast path: nn.TransformerEncoder's zero-fills padded rows, turn it off with "
    "torch.backends.mha.set_fastpath_enabled(False))"
)
"""What the eager-call checks (engines/eager.py, validation/validate.py) say when the real
call and the traced graph disagree: why that happens and what to do."""


def eager_structure_message(structure: str) -> str:
    """The eager-call check's text when the call returned another structure than the
    trace (``structure``: run_real_call's sentence saying both); each engine adds
    what it does about it."""
    return f"{structure}: {EAGER_PATH}"


def judge_against_eager_call(
    real, frozen, ref, graph_verdict: Verdict
) -> tuple[float, float, float, bool]:
    """The eager call's own output ``real`` vs ``frozen``: returns
    ``(difference, allowed, max_abs, elementwise_close)``; ``difference`` is the
    relative RMS of ``frozen - real`` (mismatch fraction for integers), ``allowed`` is
    ``(multiple + 1) * eager_error + floor`` (the frozen error may be ``multiple *
    eager_error + floor`` and the eager call's own error is about eager_error);
    ``elementwise_close``: every element within ELEMENTWISE_TOL (absolute and
    relative) of the eager call's, which the caller accepts whatever the RMS says."""
    if real.shape != frozen.shape or real.dtype != frozen.dtype:
        return math.inf, 0.0, math.inf, False
    ref = ref.to(real.device)
    if not real.is_floating_point():
        diff = float((real != frozen).double().mean()) if real.numel() else 0.0
        return diff, graph_verdict.allowed + graph_verdict.eager_error, float(diff > 0), diff == 0
    nonfinite = sum(
        int((torch.isfinite(pr) != torch.isfinite(pf)).sum()) for pr, pf in _pieces(real, frozen)
    )
    if nonfinite:
        return math.inf, 0.0, math.inf, False
    # where real is finite so is frozen: the sums run over the elements finite in real and ref
    st = _stats(real, frozen, ref)
    n = st["n"]
    denom = max(math.sqrt(st["ref_sq"] / n), math.sqrt(st["a_sq"] / n)) if n else 0.0
    denom = denom or 1.0
    # relative RMS of frozen - real: |frozen - real|^2 = |(frozen - ref) - (real - ref)|^2,
    # summed piece by piece below (not from the two error sums: they lose the cross term)
    d_sq = 0.0
    for pr, pf, pref in _pieces(real, frozen, ref):
        mask = torch.isfinite(pref) & torch.isfinite(pr)
        d_sq += float((pf[mask].to(torch.float64) - pr[mask].to(torch.float64)).square().sum())
    diff = math.sqrt(d_sq / n) / denom if n else 0.0
    return (
        diff,
        graph_verdict.allowed + graph_verdict.eager_error,
        st["max_abs"],
        _allclose(frozen, real),
    )
