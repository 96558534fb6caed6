"""Sizes the data decides: the unbacked symbols of a trace.

``x[x > 0]``, ``nonzero``, ``masked_select``, ``torch.unique``, ``torchvision.ops.nms``
and a size read with ``.item()`` give tensors whose sizes depend on the values, not
on the input shapes. torch.export traces them with *unbacked* symbols (``u0``: a size
known only when the kernel before it has run); Inductor compiles them, as under
torch.compile, into a wrapper that reads each such size at run time.

Inductor must compile such a graph in the fake mode that made its symbols:
``standalone_compile(dynamic_shapes="from_example_inputs")`` re-traces it in a new
``ShapeEnv``, where the graph's ``unbacked_bindings`` (``u0`` of the trace's
ShapeEnv) name symbols that do not exist, and the rebinding
(``symbolic_shapes.rebind_unbacked`` -> ``_set_replacement``) fails with
``AttributeError: 'NoneType' object has no attribute 'lower'``. torch.compile
never meets it: its backend compiles in Dynamo's own fake mode. :func:`compile_inputs`
gives the trace's fake inputs for ``dynamic_shapes="from_graph"``, as dynamic dims do
(dynamic_dims.py), and :func:`show_fake_mode` the mode. Sizes are not compiled
size-oblivious here (dynamic dims' ``backed_size_oblivious``): a ``[:n]`` slice's size
is then an expression (``Min(50, u4 + u5 + u6)``) where the trace bound a symbol,
which the rebinding refuses (``should have been constant``).

A library's fake implementation that declares a size with torch's deprecated
``ctx.create_unbacked_symint()`` (torchvision's ``nms``) gets a range from 2, the
default of torch.compile's old way to avoid specialising sizes 0 and 1; the compiled
code then asserts ``u0 >= 2`` and a call that keeps one box or none raises
``RuntimeError: u0 >= 2``, under torch.compile too. :func:`sizes_from_zero` gives
such sizes the range of ``new_dynamic_size`` (from 0) while a capture traces and
compiles, so they serve as eager does. A bound the library passes is kept.

torch.export writes ``x[:n]`` as ``aten.slice(x, 0, None, n)``; with ``n`` unbacked,
Inductor on torch 2.11 lowers it to a dynamic slice whose codegen clamps the start and
fails on None (``ValueError: The argument 'None' is not comparable``), where Dynamo's
graphs give the start as 0. :func:`explicit_slice_bounds` writes the defaults out
(start 0, end ``sys.maxsize``, step 1: what aten reads None as), which changes no result.

A pair records (:func:`record`) the symbols and which outputs have a size they
decide: a served call returns tensors of the sizes this call's values give, and CUDA
graphs, whose replays have the recorded sizes, are refused for it (driver.py).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from precompile_runtime.pair_format import DataDependent


def _graphs(graph_module) -> list:
    return [m for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule)]


def symbols(graph_module) -> list[str]:
    """The unbacked symbols the graph (or a subgraph of it) binds: ``["u0", "u1"]``
    (sorted by number), empty for a graph whose sizes follow from its input shapes."""
    found: set[str] = set()
    for gm in _graphs(graph_module):
        for node in gm.graph.nodes:
            for sym in node.meta.get("unbacked_bindings") or {}:
                found.add(str(sym))
    return sorted(found, key=lambda s: (len(s), s))


def compile_inputs(graph_module) -> list:
    """The graph's fake inputs, in the trace's fake mode (its placeholders' ``val``):
    what ``standalone_compile(..., dynamic_shapes="from_graph")`` compiles a graph
    with unbacked symbols for."""
    return [n.meta["val"] for n in graph_module.graph.nodes if n.op == "placeholder"]


@contextlib.contextmanager
def sizes_from_zero():
    """Inside: ``ctx.create_unbacked_symint()`` in a fake implementation makes a size
    from 0 (``new_dynamic_size``'s default) instead of its deprecated default 2."""
    from torch._library import fake_impl

    ctx = getattr(fake_impl, "FakeImplCtx", None)
    orig = ctx.__dict__.get("create_unbacked_symint") if ctx is not None else None
    if ctx is None or orig is None or not hasattr(ctx, "new_dynamic_size"):
        yield
        return

    def create_unbacked_symint(self, *, min=0, max=None):
        return self.new_dynamic_size(min=min, max=max)

    ctx.create_unbacked_symint = create_unbacked_symint
    try:
        yield
    finally:
        ctx.create_unbacked_symint = orig


def explicit_slice_bounds(graph_module) -> int:
    """Give every ``aten.slice.Tensor`` of the graph (and its subgraphs) the start, end and
    step that aten reads a None as (0, ``sys.maxsize``, 1), in place.

    Returns: the number of slices changed (the graph is recompiled when it is not 0).
    """
    slice_op = torch.ops.aten.slice.Tensor
    defaults = {2: 0, 3: sys.maxsize, 4: 1}  # (self, dim, start, end, step)
    changed = 0
    for gm in _graphs(graph_module):
        touched = False
        for node in gm.graph.nodes:
            if node.op != "call_function" or node.target is not slice_op:
                continue
            args = list(node.args) + [None] * (5 - len(node.args))
            for i, name in ((2, "start"), (3, "end"), (4, "step")):
                if name in node.kwargs:
                    args[i] = node.kwargs[name]
            if len(node.args) == 1:
                args[1] = node.kwargs.get("dim", 0)
            if all(args[i] is not None for i in defaults) and not node.kwargs:
                continue
            node.args = tuple(
                defaults[i] if i in defaults and args[i] is None else args[i] for i in range(5)
            )
            node.kwargs = {}
            touched = True
            changed += 1
        if touched:
            gm.recompile()
    return changed


def show_fake_mode(graph_module) -> None:
    """Put each output's ``val`` in its ``example_value`` too:
    ``standalone_compile(dynamic_shapes="from_graph")`` finds the graph's fake mode on
    the output nodes' ``example_value`` (Dynamo's key); torch.export and make_fx write
    ``val``. Without it, it compiles in a new fake mode (with a new ShapeEnv)."""
    output = [n for n in graph_module.graph.nodes if n.op == "output"][-1]
    for node in output.args[0]:
        if isinstance(node, torch.fx.Node) and "val" in node.meta:
            node.meta["example_value"] = node.meta["val"]


def _size_text(size) -> Any:
    if isinstance(size, torch.SymInt):
        return str(size.node.expr)
    return int(size)


def record(graph_module, num_user_outputs: int) -> DataDependent | None:
    """What the pair records of a graph with unbacked symbols, None for one without.

    Returns:
        ``{"symbols": ["u0", ...], "outputs": {k: [size, ...]}}``: per user output
        ``k`` (graph output order) whose shape holds an unbacked symbol, its traced
        shape, each size an int or the symbol's expression (``"u0"``, ``"4*u1"``).
        A graph whose outputs all have fixed sizes still records its symbols: its
        kernels read sizes from the values (CUDA graphs cannot replay that).
    """
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    names = symbols(graph_module)
    if not names:
        return None
    output = next(n for n in reversed(graph_module.graph.nodes) if n.op == "output")
    outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    shapes: dict[str, list] = {}
    for k, node in enumerate(outs[:num_user_outputs]):
        val = node.meta.get("val") if hasattr(node, "meta") else None
        if val is not None and hasattr(val, "shape") and free_unbacked_symbols(val.shape):
            shapes[str(k)] = [_size_text(s) for s in val.shape]
    return {"symbols": names, "outputs": shapes}
