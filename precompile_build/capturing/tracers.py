"""Tracers: how the flat function of one captured call becomes an ATen graph.

The flat function (tracing.py) takes the lifted parameters/buffers and the tensor
leaves of the arguments, and returns the tensor leaves of the result (then the
parameter gradients of a captured backward). A tracer turns it into a
``torch.fx.GraphModule`` of ATen ops over the same flat inputs and outputs, with
in-place writes to inputs (mutated buffers) kept as in-place ops:

=================  ==========================================================  ============
tracer             what runs                                                   libraries see
=================  ==========================================================  ============
``export``         what ``torch.export.export(strict=False)`` then             ``torch.compiler.is_compiling()``
                   ``run_decompositions({})`` make, in one trace where torch    and ``is_exporting()`` True:
                   allows (aten_export.py; functional ATen; input mutations    their trace-friendly paths
                   become ``copy_`` back into the input)
``export-strict``  the same with ``strict=True`` (TorchDynamo reads the         the same
                   bytecode; slower, refuses more, catches side effects)
``make_fx``        ``make_fx`` (real tensors; fake tensors with symbols when   the same (set here, as
                   dims are marked dynamic, see dynamic_dims.py)               export does)
=================  ==========================================================  ============

``auto`` (the default) is ``export``, with two exceptions. A call that runs a
backward (``loss.backward()`` inside: the trace produced parameter gradients) is
traced with ``make_fx``: its joint trace of forward and backward is what the frozen
engine has always served, where torch.export's IR is an inference graph (the
one-pass export fails inside the backward instead: that failure counts as a
backward, :func:`aten_export.raised_in_backward`). And when
export fails, ``make_fx`` is tried: on real tensors it can take a data-dependent
branch (``if x.sum() > 0``) that export refuses; a failure of both names both.
Dynamic dims map onto export's ``dynamic_shapes`` as ``Dim.AUTO(min=, max=)``, so
export specialises instead of raising and :func:`dynamic_dims.finish` reports what
the code did to each marked dim with the same messages for every tracer.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import sysconfig
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..config.choices import TRACERS, Tracer, check_tracer  # noqa: F401 - check_tracer re-exported
from ..errors import CaptureError, TracerFallbackWarning, torch_warnings_shown, warn_at_caller
from . import aten_export, dynamic_dims
from .layouts import example_clone


@dataclass
class Traced:
    """What :func:`trace` returns: one call's ATen graph and how it was made."""

    graph_module: Any
    """``torch.fx.GraphModule`` over the flat inputs (lifted parameters/buffers, then
    the user's tensors) returning the flat function's outputs (tensor results, then
    parameter gradients, see tracing.py); writes to inputs stay in-place ops."""
    symbolic: Any
    """``dynamic_dims.SymbolicTrace`` (the marked dims' symbols and fake inputs), or
    None when no dim is marked."""
    tracer: Tracer
    """The tracer that made the graph: ``"export"``, ``"export-strict"`` or
    ``"make_fx"`` (never ``"auto"``)."""


@contextlib.contextmanager
def compiling_state():
    """``torch.compiler.is_compiling()`` and ``is_exporting()`` answer True inside, as
    under torch.export (torch/export/_trace.py ``_compiling_state_context``): library
    code (transformers, timm) then skips data-dependent checks such as
    ``if mask.all():`` and takes the paths it takes under torch.compile."""
    import torch.compiler as tc

    flags = [f for f in ("_is_compiling_flag", "_is_exporting_flag") if hasattr(tc, f)]
    saved = {f: getattr(tc, f) for f in flags}
    for f in flags:
        setattr(tc, f, True)
    try:
        yield
    finally:
        for f, v in saved.items():
            setattr(tc, f, v)


def trace(
    flat_fn: Callable,
    example: list,
    *,
    n_params: int,
    marks: list,
    paths: list,
    target: str,
    tracer: str,
    ran_backward: Callable[[], bool],
    sharded: bool = False,
    watching: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> Traced:
    """Trace ``flat_fn(*example)`` with ``tracer`` (see the module docstring).

    Args:
        flat_fn: the flat function (tensors in, tuple of tensors out).
        example: flat example tensors, lifted parameters first (``n_params`` of them);
            make_fx and the strict re-run run on clones of them; non-strict export
            runs on fake copies (nothing is written: the caller's tensors may be passed).
        marks: per user tensor, its marked dims ``{dim: (min, max|None)}``.
        paths: per user tensor, its argument path, for messages.
        target: the target name, for messages.
        tracer: one of :data:`TRACERS` (already checked).
        ran_backward: answers, after a trace, whether that trace computed parameter
            gradients (a backward inside the call).
        sharded: the model has DTensor parameters (dtensors.py): ``auto`` is make_fx,
            which traces the DTensors the flat function makes from the shards
            (torch.export refuses to construct one inside its trace), on fake
            copies of the example (a tensor-parallel shard is big: no clone of it).
        watching: a context entered around each run of ``flat_fn``'s Python that a
            tracer makes (assumed_state.Recorder.watching records the reads), never
            around TorchDynamo's trace.
    Returns:
        a :class:`Traced`.
    Raises:
        CaptureError: the trace failed; the message names the tracer(s), the error,
            the line of user or library code that raised it, and what to try.
    """

    def make_fx():
        with watching():
            return _make_fx(flat_fn, example, n_params, marks, paths, target, fake=sharded)

    if tracer == "make_fx" or (sharded and tracer == "auto"):
        return _with_message(make_fx, "make_fx", target)
    if sharded:
        raise CaptureError(
            f"the model has DTensor parameters (sharded with parallelize_module), which tracer={tracer!r} "
            "cannot trace (torch.export refuses the DTensors the capture makes from their shards); use "
            "tracer='auto' or 'make_fx' (`tracer` in the target)",
            target=target,
        )
    strict = tracer == "export-strict"
    name = "export-strict" if strict else "export"
    try:
        traced = _export(flat_fn, example, n_params, marks, paths, target, strict, watching)
    except CaptureError:
        raise
    except Exception as e:
        if aten_export.raised_in_backward(
            e
        ):  # a training step, which make_fx traces (see ran_backward below)
            if tracer != "auto":
                raise _backward_refused(tracer, target) from e
            return _with_message(make_fx, "make_fx", target)
        if tracer != "auto":
            raise _failure(target, [(name, e)]) from e
        if _is_data_dependent(
            e
        ):  # strict export may keep it symbolic; make_fx would freeze its path
            strict_traced = _strict_for_data_dependent(
                e, lambda: _export(flat_fn, example, n_params, marks, paths, target, True, watching)
            )
            if strict_traced is not None:
                return strict_traced
            raise _failure(target, [(name, e)]) from e
        try:
            traced = make_fx()
        except CaptureError:
            raise
        except Exception as e2:
            raise _failure(target, [(name, e), ("make_fx", e2)]) from e2
        if ran_backward():  # a training step export could not finish: make_fx's job anyway
            return traced
        where = _culprit(e)
        warn_at_caller(
            f"torch.export failed ({_first_line(e)}"
            + (f" at {where}" if where else "")
            + "); traced with make_fx, which "
            "specialises data-dependent branches to the example's path",
            TracerFallbackWarning,
            target=target,
        )
        return traced
    if ran_backward():
        if tracer != "auto":
            raise _backward_refused(tracer, target)
        return _with_message(make_fx, "make_fx", target)
    return traced


def _strict_for_data_dependent(e: BaseException, strict: Callable[[], Traced]) -> Traced | None:
    """``auto``: where non-strict export failed on a size the data decides, strict export's
    trace, or None. Non-strict export specialises ``int(x.sum().item())`` (Python's
    ``int()`` of a SymInt guards on its value: "Could not extract specialized integer");
    TorchDynamo keeps it a symbol, as torch.compile does, so ``torch.zeros(int(n))``
    gets a size the data decides (unbacked.py). None where strict export fails too
    (a branch on such a value: the capture refuses it). Called for data-dependent
    failures only (:func:`_is_data_dependent`)."""
    try:
        return strict()
    except Exception:  # noqa: BLE001 - (non-strict's error is the one reported)
        return None


def _backward_refused(tracer: str, target: str) -> CaptureError:
    return CaptureError(
        "the function runs a backward (loss.backward()), which "
        f"tracer={tracer!r} does not capture; use tracer='make_fx' or 'auto' (the default), "
        "which trace forward and backward together",
        target=target,
    )


def _with_message(run: Callable[[], Traced], name: str, target: str) -> Traced:
    try:
        return run()
    except CaptureError:
        raise
    except Exception as e:
        raise _failure(target, [(name, e)]) from e


@torch_warnings_shown()
def _make_fx(flat_fn, example, n_params, marks, paths, target, fake: bool = False) -> Traced:
    """make_fx of the flat function: on clones of the example (real tensors: a branch on
    values takes the example's path), or with ``fake`` on fake copies of it (a sharded
    model: no clone of its shards, as torch.export; the model runs its trace-friendly
    paths under compiling_state)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with compiling_state():
        if fake and not any(marks):
            gm = make_fx(flat_fn, tracing_mode="fake")(*example)
            return Traced(gm, None, "make_fx")
        if any(marks):  # marked dims stay symbolic: trace on fake tensors
            with dynamic_dims.size_oblivious():
                fakes, symbolic = dynamic_dims.fake_inputs(example, n_params, marks, paths, target)
                gm = make_fx(flat_fn, tracing_mode="symbolic")(*fakes)
            return Traced(gm, symbolic, "make_fx")
        with _values_refused(target):
            gm = make_fx(flat_fn, tracing_mode="real")(*[example_clone(t) for t in example])
        if _data_dependent_ops(gm):
            _refuse_frozen_decisions(flat_fn, example, target)
    return Traced(gm, None, "make_fx")


@contextlib.contextmanager
def _values_refused(target: str):
    """While make_fx traces real tensors: a tensor's values read into Python
    (``x.numpy()``, ``np.asarray(x)``, ``x.tolist()``) raise CaptureError, since they
    bypass the dispatcher and the graph would hold the example's values for every
    input (torch.export turns them into symbols or fails; make_fx cannot see them)."""

    def refusing(name):
        def read(self, *args, **kwargs):
            raise CaptureError(
                f"the function reads a tensor's values into Python (x.{name}()"
                + (f" at {where}" if (where := _user_frame()) else "")
                + "); make_fx would build "
                "the example's values into the graph for every input. Keep the computation in "
                "torch (x.abs().max() instead of abs(x.numpy()).max()), or make the function "
                "traceable by torch.export (tracer='export' says why it is not)",
                target=target,
            )

        return read

    names = ("numpy", "tolist")  # (methods of torch._C.TensorBase: shadowed on torch.Tensor)
    saved = {name: torch.Tensor.__dict__.get(name) for name in names}
    try:
        for name in names:
            setattr(torch.Tensor, name, refusing(name))
        yield
    finally:
        for name, orig in saved.items():
            if orig is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, orig)


def _user_frame() -> str:
    """``file:line`` of the innermost frame outside torch and this package."""
    skip = (
        os.path.dirname(torch.__file__),
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        os.path.dirname(contextlib.__file__),
    )
    frame: Any = sys._getframe(2)
    while frame is not None:
        if not frame.f_code.co_filename.startswith(skip):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def _data_dependent_ops(gm) -> list[str]:
    """The ops of a graph whose output sizes come from the data (``nonzero``, a boolean
    mask's ``index``, ``unique``, ...: torch tags them ``dynamic_output_shape``)."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        tags = n.target.tags
        if (
            torch.Tag.dynamic_output_shape not in tags
            and torch.Tag.data_dependent_output not in tags
        ):
            continue
        if n.target is torch.ops.aten.index.Tensor and not any(
            getattr(getattr(i, "meta", {}).get("val"), "dtype", None) in (torch.bool, torch.uint8)
            for i in (n.args[1] if len(n.args) > 1 else ())
        ):
            continue  # integer indices: the output has the index's size
        out.append(str(n.target))
    return out


def _refuse_frozen_decisions(flat_fn, example, target: str) -> None:
    """A real-tensor trace of a graph with data-dependent sizes saw one size, the
    example's: if Python code decided on it (``if nonzero(x).shape[0] > 8``) or passed
    it on (``torch.zeros(n)``), the graph holds that decision for every input. Trace
    once more on fake tensors whose data-dependent sizes are unbacked symbols (static
    shapes otherwise), as torch.export does: a decision on one raises, a size passed
    on shows as a symbol with users. Raises CaptureError in either case."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols

    mode = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=True)
    try:
        with mode, compiling_state():
            fakes = [mode.from_tensor(t, static_shapes=True) for t in example]
            probe = make_fx(flat_fn, tracing_mode="real")(*fakes)
    except Exception as e:
        raise _frozen_decision(target, e) from e
    for n in probe.graph.nodes:
        v = n.meta.get("val")
        if (
            isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool))
            and n.users
            and free_unbacked_symbols(v)
        ):
            where = n.meta.get("stack_trace", "").strip().splitlines()
            raise CaptureError(
                "tracer 'make_fx' would freeze a size computed from the data: the function passes "
                f"it on ({n.name} -> {', '.join(u.name for u in n.users)}"
                + (f", at {where[-2].strip()}" if len(where) >= 2 else "")
                + "), and a real-tensor "
                "trace has the example's value built in. Use the export tracer (the default), "
                "which keeps it symbolic",
                target=target,
            )


def _frozen_decision(target: str, e: BaseException) -> CaptureError:
    where = _culprit(e)
    return CaptureError(
        "tracer 'make_fx' would freeze a data-dependent decision"
        + (f" (at {where})" if where else "")
        + ": the line decides on a size or value computed "
        "from the data, and a real-tensor trace takes the example's path for every input. "
        "Compute both paths with torch.where, or choose with torch.cond; a check that only "
        "eager needs can be skipped under `if not torch.compiler.is_compiling():`. "
        f"(The check's trace said: {_first_line(e)})",
        target=target,
    )


def _is_data_dependent(e: BaseException) -> bool:
    """The trace failed because code decided on a value computed from the data."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if (
            "GuardOnDataDependent" in type(cur).__name__
            or "data-dependent" in str(cur)
            or "_local_scalar_dense" in str(cur)
        ):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


@torch_warnings_shown()
def _export(flat_fn, example, n_params, marks, paths, target, strict: bool, watching) -> Traced:
    from torch.export import Dim

    for t, dims, path in zip(example[n_params:], marks, paths):
        if dims:
            dynamic_dims.check_marks(t, dims, path, target)
    shapes = [None] * n_params + [
        {d: Dim.AUTO(min=lo, max=hi) for d, (lo, hi) in dims.items()} if dims else None
        for dims in marks
    ]
    inputs = tuple(example)  # non-strict export runs on fake copies of them: nothing is written
    with (
        dynamic_dims.size_oblivious() if any(marks) else contextlib.nullcontext(),
        contextlib.nullcontext() if strict else watching(),
    ):
        ep = aten_export.aten_program(
            flat_fn, inputs, dynamic_shapes=(tuple(shapes),) if any(marks) else None, strict=strict
        )
    if strict:  # TorchDynamo does not replay the flat function's Python side effects
        # (the recorded calling convention): run it once more, eagerly, for them
        with watching():
            flat_fn(*[example_clone(t) for t in example])
    gm = aten_export.flat_graph(ep, target)
    symbolic = None
    if any(marks):
        placeholders = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
        shape_env = next(
            (
                s.node.shape_env
                for v in placeholders
                for s in v.shape
                if isinstance(s, torch.SymInt)
            ),
            None,
        )
        if shape_env is None:  # every marked dim specialised: finish() says which
            from torch.fx.experimental.symbolic_shapes import ShapeEnv

            shape_env = ShapeEnv()
        symbolic = dynamic_dims.SymbolicTrace(
            shape_env=shape_env,
            inputs=placeholders,
            fakes=placeholders[n_params:],
            marks=marks,
            paths=paths,
        )
    return Traced(gm, symbolic, "export-strict" if strict else "export")


_OWN_DIRS = None


def _culprit(exc: BaseException) -> str:
    """``file:line: code`` of the innermost frame outside torch, this package and the
    standard library: the model or library line that broke the trace ("" if none)."""
    global _OWN_DIRS  # noqa: PLW0603 - a process-wide cache, computed once
    if _OWN_DIRS is None:
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        _OWN_DIRS = (
            os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            here + os.sep,
            sysconfig.get_paths()["stdlib"] + os.sep,
        )
    frames: list[traceback.FrameSummary] = []
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:  # the cause chain: export re-raises
        seen.add(id(e))
        frames = traceback.extract_tb(e.__traceback__) + frames
        e = e.__cause__ or e.__context__
    for f in reversed(frames):
        path = os.path.abspath(f.filename)
        if not path.startswith(_OWN_DIRS) and not f.filename.startswith("<"):
            return f"{f.filename}:{f.lineno}: {(f.line or '').strip()}"
    return ""


# torch's hints meant for its own callers, not for a capture's user (they name make_fx
# arguments this package sets), and noise in the first line of its errors
_TORCH_HINTS = re.compile(
    r"\s*It may be possible to trace this with dynamic shapes; try setting tracing_mode='symbolic' "
    r"in your make_fx call\.|\s*\(Size-like symbols: [^)]*\)|\s*\(unhinted: [^()]*(\([^()]*\)[^()]*)*\)"
)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    line = _TORCH_HINTS.sub("", text[0] if text else "").strip().rstrip(".")
    return f"{type(e).__name__}: {line}"[:400]


_ANOTHER_TRACER = (
    'try another tracer (`tracer = "export-strict"` or "make_fx" in the target, '
    "or tracer= in precompile_build.capture)"
)


def _failure(target: str, failures: list[tuple[str, BaseException]]) -> CaptureError:
    """The CaptureError of a failed trace. For a data-dependent branch our advice comes
    first, right after the line that broke the trace, and each tracer's error after it:
    a message cut short (a log line, a terminal) still says what to change."""
    data_dependent = any(_is_data_dependent(e) for _, e in failures)
    wheres = list(dict.fromkeys(w for w in (_culprit(e) for _, e in failures) if w))
    if data_dependent:
        at = f" (at {wheres[0]})" if len(wheres) == 1 else ""
        errors = "; ".join(f"{name}: {_first_line(e)}" for name, e in failures)
        return CaptureError(
            f"tracing failed on a data-dependent branch{at}: the line reads "
            "a tensor's value to decide what to run. If both paths compute the same result (an "
            "eager-only shortcut or check, as libraries have), skip it under a trace with "
            "`if not torch.compiler.is_compiling():`; for a real choice on values use "
            "torch.where or torch.cond (a tracer that ran on the example's values would freeze "
            f"its path for every input). The tracers said: {errors}"
            + (f" (at {'; '.join(wheres)})" if len(wheres) > 1 else ""),
            target=target,
        )
    one_line = len(wheres) == 1 and len(failures) > 1  # the same line broke every tracer: once
    parts = []
    for name, e in failures:
        where = "" if one_line else _culprit(e)
        parts.append(f"{name}: {_first_line(e)}" + (f" (at {where})" if where else ""))
    return CaptureError(
        "tracing failed with "
        + "; ".join(parts)
        + (f" (at {wheres[0]})" if one_line else "")
        + ". "
        + _ANOTHER_TRACER,
        target=target,
    )
