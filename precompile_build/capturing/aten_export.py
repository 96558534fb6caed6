"""torch.export of a flat function to a functional ATen graph (the ``export`` tracers).

:func:`aten_program` exports the flat function (tracing.py) and returns the
``ExportedProgram`` that ``torch.export.export(strict=...)`` then
``run_decompositions({})`` makes: functional ATen ops, the functional
CompositeImplicitAutograd ops (``aten.linear``, ``scaled_dot_product_attention``)
kept whole, input mutations as outputs. It gets there in one trace where this torch
has the private one-pass entry point (:func:`_one_pass_export`), in the two public
passes elsewhere. :func:`flat_graph` turns the program back into a flat graph over
the flat inputs (the form tracers.py hands on).

Neither records the Python stack of each node (``node.meta["stack_trace"]``): no
step after the trace reads it, and FX takes and formats a traceback for every node
(bench/results/trace_speed_cpu.md: the two passes with and without). Inductor's
lowering errors then name the ATen node without the user's line.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
import traceback
import warnings
from typing import Any, Callable

import torch

from ..errors import CaptureError


def aten_program(flat_fn: Callable, args: tuple, *, dynamic_shapes: Any, strict: bool):
    """``flat_fn(*args)`` exported as a functional ATen ``ExportedProgram``.

    Args:
        flat_fn: the flat function (tensors in, tuple of tensors out); it runs under
            the grad mode of this call (the user's), as under ``torch.export.export``.
        args: its example tensors (non-strict export traces fake copies of them).
        dynamic_shapes: ``torch.export`` dynamic shapes of ``args`` (a one-element
            tuple holding the tuple of per-argument specs), or None.
        strict: TorchDynamo reads the bytecode (``strict=True``) or not.
    Returns:
        an ``ExportedProgram`` of functional ATen ops; writes to inputs are outputs of
        kind ``USER_INPUT_MUTATION`` (:func:`flat_graph` turns them back into writes).
    Raises:
        whatever torch.export raises on the call: the two public passes' error where
        the one pass failed too, but for a backward inside the call, which fails in
        autograd's ``backward`` in the one pass (:func:`raised_in_backward`).
    """
    module = _flat_module(flat_fn, torch.is_grad_enabled())
    one_pass = _one_pass_export()
    with _no_stack_traces():
        if one_pass is not None:
            try:
                return one_pass(module, args, dynamic_shapes, strict)
            except Exception as e:
                if raised_in_backward(e):  # a training step: make_fx's (tracers.py), no retry
                    raise
            # where the one pass fails, the two public passes run (a failing call is
            # traced twice): a call they trace is served as before, and one they refuse
            # fails with their error, which docs/errors.md quotes (the one pass words
            # some otherwise: an in-place write to a closed-over tensor is "Constant
            # lifted_tensor_0 is mutated ..., register it as buffer" in torch.export's
            # first pass, AOTAutograd's "expected ... an entirely functional graph" there)
        ep = torch.export.export(module, args, dynamic_shapes=dynamic_shapes, strict=strict)
        return ep.run_decompositions({})


def raised_in_backward(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its cause chain) was raised inside autograd's
    backward (``Tensor.backward``, ``torch.autograd.backward`` or ``.grad``). The one
    pass keeps functional composite ops whole, which have no backward there, so a
    backward through one fails inside the trace instead of producing the parameter
    gradients by which tracers.py knows a training step."""
    autograd = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "autograd") + os.sep
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if any(
            os.path.abspath(f.filename).startswith(autograd) and f.name in ("backward", "grad")
            for f in traceback.extract_tb(e.__traceback__)
        ):
            return True
        e = e.__cause__ or e.__context__
    return False


def _flat_module(flat_fn: Callable, grad_enabled: bool):
    """``flat_fn`` as an nn.Module with no parameters (torch.export exports modules;
    the parameters are already flat inputs), run under ``grad_enabled``: the one-pass
    trace runs under ``no_grad``, where code reading ``torch.is_grad_enabled()`` (the
    fast path of ``nn.MultiheadAttention``) would take another path than the user's
    call, and a backward inside would not be seen as one."""

    class FlatCall(torch.nn.Module):
        def forward(self, *flat):
            with torch.set_grad_enabled(grad_enabled):
                return flat_fn(*flat)

    return FlatCall()


_ENTRY_POINTS = (  # (module, name): the one pass and the override of run_decompositions({})
    ("torch.export._trace", "_export"),
    ("torch.export.exported_program", "_override_composite_implicit_decomp"),
    ("torch.export.exported_program", "_split_decomp_table_to_cia_and_python_decomp"),
)


def _one_pass_export() -> Callable | None:
    """``one_pass(module, args, dynamic_shapes, strict) -> ExportedProgram`` where this
    torch has what it needs, else None (:func:`aten_program` then runs the two passes).

    ``torch.export.export`` traces to the pre-dispatch IR and ``run_decompositions({})``
    traces that program a second time, through AOTAutograd (``_export_to_aten_ir``),
    with the decomposition of every functional CompositeImplicitAutograd op overridden
    so that the op stays whole. ``torch.export._trace._export(pre_dispatch=False)``
    runs that same AOTAutograd trace on the module itself; under the same override
    its graph holds the same ops (checked by tests/test_aten_export.py and
    bench/trace_speed.py). Kept whole matters past Inductor: the fp64 reference
    (reference.py) runs the ``scaled_dot_product_attention`` of a bf16 trace, where
    the decomposed op would be the CUDA flash kernel, which has no fp64. These three
    names are private to torch.export, so each is looked up and its signature checked;
    any missing or changed one selects the public two passes.
    """
    try:
        _export, override, split = (
            getattr(importlib.import_module(m), name) for m, name in _ENTRY_POINTS
        )
        params = inspect.signature(_export).parameters
        needed = [
            p
            for p in inspect.signature(override).parameters.values()
            if p.default is inspect.Parameter.empty
        ]
        split_params = inspect.signature(split).parameters
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    if (
        not {"dynamic_shapes", "strict", "pre_dispatch"} <= params.keys()
        or len(needed) != 1
        or len(split_params) != 1
    ):
        return None

    def one_pass(module, args, dynamic_shapes, strict):
        kept_whole, _ = split({})  # what run_decompositions({}) keeps
        with override(kept_whole):
            return _export(
                module, args, dynamic_shapes=dynamic_shapes, strict=strict, pre_dispatch=False
            )

    return one_pass


@contextlib.contextmanager
def _no_stack_traces():
    """FX records no Python stack per node inside (``torch.fx.config``'s
    ``do_not_emit_stack_traces``, where this torch has it)."""
    import torch.fx.config as fx_config

    if not hasattr(fx_config, "do_not_emit_stack_traces"):
        yield
        return
    saved = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = saved


def flat_graph(ep, target: str):
    """The exported program's graph as a flat function of the flat inputs.

    Lifted constants (tensors the trace made, script objects) become attributes read
    with ``get_attr`` (as make_fx records them); each mutated input gets its new value
    copied back in place (``aten.copy_``, after the rest) instead of being returned;
    ``aten.detach`` nodes go, but for those the graph returns (in a forward-only graph
    they compute nothing; the one pass, traced under the user's grad mode, records
    autograd's own detaches of saved tensors too: 3-4 per op of a Llama layer).

    Args:
        ep: an ExportedProgram from :func:`aten_program`.
        target: the target name, for messages.
    Returns:
        a ``torch.fx.GraphModule`` (``ep``'s own, changed in place).
    Raises:
        CaptureError: the program lifts an input or returns an output of a kind a
            flat function has not (parameters, buffers, gradients).
    """
    from torch.export.graph_signature import InputKind, OutputKind

    gm, sig = ep.graph_module, ep.graph_signature
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    user_inputs = {}
    counts = {"tensor": 0, "obj": 0}
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind == InputKind.USER_INPUT:
            user_inputs[spec.arg.name] = node
            continue
        if spec.kind not in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            raise CaptureError(
                f"torch.export lifted an input of kind {spec.kind.name} "
                f"({spec.target}); use tracer='make_fx'",
                target=target,
            )
        kind = "tensor" if spec.kind == InputKind.CONSTANT_TENSOR else "obj"
        attr = (
            f"_tensor_constant{counts[kind]}"
            if kind == "tensor"
            else f"_torchbind_obj{counts[kind]}"
        )
        counts[kind] += 1
        setattr(gm, attr, ep.constants[spec.target])
        # a constant is a plain attribute, as torch.export's own unlifting leaves it; fx warns
        # that it is no parameter, buffer or submodule, which tells the user nothing to do
        with graph.inserting_before(node), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Attempted to insert a get_attr Node", UserWarning)
            new = graph.get_attr(attr)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    results = []
    for value, spec in zip(output.args[0], sig.output_specs):
        if spec.kind == OutputKind.USER_OUTPUT:
            results.append(value)
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            with graph.inserting_before(output):
                graph.call_function(torch.ops.aten.copy_.default, (user_inputs[spec.target], value))
        else:
            raise CaptureError(
                f"torch.export returned an output of kind {spec.kind.name}; use tracer='make_fx'",
                target=target,
            )
    output.args = (tuple(results),)
    for node in list(graph.nodes):  # a returned one stays: the result is not the input it read
        if node.target is torch.ops.aten.detach.default and output not in node.users:
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    graph.lint()
    gm.recompile()
    return gm
