"""Capture one call as a flat ATen graph with a recorded calling convention.

``trace_call(fn, args, kwargs)`` traces (tracers.py: torch.export by default, make_fx
for a training step) a flat function of tensors (flat_call.py):

    flat inputs  = lifted parameters and buffers of every nn.Module argument
                   (tied tensors, and tensors shared by two modules, collapsed by
                   identity), then the tensor leaves of the other arguments, then
                   the tensor constants the trace made (graph_attrs.py: their values
                   travel in the source half)
    flat outputs = the tensor leaves of fn's result (but those that are inputs),
                   then the gradients of the parameters that received one in a
                   captured ``.backward()``, then the new values of buffers the call
                   reassigned

Arguments and result are flattened with torch's pytree (pytree_io.py); their
non-tensor leaves are specialised (recorded as constants and checked at call time).
Plain references to a lifted tensor (a module's cache object holding its buffers)
are re-pointed at the input during the trace (aliases.py). Buffers mutated in place stay in the graph as
in-place ops on inputs. This is the programming model of torch.compiler.precompile
(torch/_precompile.py): specialised shapes and control flow, no weights in the pair.
Dimensions marked with ``torch._dynamo.mark_dynamic`` stay symbolic instead
(dynamic_dims.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from precompile_runtime.pair_format import Ambient, CallConvention, Device, TensorSpec

from ..errors import CaptureError, warn_at_caller
from ..templates.module_settings import (
    module_setting_items,
    module_settings,
    submodules,
)
from . import (
    assumed_state,
    collectives,
    custom_ops,
    dtensors,
    dynamic_dims,
    dynamo_collect,
    dynamo_guards,
    grad_modes,
    graph_attrs,
    pytree_io,
    sharing,
    tracers,
    unbacked,
)
from .flat_call import FlatCall, flat_function, flatten_call
from .layouts import example_clone  # noqa: F401  (re-exported for the engines)
from .rng_state import python_rng_states


@dataclass
class TracedCall:
    """What the engines need: the graph, example inputs and the calling convention."""

    graph_module: Any  # torch.fx.GraphModule over flat tensors
    example_inputs: list  # flat tensors: the caller's where the graph only reads them, else clones
    # (sharing.py); run the graph on sharing.run_inputs(example_inputs, written) to keep them
    metadata: CallConvention  # the engine adds `engine` and `kernels` (codegen.pair_metadata)
    symbolic: Any = None  # dynamic_dims.SymbolicTrace when dims are marked dynamic
    sources: Any = None  # the caller's own flat tensors (params, then arguments), not clones
    outline: tuple = (
        "",
        "",
    )  # the result's structure (pytree_io.outline), for the eager-call check
    tensor_labels: list = field(default_factory=list)  # param_names as messages say them

    def finish_dynamic(self, target: str) -> None:
        """Record the marked dims' symbols, ranges and guards in the metadata; call it
        once nothing more will be compiled from the graph (the compiler adds guards)."""
        if self.symbolic is None:
            return
        dynamic, shapes = dynamic_dims.finish(self.symbolic, target)
        self.metadata["dynamic"] = dynamic
        for spec, sym in zip(self.metadata["tensor_inputs"], shapes):
            spec["shape"], spec["stride"] = sym["shape"], sym["stride"]


def _tensor_spec(t, requires_grad: bool) -> TensorSpec:
    return {
        "dtype": str(t.dtype),
        "device_type": t.device.type,
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "requires_grad": bool(requires_grad),
    }


def trace_call(
    fn: Callable,
    args: tuple,
    kwargs: dict,
    *,
    target: str,
    tracer: str | None = None,
    guards: str = "dynamo",
) -> TracedCall:
    """Trace ``fn(*args, **kwargs)`` into a flat ATen graph.

    Args:
        fn: the function to capture; nn.Module arguments are lifted.
        args, kwargs: the real example call.
        target: the target name, for messages.
        tracer: ``"auto"`` (default; also from ``PRECOMPILE_TRACER``), ``"export"``,
            ``"export-strict"`` or ``"make_fx"``: see tracers.py.
        guards: ``"dynamo"`` (default): the Python state the call read is checked by the
            guards TorchDynamo builds for it (dynamo_guards.py), and the capture refuses
            what they cannot check; ``"recorded"``: only by assumed_state.py's recording.
    Returns:
        a :class:`TracedCall`. The real arguments (models included) are left
        untouched: the trace reads the caller's tensors (non-strict export traces
        fakes of them; make_fx runs on clones), and the example inputs are clones of
        the tensors the graph may write (sharing.written_inputs), the caller's own
        tensors otherwise.
    Raises:
        CaptureError: unsupported argument/result types, closed-over tensors or
            script objects read by the graph (graph_attrs.py), a failure inside the trace,
            or (``guards="dynamo"``) a call Dynamo cannot trace in one graph or a guard no
            check of a pair can run (dynamo_guards.py).
    """
    try:
        tracer = tracers.check_tracer(tracer)
    except ValueError as e:
        raise CaptureError(str(e), target=target) from None
    call = flatten_call(fn, args, kwargs, target)
    out_box: dict = {}
    flat_fn = flat_function(fn, call, out_box, target)
    # the caller's tensors where the trace may read them as they are; after the trace,
    # copies of those the graph may write (the real call runs next and writes them)
    example = sharing.example_inputs(call.params + call.user_tensors)
    marks = [dynamic_dims.marked_dims(t) for t in call.user_tensors]
    if any(dynamic_dims.marked_dims(p) for p in call.params):
        warn_at_caller(
            "a parameter/buffer is marked dynamic; parameters keep their captured sizes, "
            "the mark is ignored",
            target=target,
        )
    checked, refused = None, None  # the guards Dynamo builds for the call, before the trace runs it
    if guards == "dynamo" and not call.lifted and not dynamo_collect.in_process_group():
        try:
            checked = dynamo_guards.guard_checks(fn, args, kwargs, target=target)
        except CaptureError as e:  # raised once the trace passed: a tracer's refusal says more
            refused = e
    hooks = assumed_state.hooks_record(call.modules)  # what the call runs, before it runs
    globals_before = assumed_state.global_values(fn, args, kwargs)
    reads = assumed_state.Recorder(call.modules)  # the plain values the trace reads
    traced = _trace(flat_fn, example, call, marks, target, tracer, out_box, reads)
    if refused is not None:
        if not out_box.get("grad_indices"):
            raise refused
        # a training step whose forward broke Dynamo's graph first (a library's logging
        # call): Dynamo's one graph would hold no backward anyway, as above
        dynamo_guards.warn_recorder_only_for_backward(target)
    return _traced_call(
        fn,
        args,
        kwargs,
        target,
        call,
        traced,
        example,
        out_box,
        checked,
        (reads, hooks, globals_before),
    )


def _trace(flat_fn, example, call: FlatCall, marks, target, tracer, out_box: dict, reads):
    """tracers.trace of ``flat_fn`` on ``example`` (a library's data-dependent sizes
    from 0: unbacked.py); its CaptureError named for ``target``."""
    try:
        with unbacked.sizes_from_zero():  # a library's data-dependent sizes from 0 (unbacked.py)
            return tracers.trace(
                flat_fn,
                example,
                n_params=call.n_params,
                marks=marks,
                paths=call.paths,
                target=target,
                tracer=tracer,
                ran_backward=lambda: bool(out_box.get("grad_indices")),
                watching=reads.watching,
                sharded=bool(call.lifted),
            )
    except CaptureError as e:
        if e.target is not None:
            raise
        raise e.for_target(target) from None


def _traced_call(
    fn, args, kwargs, target, call: FlatCall, traced, example, out_box, checked, assumed
) -> TracedCall:
    """The :class:`TracedCall` of a finished trace: its checks of what the call
    changed and returned, then the calling convention the pair records. ``assumed``:
    assumed_state's ``(reads, hooks, globals_before)``."""
    gm, symbolic = traced.graph_module, traced.symbolic
    if out_box.get("changed"):
        raise CaptureError(out_box["changed"], target=target)
    labels = [
        p for p, k in zip(call.leaf_paths, call.in_kinds) if k[0] == "module"
    ]  # (m<i>.path -> model.path)
    tensor_labels = [_tensor_label(n, labels) for n in call.names]
    dtensors.refuse_backward(out_box["grad_indices"], call.lifted, tensor_labels, target)
    try:
        out_text, out_types = pytree_io.dump_spec(out_box["spec"], "the result")
    except CaptureError as e:
        raise e.for_target(target) from None
    sources = call.params + call.user_tensors
    example = sharing.own_written(example, sources, sharing.written_inputs(gm))
    constants = graph_attrs.check_graph_attrs(
        gm, target, roots=(fn, *call.modules), symbolic=symbolic
    )
    metadata = _call_convention(
        fn,
        args,
        kwargs,
        target,
        call,
        traced,
        example,
        out_box,
        (out_text, out_types),
        constants,
        assumed,
    )
    if checked is not None:  # less the values the function itself changed
        metadata["guards"] = dynamo_guards.kept_after(checked, fn, args, kwargs)
    return TracedCall(
        graph_module=gm,
        example_inputs=example + constants,
        metadata=metadata,
        symbolic=symbolic,
        sources=sources,
        tensor_labels=tensor_labels,
        outline=pytree_io.outline(
            out_box["spec"],
            [type(k[1]).__name__ if k[0] == "const" else "Tensor" for k in out_box["kinds"]],
        ),
    )


def _call_convention(
    fn,
    args,
    kwargs,
    target,
    call: FlatCall,
    traced,
    example,
    out_box,
    out_spec,
    constants,
    assumed,
) -> CallConvention:
    """The calling convention a pair records (the engine adds engine and kernels:
    codegen.pair_metadata). ``out_spec``: the result's spec text and types."""
    gm, modules, n_params = traced.graph_module, call.modules, call.n_params
    (out_text, out_types), (reads, hooks, globals_before) = out_spec, assumed
    sources = call.params + call.user_tensors
    # public attributes the trace changed (a counter in forward) are state, not settings
    state = [_changed(b, module_setting_items(m)) for b, m in zip(call.settings_before, modules)]
    return {
        "target": target,
        "inputs": {
            "spec": call.in_text,
            "leaves": call.in_kinds,
            "types": call.in_types,
            "num_args": len(args),
            "kwarg_names": list(kwargs),  # the driver's fast path: each argument a leaf
            "positional_leaves": not kwargs
            and all(isinstance(a, (torch.Tensor, torch.nn.Module)) for a in args),
        },
        "param_names": call.names,
        "params": [_tensor_spec(t, g) for t, g in zip(example, call.requires_grad)],
        "tensor_inputs": [
            _tensor_spec(t, u.requires_grad) for t, u in zip(example[n_params:], call.user_tensors)
        ],
        "outputs": {
            "spec": out_text,
            "leaves": out_box["kinds"],
            "types": out_types,
            "single_tensor": out_box["spec"].is_leaf() and out_box["kinds"] == [["tensor", 0]],
        },
        "num_user_outputs": out_box["num_user_outputs"],
        "grad_param_indices": out_box["grad_indices"],
        "device": _device_of(sources),
        "training": [[bool(s.training) for s in submodules(m)] for m in modules],
        "module_settings": [module_settings(m, s) for m, s in zip(modules, state)],
        "module_state": [sorted(s) for s in state],  # attributes the function changes
        "arg_names": call.arg_names,
        "mutated_inputs": _mutated_inputs(gm),
        "tracer": traced.tracer,
        "collectives": collectives.canonical_groups(
            gm, target, meshes=[d.mesh for d in call.lifted]
        ),
        "op_libraries": custom_ops.op_libraries(gm),  # custom ops' modules, imported at load
        "dtensors": [d.record() for d in call.lifted],  # mesh and placements per sharded parameter
        "constants": graph_attrs.constant_specs(constants),  # trace-made: passed after the inputs
        "reassigned_buffers": out_box["reassigned"],  # outputs after the gradients
        "ambient": _ambient_state(_device_of(sources), gm, out_box),
        "assumed": assumed_state.metadata(reads, hooks, globals_before, fn, args, kwargs),
    }


def run_real_call(traced: TracedCall, real_call: Callable[[], Any]) -> dict:
    """Run the user's real call (``real_call()``, once, after the trace took its clones)
    and collect its results in the graph's flat order, for the engines' eager-call check.

    Args:
        traced: the trace of this call (its ``sources`` are the caller's own tensors).
        real_call: runs ``fn(*args, **kwargs)`` for real and returns its result.
    Returns:
        ``{"result": what the call returned, "outputs": [tensor outputs (detached),
        then per captured parameter gradient what the call added to ``.grad``, or
        None], "inputs": {flat index: the caller's tensor (to judge those written)},
        "structure": None when the call returned what the trace returned (same
        outline, :func:`pytree_io.outline`), else a sentence saying both, "python_rng":
        bool (the call drew from Python's or numpy's RNG)}``.
    Raises:
        whatever the call raises.
    """
    sources = traced.sources or []
    grad_at = traced.metadata["grad_param_indices"]
    before = {
        i: (sources[i].grad.detach().clone() if sources[i].grad is not None else None)
        for i in grad_at
        if i < len(sources)
    }
    rng_before = python_rng_states()
    result = real_call()
    python_rng = python_rng_states() != rng_before  # drew a value the trace drew another of
    try:
        leaves, spec = pytree_io.flatten_result(result)
        got = pytree_io.outline(spec, pytree_io.leaf_types(leaves))
    except CaptureError:
        leaves, got = [], ("", f"a {type(result).__name__}, which a capture cannot return")
    want = traced.outline
    structure = (
        None
        if got[0] == want[0]
        else f"the eager call returned {pytree_io.short(got[1])} where "
        f"the traced graph returns {pytree_io.short(want[1])}"
    )
    kinds = traced.metadata["outputs"]["leaves"]
    outs = [v for v, k in zip(leaves, kinds) if k[0] == "tensor"] if structure is None else []
    grads = []
    for i in grad_at:
        g = sources[i].grad if i < len(sources) else None
        grads.append(
            None if g is None else (g - before[i] if before.get(i) is not None else g).detach()
        )
    inputs = {i: t.detach() for i, t in enumerate(sources)}  # references: those written are judged
    return {
        "result": result,
        "outputs": [o.detach() for o in outs] + grads,
        "inputs": inputs,
        "structure": structure,
        "python_rng": python_rng,
    }


def _mutated_inputs(gm) -> list[int]:
    """Positions of the flat inputs the graph writes to (buffers, in-place arguments)."""
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            for arg, a in zip(n.target._schema.arguments, n.args):
                if arg.alias_info is not None and arg.alias_info.is_write and a in inputs:
                    written.add(inputs.index(a))
    return sorted(written)


def _ambient_state(device: str, gm, body: dict) -> Ambient:
    """The caller's state at capture that changes what eager computes and is built
    into the graph: autocast of the capture's device type (its dtype, absent when
    off), and the default dtype where the graph creates a tensor without a dtype
    (``torch.zeros(n)``: eager follows ``torch.set_default_dtype``, as Dynamo's
    global-state guard does), grad mode and deterministic algorithms (``body``: what
    :func:`grad_modes.watch_body` saw the function's body do; grad_modes.py). The driver
    compares them on every call."""
    autocast = {}
    if torch.is_autocast_enabled(device):
        autocast[device] = str(torch.get_autocast_dtype(device))
    out: Ambient = {"autocast": autocast}
    if _uses_default_dtype(gm):
        out["default_dtype"] = str(torch.get_default_dtype())
    grad_off, deterministic = grad_modes.modes(body)
    if grad_off:
        out["grad_off"] = True
    if deterministic:
        out["deterministic"] = True
    return out


def _uses_default_dtype(gm) -> bool:
    """A factory op of the graph (no tensor argument) was called without a dtype."""
    for n in gm.graph.nodes:
        if n.op != "call_function" or not isinstance(n.target, torch._ops.OpOverload):
            continue
        args = n.target._schema.arguments
        if (
            any(a.name == "dtype" for a in args)
            and n.kwargs.get("dtype") is None
            and not any(isinstance(a.type, torch.TensorType) for a in args)
        ):
            return True
    return False


def _changed(before: list, after: list) -> set[str]:
    """``"path:attribute"`` of each setting that differs between two
    :func:`module_setting_items` readings of one module (or is new, or gone)."""
    old = {(p, k): t for p, _, attrs in before for k, t in attrs.items()}
    new = {(p, k): t for p, _, attrs in after for k, t in attrs.items()}
    return {f"{p}:{k}" for p, k in old.keys() | new.keys() if old.get((p, k)) != new.get((p, k))}


def _tensor_label(name: str, labels: list[str]) -> str:
    """How a message names the lifted tensor ``m<i>.<path>``: under the argument module
    ``i`` was passed as (``model.fc.weight``), as a served call's messages do."""
    head, _, rest = name.partition(".")
    i = int(head[1:]) if head[:1] == "m" and head[1:].isdigit() else -1
    if not 0 <= i < len(labels):
        return name
    whole = re.fullmatch(r"argument '([^']+)'", labels[i])  # (pytree_io.arg_paths' text)
    return f"{whole.group(1)}.{rest}" if whole else f"{rest} of {labels[i]}"


def _device_of(tensors) -> Device:
    types = {t.device.type for t in tensors}
    if "cuda" in types:
        return "cuda"
    return "cpu"
