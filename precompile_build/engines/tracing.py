"""Capture one call as a flat ATen graph with a recorded calling convention.

``trace_call(fn, args, kwargs)`` traces (tracers.py: torch.export by default, make_fx
for a training step) a flat function of tensors:

    flat inputs  = lifted parameters and buffers of every nn.Module argument
                   (tied tensors collapsed by identity), then the tensor leaves of
                   the other arguments, then the tensor constants the trace made
                   (graph_attrs.py: their values travel in the source half)
    flat outputs = the tensor leaves of fn's result, then the gradients of the
                   parameters that received one in a captured ``.backward()``,
                   then the new values of buffers the call reassigned

Non-tensor leaves of the arguments and of the result are specialised (recorded as
constants and checked at call time). Buffers mutated in place stay in the graph as
in-place ops on inputs. This is the programming model of torch.compiler.precompile
(torch/_precompile.py): specialised shapes and control flow, no weights in the pair.
Dimensions marked with ``torch._dynamo.mark_dynamic`` stay symbolic instead
(dynamic_dims.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import CaptureError, warn_at_caller
from . import collectives, dynamic_dims, graph_attrs, sharing, tracers
from ._module_settings import module_setting_items, module_settings
from .layouts import example_clone  # noqa: F401  (re-exported for the engines)

_LITERALS = (int, float, bool, str, type(None))


@dataclass
class TracedCall:
    """What the engines need: the graph, example inputs and the calling convention."""

    graph_module: Any  # torch.fx.GraphModule over flat tensors
    example_inputs: list  # flat tensors: the caller's where the graph only reads them, else clones
    # (sharing.py); run the graph on sharing.run_inputs(example_inputs, written) to keep them
    metadata: dict  # literal calling convention, see _driver.py
    symbolic: Any = None  # dynamic_dims.SymbolicTrace when dims are marked dynamic
    sources: Any = None  # the caller's own flat tensors (params, then arguments), not clones

    def finish_dynamic(self, target: str) -> None:
        """Record the marked dims' symbols, ranges and guards in the metadata; call it
        once nothing more will be compiled from the graph (the compiler adds guards)."""
        if self.symbolic is None:
            return
        dynamic, shapes = dynamic_dims.finish(self.symbolic, target)
        self.metadata["dynamic"] = dynamic
        for spec, sym in zip(self.metadata["tensor_inputs"], shapes):
            spec.update(sym)


def _tensor_spec(t, requires_grad: bool) -> dict:
    return {
        "dtype": str(t.dtype),
        "device_type": t.device.type,
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "requires_grad": bool(requires_grad),
    }


def _input_spec(value, modules: list, tensors: list, path: str):
    import torch

    if isinstance(value, torch.nn.Module):
        modules.append(value)
        return ("module", len(modules) - 1)
    if isinstance(value, torch.Tensor):
        tensors.append((value, path))
        return ("tensor", len(tensors) - 1)
    if isinstance(value, _LITERALS):
        return ("const", value)
    if isinstance(value, (tuple, list)) and not hasattr(value, "_fields"):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return (kind, [_input_spec(v, modules, tensors, f"{path}[{i}]") for i, v in enumerate(value)])
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return ("dict", [(k, _input_spec(v, modules, tensors, f"{path}[{k!r}]")) for k, v in value.items()])
    raise CaptureError(
        f"argument {path} is a {type(value).__name__}; the capture accepts tensors, "
        "nn.Modules, int/float/bool/str/None and tuples, lists and str-keyed dicts of "
        "them: pass the tensors it holds instead"
    )


def _qualname(tp) -> str:
    return f"{tp.__module__}:{tp.__qualname__}"


def spec_outline(spec) -> str:
    """The text of an output spec (:func:`_output_spec`) without its constants'
    values: ``(Tensor, [Tensor, int])``, ``(Tensor,)``, ``Out(logits=Tensor,
    loss=NoneType)``. Two calls returning the same structure have the same outline even
    when a returned Python number (a counter) differs; compare outlines whole (a long
    one is shortened only for a message, :func:`_short`)."""

    def walk(sp):
        kind = sp[0]
        if kind == "tensor":
            return "Tensor"
        if kind == "const":
            return type(sp[1]).__name__
        if kind in ("tuple", "list"):
            inner = ", ".join(map(walk, sp[1]))
            return (f"({inner},)" if len(sp[1]) == 1 else f"({inner})") if kind == "tuple" else f"[{inner}]"
        if kind == "dict":
            return "{" + ", ".join(f"{k!r}: {walk(v)}" for k, v in sp[1]) + "}"
        name = sp[1].rsplit(".", 1)[-1].rsplit(":", 1)[-1]
        if kind == "namedtuple":
            return f"{name}(" + ", ".join(map(walk, sp[2])) + ")"
        return f"{name}(" + ", ".join(f"{f}={walk(v)}" for f, v in sp[2]) + ")"  # dataclass

    return walk(spec)


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _output_spec(value, outs: list, path: str):
    import torch

    if isinstance(value, torch.Tensor):
        outs.append(value)
        return ("tensor", len(outs) - 1)
    if isinstance(value, _LITERALS):
        return ("const", value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return ("namedtuple", _qualname(type(value)),
                [_output_spec(v, outs, f"{path}.{f}") for f, v in zip(value._fields, value)])
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return ("dataclass", _qualname(type(value)),
                [(f.name, _output_spec(getattr(value, f.name), outs, f"{path}.{f.name}"))
                 for f in dataclasses.fields(value) if f.init])
    if isinstance(value, (tuple, list)):
        kind = "tuple" if isinstance(value, tuple) else "list"
        return (kind, [_output_spec(v, outs, f"{path}[{i}]") for i, v in enumerate(value)])
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return ("dict", [(k, _output_spec(v, outs, f"{path}[{k!r}]")) for k, v in value.items()])
    what = "the result" if path == "result" else f"the result's part {path}"
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise CaptureError(
            f"{what} is a Python number computed while tracing ({type(value).__name__}: from "
            ".item(), float()/int() of a tensor, or a dynamic size): a Python number from "
            ".item() cannot be a result of a captured function; return the tensor instead "
            "(e.g. `loss`, not `loss.item()`)"
        )
    hint = ("; it is a model's key/value cache: pass use_cache=False, or return the tensors "
            "you need" if type(value).__name__.endswith("Cache") else "")
    raise CaptureError(
        f"{what} is a {type(value).__name__}; return tensors, constants, "
        f"tuples, lists, str-keyed dicts, named tuples or dataclasses of them{hint}"
    )


def _lift(modules) -> tuple[list[str], list]:
    """Parameters then buffers of each module, tied tensors collapsed (the order the
    driver re-derives at call time)."""
    seen, names, tensors = set(), [], []
    for i, mod in enumerate(modules):
        for kind in (mod.named_parameters, mod.named_buffers):
            for name, t in kind(remove_duplicate=False):
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                names.append(f"m{i}.{name}")
                tensors.append(t)
    return names, tensors


def _reparametrize(modules, names, tensors):
    """One context that swaps every module's parameters/buffers for ``tensors`` (nested
    ``with`` blocks, no ExitStack: TorchDynamo, the strict tracer, follows these)."""
    import contextlib

    from torch.nn.utils import stateless

    per_module: list[dict] = [{} for _ in modules]
    for name, t in zip(names, tensors):
        i, _, local = name.partition(".")
        per_module[int(i[1:])][local] = t

    @contextlib.contextmanager
    def nested(i):
        if i == len(modules):
            yield
            return
        # tie_weights: a tied tensor is one input, seen under every name it has
        with stateless._reparametrize_module(modules[i], per_module[i], tie_weights=True), nested(i + 1):
            yield

    return nested(0)


def trace_call(fn: Callable, args: tuple, kwargs: dict, *, target: str, tracer: str | None = None) -> TracedCall:
    """Trace ``fn(*args, **kwargs)`` into a flat ATen graph.

    Args:
        fn: the function to capture; nn.Module arguments are lifted.
        args, kwargs: the real example call.
        target: the target name, for messages.
        tracer: ``"auto"`` (default; also from ``PRECOMPILE_TRACER``), ``"export"``,
            ``"export-strict"`` or ``"make_fx"``: see tracers.py.
    Returns:
        a :class:`TracedCall`. The real arguments (models included) are left
        untouched: the trace reads the caller's tensors (non-strict export traces
        fakes of them; make_fx runs on clones), and the example inputs are clones of
        the tensors the graph may write (sharing.written_inputs), the caller's own
        tensors otherwise.
    Raises:
        CaptureError: unsupported argument/result types, closed-over tensors or
            script objects read by the graph (graph_attrs.py), or a failure inside the trace.
    """
    import torch

    try:
        tracer = tracers.check_tracer(tracer)
    except ValueError as e:
        raise CaptureError(f"target {target!r}: {e}") from None
    modules: list = []
    user_tensors: list = []
    arg_names = _arg_names(fn, len(args))
    try:
        in_spec = ("list", [
            ("list", [_input_spec(a, modules, user_tensors, f"argument {arg_names[i]!r}" if arg_names else f"args[{i}]")
                      for i, a in enumerate(args)]),
            ("dict", [(k, _input_spec(v, modules, user_tensors, f"keyword argument {k!r}")) for k, v in kwargs.items()]),
        ])
    except CaptureError as e:
        raise CaptureError(f"target {target!r}: {e}") from None
    user_tensors, paths = [t for t, _ in user_tensors], [p for _, p in user_tensors]
    collectives.refuse_data_parallel(fn, modules, target)
    names, params = _lift(modules)
    settings_before = [module_setting_items(m) for m in modules]  # as the trace sees them
    wants_grad = [isinstance(p, torch.nn.Parameter) and p.requires_grad for p in params]
    n_params = len(params)
    out_box: dict = {}

    def rebuild_args(flat_user):
        it = iter(flat_user)
        mods = iter(modules)

        def build(spec):
            kind = spec[0]
            if kind == "module":
                return next(mods)
            if kind == "tensor":
                return next(it)
            if kind == "const":
                return spec[1]
            if kind in ("tuple", "list"):
                items = [build(s) for s in spec[1]]
                return tuple(items) if kind == "tuple" else items
            return {k: build(s) for k, s in spec[1]}

        a, kw = build(in_spec)
        return a, kw

    def flat_fn(*flat):
        if torch.compiler.is_dynamo_compiling():
            # export-strict: Dynamo (torch 2.11) refuses requires_grad_(); its graphs are
            # forward-only (a backward inside fails there), so the inputs serve as leaves
            leaves = list(flat[:n_params])
        else:
            leaves = [t.detach().requires_grad_(True) if g else t for t, g in zip(flat[:n_params], wants_grad)]
        call_args, call_kwargs = rebuild_args(flat[n_params:])
        with _reparametrize(modules, names, leaves):
            result = fn(*call_args, **call_kwargs)
            reassigned = graph_attrs.reassigned_buffers(modules, names, leaves, target)
        out_box["reassigned"] = [i for i, _ in reassigned]
        outs: list = []
        out_box["spec"] = _output_spec(result, outs, "result")
        # A returned view would alias an input or an intermediate buffer of the
        # compiled graph; return a fresh tensor so every output owns its storage.
        outs = [o.detach().clone() if o._base is not None else o.detach() for o in outs]
        grads, grad_indices = [], []
        for i, (leaf, g) in enumerate(zip(leaves, wants_grad)):
            if g and leaf.grad is not None:
                grads.append(leaf.grad)
                grad_indices.append(i)
        out_box["grad_indices"] = grad_indices
        out_box["num_user_outputs"] = len(outs)
        return (*outs, *grads, *(new.detach().clone() if new._base is not None else new.detach() for _, new in reassigned))

    # the caller's tensors where the trace may read them as they are; after the trace,
    # copies of those the graph may write (the real call runs next and writes them)
    example = sharing.example_inputs(params + user_tensors)
    marks = [dynamic_dims.marked_dims(t) for t in user_tensors]
    if any(dynamic_dims.marked_dims(p) for p in params):
        warn_at_caller(f"target {target!r}: a parameter/buffer is marked dynamic; parameters keep "
                       "their captured sizes, the mark is ignored")
    try:
        traced = tracers.trace(flat_fn, example, n_params=n_params, marks=marks, paths=paths, target=target,
                               tracer=tracer,
                               ran_backward=lambda: bool(out_box.get("grad_indices")))
    except CaptureError as e:
        if str(e).startswith("target "):
            raise
        raise CaptureError(f"target {target!r}: {e}") from None
    gm, symbolic = traced.graph_module, traced.symbolic
    example = sharing.own_written(example, params + user_tensors, sharing.written_inputs(gm))
    constants = graph_attrs.check_graph_attrs(gm, target, roots=(fn, *modules), symbolic=symbolic)

    # public attributes the trace changed (a counter in forward) are state, not settings
    state = [_changed(b, module_setting_items(m)) for b, m in zip(settings_before, modules)]
    metadata = {
        "target": target,
        "inputs": in_spec,
        "param_names": names,
        "params": [_tensor_spec(t, p.requires_grad) for t, p in zip(example, params)],
        "tensor_inputs": [_tensor_spec(t, u.requires_grad) for t, u in zip(example[n_params:], user_tensors)],
        "outputs": out_box["spec"],
        "num_user_outputs": out_box["num_user_outputs"],
        "grad_param_indices": out_box["grad_indices"],
        "device": _device_of(params + user_tensors),
        "training": [_training_flags(m) for m in modules],
        "module_settings": [module_settings(m, s) for m, s in zip(modules, state)],
        "module_state": [sorted(s) for s in state],  # attributes the function changes
        "arg_names": arg_names,
        "mutated_inputs": _mutated_inputs(gm),
        "tracer": traced.tracer,
        "collectives": collectives.canonical_groups(gm, target),  # groups by ranks, world size
        "constants": graph_attrs.constant_specs(constants),  # trace-made: passed after the inputs
        "reassigned_buffers": out_box["reassigned"],  # outputs after the gradients
        "ambient": _ambient_state(_device_of(params + user_tensors)),
    }
    return TracedCall(graph_module=gm, example_inputs=example + constants, metadata=metadata, symbolic=symbolic,
                      sources=params + user_tensors)


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
        outline, :func:`spec_outline`), else a sentence saying both, "python_rng":
        bool (the call drew from Python's or numpy's RNG)}``.
    Raises:
        whatever the call raises.
    """
    from ..rng_state import python_rng_states

    sources = traced.sources or []
    grad_at = traced.metadata["grad_param_indices"]
    before = {i: (sources[i].grad.detach().clone() if sources[i].grad is not None else None)
              for i in grad_at if i < len(sources)}
    rng_before = python_rng_states()
    result = real_call()
    python_rng = python_rng_states() != rng_before  # drew a value the trace drew another of
    outs: list = []
    try:
        got = spec_outline(_output_spec(result, outs, "result"))
    except CaptureError:
        outs, got = [], f"a {type(result).__name__}, which a capture cannot return"
    want = spec_outline(traced.metadata["outputs"])
    structure = (None if got == want else
                 f"the eager call returned {_short(got)} where the traced graph returns {_short(want)}")
    grads = []
    for i in grad_at:
        g = sources[i].grad if i < len(sources) else None
        grads.append(None if g is None else (g - before[i] if before.get(i) is not None else g).detach())
    inputs = {i: t.detach() for i, t in enumerate(sources)}  # references: those written are judged
    if structure is not None:
        outs = []  # no value to compare with the trace's
    return {"result": result, "outputs": [o.detach() for o in outs] + grads, "inputs": inputs,
            "structure": structure, "python_rng": python_rng}


def _mutated_inputs(gm) -> list[int]:
    """Positions of the flat inputs the graph writes to (buffers, in-place arguments)."""
    import torch

    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = set()
    for n in gm.graph.nodes:
        if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload):
            for arg, a in zip(n.target._schema.arguments, n.args):
                if arg.alias_info is not None and arg.alias_info.is_write and a in inputs:
                    written.add(inputs.index(a))
    return sorted(written)


def _ambient_state(device: str) -> dict:
    """The caller's state at capture that changes what eager computes and is built
    into the graph: autocast of the capture's device type (its dtype, absent when
    off). The driver compares it on every call."""
    import torch

    autocast = {}
    if torch.is_autocast_enabled(device):
        autocast[device] = str(torch.get_autocast_dtype(device))
    return {"autocast": autocast}


def _changed(before: list, after: list) -> set[str]:
    """``"path:attribute"`` of each setting that differs between two
    :func:`module_setting_items` readings of one module (or is new, or gone)."""
    old = {(p, k): t for p, _, attrs in before for k, t in attrs.items()}
    new = {(p, k): t for p, _, attrs in after for k, t in attrs.items()}
    return {f"{p}:{k}" for p, k in old.keys() | new.keys() if old.get((p, k)) != new.get((p, k))}


def _training_flags(module) -> list[bool]:
    """``.training`` of the module and every submodule, pre-order (as the driver walks
    them): dropout and batch norm trace differently in train and eval mode."""
    flags, stack = [], [module]
    while stack:
        m = stack.pop()
        flags.append(bool(m.training))
        stack.extend(c for c in reversed(list(m._modules.values())) if c is not None)
    return flags


def _arg_names(fn, n: int) -> list[str]:
    """Names of fn's first ``n`` positional parameters, for messages (may be empty)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names[:n] if len(names) >= n else []


def _device_of(tensors) -> str:
    types = {t.device.type for t in tensors}
    if "cuda" in types:
        return "cuda"
    return "cpu"
