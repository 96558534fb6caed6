"""What a traced graph reads or writes besides its inputs, and what the pair does with it.

A traced graph reads attributes (``get_attr`` nodes) of four kinds:

- **trace-made tensor constants** (make_fx names them ``_tensor_constantN``): tensors
  the function creates while it runs, e.g. ``x + torch.tensor(2.0)`` or the scalar of
  ``y[:, 0] = 1.0``. :func:`check_graph_attrs` lifts them to trailing inputs of the
  graph; their values travel in the source half (:func:`constant_specs`) and the
  driver passes them on every call, so both engines serve them;
- **subgraphs** (``true_graph_0``/``false_graph_0`` of ``torch.cond``, bodies of
  other control-flow operators): kept; codegen writes them out and Inductor lowers
  them;
- **closed-over user tensors**: a tensor that is an attribute of a user object, a
  global or a closure cell of the function, but not a registered parameter/buffer.
  Refused: its value would be frozen at capture time while the user's object stays
  mutable. Told apart from trace-made constants by identity with the tensors
  reachable from the function (:func:`reachable_tensors`); a constant the graph
  writes to in place is refused too (``torch.tensor(...)`` constants reach the
  graph through a copy, ``lift_fresh_copy``, so only a user's tensor is written);
- **script objects**: a c10d ProcessGroup (a ``torch.distributed`` collective such as
  ``dist.all_reduce(t)``), or another TorchScript class. Refused with what to use.

A buffer *reassigned* in forward (``self.steps = self.steps + 1``) is no graph
attribute: :func:`reassigned_buffers` finds it after the traced call, and the
capture returns its new value as an extra output that the driver copies into the
module's buffer, as eager does.
"""

from __future__ import annotations

import base64
import functools
import types
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils import _pytree

from precompile_runtime.pair_format import ConstantSpec

from ..errors import CaptureError
from . import sharing

_LIFT_FRESH = ("aten::lift_fresh_copy", "aten::lift_fresh")


def _attr(gm, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def memory_key(t: torch.Tensor) -> int | None:
    """A key for the memory ``t`` views (its storage's address, negated so that it
    cannot be taken for an ``id``), or None (no storage: a fake or meta tensor, or none
    allocated)."""
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return -ptr if ptr else None


def _own_state(fn: Any) -> set[int]:
    """The memory keys of the parameters and buffers of a module captured as the
    function itself (or a bound method's module): its state is the pair's, by design."""
    module = fn if isinstance(fn, torch.nn.Module) else getattr(fn, "__self__", None)
    if not isinstance(module, torch.nn.Module):
        return set()
    keys = (memory_key(t) for t in (*module.parameters(), *module.buffers()))
    return {k for k in keys if k is not None}


def module_arguments(args: tuple, kwargs: dict) -> list[torch.nn.Module]:
    """The nn.Module leaves of a call's arguments."""
    return [m for m in _pytree.tree_leaves((args, kwargs)) if isinstance(m, torch.nn.Module)]


def input_tensors(args: tuple, kwargs: dict) -> set[int]:
    """The ids of the tensors a served call passes (the arguments' pytree leaves and
    the parameters and buffers of the module arguments, at any depth), and the memory
    keys of what they view (memory_key)."""
    tensors: list = []
    for leaf in _pytree.tree_leaves((args, kwargs)):
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
        elif isinstance(leaf, torch.nn.Module):
            tensors += [*leaf.parameters(), *leaf.buffers()]
    keys = {memory_key(t) for t in tensors}  # (a view of one is one of them)
    return {id(t) for t in tensors} | {k for k in keys if k is not None}


def reachable_tensors(
    roots: Iterable[Any], *, max_depth: int = 4, max_objects: int = 20000
) -> dict[int, str]:
    """``{id(tensor): where}`` for the tensors reachable from ``roots`` (the captured
    function and its nn.Module arguments): closure cells, defaults, the globals its
    code names, a bound method's ``self``, functools.partial arguments, instance
    attributes and the items of lists, tuples, dicts and sets, ``max_depth`` steps
    deep (the submodules of an nn.Module at any depth). Python modules, classes and
    builtins are not walked."""
    found: dict[int, str] = {}
    seen: set[int] = set()
    todo = [(r, getattr(r, "__qualname__", type(r).__name__), 0) for r in roots]
    while todo and len(seen) < max_objects:
        obj, where, depth = todo.pop()
        if id(obj) in seen or isinstance(
            obj, (types.ModuleType, type, str, bytes, int, float, bool)
        ):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.setdefault(id(obj), where)
            memory = memory_key(obj)
            if memory is not None:  # (a tracer may hand back a detached alias of it)
                found.setdefault(memory, where)
            continue
        if depth >= max_depth:
            continue
        children: list[tuple[Any, str]] = []
        if isinstance(obj, (types.FunctionType, types.MethodType)):
            func = getattr(obj, "__func__", obj)
            if isinstance(obj, types.MethodType):
                children.append((obj.__self__, f"{where}.__self__"))
            code = getattr(func, "__code__", None)
            for name, cell in zip(getattr(code, "co_freevars", ()), func.__closure__ or ()):
                try:
                    children.append((cell.cell_contents, f"closure variable {name!r}"))
                except ValueError:  # an empty cell
                    pass
            names = set()
            stack = [code] if code is not None else []
            while stack:  # the globals named by the function and the code nested in it
                c = stack.pop()
                names.update(c.co_names)
                stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
            g = getattr(func, "__globals__", {})
            children += [(g[n], f"global {n!r}") for n in sorted(names) if n in g]
            children += [(d, f"a default of {where}") for d in (func.__defaults__ or ())]
            children += [
                (d, f"a default of {where}")
                for d in (getattr(func, "__kwdefaults__", None) or {}).values()
            ]
            if hasattr(func, "__wrapped__"):
                children.append((func.__wrapped__, where))
        elif isinstance(obj, functools.partial):
            children += [(obj.func, where)] + [
                (a, f"an argument of {where}") for a in (*obj.args, *obj.keywords.values())
            ]
        elif isinstance(obj, dict):
            children += [(v, f"{where}[{k!r}]") for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children += [(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        else:
            attrs = getattr(obj, "__dict__", None)
            if isinstance(attrs, dict):
                modules = isinstance(obj, torch.nn.Module)
                children += [
                    (v, f"{where}.{k}")
                    for k, v in attrs.items()
                    if not (modules and k == "_modules")
                ]
            if callable(obj) and not isinstance(obj, torch.nn.Module):
                children.append((type(obj).__call__, where))
            if isinstance(obj, torch.nn.Module):
                children.append((type(obj).forward, f"{type(obj).__name__}.forward"))
                # submodules at this depth: a deep model's plain tensor attributes count too
                todo.extend(
                    (m, f"{where}.{n}", depth) for n, m in obj._modules.items() if m is not None
                )
        todo.extend((c, w, depth + 1) for c, w in children)
    return found


def _is_script_object(value) -> bool:
    fake = getattr(getattr(torch, "_library", None), "fake_class_registry", None)
    fake_type = getattr(fake, "FakeScriptObject", ())
    return isinstance(value, (torch.ScriptObject, *((fake_type,) if fake_type else ())))


def _script_object_error(target: str, name: str, value) -> CaptureError:
    try:
        qualname = value._type().qualified_name()
    except Exception:  # noqa: BLE001 - a FakeScriptObject or an older torch
        qualname = type(value).__name__
    if "c10d" in qualname or "ProcessGroup" in qualname:
        return CaptureError(
            "the function calls a torch.distributed (c10d) collective such as "
            f"dist.all_reduce(t), which passes a ProcessGroup object ({name}); use the functional "
            "collectives instead: `import torch.distributed._functional_collectives as funcol; "
            "t = funcol.all_reduce(t, 'sum', group=list_of_ranks)` (they return the result; see "
            "docs/capture-contract.md, torch.distributed)",
            target=target,
        )
    return CaptureError(
        f"the function uses the TorchScript object {name} ({qualname}); "
        "a pair cannot carry it: pass tensors, or capture with a function that does not use it",
        target=target,
    )


def check_graph_attrs(gm, target: str, *, roots: Iterable[Any] = (), symbolic=None) -> list:
    """Classify every ``get_attr`` of ``gm`` (see the module docstring) and rewrite
    the graph in place so that it reads no tensor attribute.

    Args:
        gm: the traced torch.fx.GraphModule (any tracer: make_fx or torch.export's
            ``ep.module()``); its subgraphs are checked too.
        target: the target name, for messages.
        roots: the captured function and its nn.Module arguments, whose reachable
            tensors are the closed-over ones (:func:`reachable_tensors`).
        symbolic: the trace's dynamic_dims.SymbolicTrace, or None; fake copies of
            the constants are appended to its ``inputs`` (what Inductor compiles for).
    Returns:
        the trace-made tensor constants, in the order of the placeholders appended
        to ``gm``'s inputs (the caller passes them after the other inputs).
    Raises:
        CaptureError: the graph reads a closed-over tensor, a script object (a c10d
            ProcessGroup: use functional collectives), or a tensor constant inside a
            subgraph.
    """
    _check_subgraphs(gm, target)
    user, own = None, set()
    constants, nodes = [], []
    for node in list(gm.graph.nodes):
        if node.op != "get_attr":
            continue
        value = _attr(gm, node.target)
        if isinstance(value, torch.fx.GraphModule):
            continue  # a control-flow operator's subgraph: served as code
        if _is_script_object(value):
            raise _script_object_error(target, node.target, value)
        if not isinstance(value, torch.Tensor):
            raise CaptureError(
                f"the traced graph reads {node.target}, a "
                f"{type(value).__name__} the pair cannot carry; pass it as an argument",
                target=target,
            )
        made_here = node.users and all(
            getattr(getattr(u.target, "_schema", None), "name", None) in _LIFT_FRESH
            for u in node.users
        )
        if not made_here:
            if user is None:
                user = reachable_tensors(roots)
                own = _own_state(next(iter(roots), None))
            if any(
                sharing.writes(u, node) for u in node.users
            ):  # a trace-made constant is copied first
                raise CaptureError(
                    "the function writes in place to a tensor that is not an "
                    f"input ({user.get(id(value), node.target)}); the pair cannot update your object. "
                    "Register it on the module (register_buffer) or pass it as an argument",
                    target=target,
                )
            memory = memory_key(value)
            where = user.get(id(value)) or (
                None if memory is None or memory in own else user.get(memory)
            )
            if where is not None:
                raise CaptureError(
                    "the function reads a tensor that is not an input "
                    f"({where}, traced as {node.target}): a closed-over tensor or an "
                    "attribute that is not a registered parameter/buffer. Register it on the "
                    "module (register_buffer) or pass it as an argument",
                    target=target,
                )
        constants.append(value.detach())
        nodes.append(node)
    if nodes:
        _lift(gm, nodes)
        if symbolic is not None:
            symbolic.inputs = [*symbolic.inputs, *_fake_constants(symbolic.inputs, constants)]
    return constants


def _check_subgraphs(gm, target: str) -> None:
    """A subgraph's own attributes may only be subgraphs (its tensors are not lifted)."""
    for name, sub in gm.named_modules():
        if sub is gm or not isinstance(sub, torch.fx.GraphModule):
            continue
        for node in sub.graph.nodes:
            if node.op != "get_attr":
                continue
            value = _attr(sub, node.target)
            if _is_script_object(value):
                raise _script_object_error(target, f"{name}.{node.target}", value)
            if not isinstance(value, torch.fx.GraphModule):
                raise CaptureError(
                    f"the branch/body {name} of a control-flow operator "
                    f"reads the tensor {node.target} that is not one of its operands (a tensor "
                    "made or closed over inside the branch); create it outside and pass it in "
                    "the operands tuple",
                    target=target,
                )


def _lift(gm, nodes: list) -> None:
    """Replace each get_attr node with a new trailing placeholder."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    last = placeholders[-1] if placeholders else None
    new = []
    for node in nodes:
        with (
            graph.inserting_after(last)
            if last is not None
            else graph.inserting_before(next(iter(graph.nodes)))
        ):
            last = graph.placeholder(node.target.replace(".", "_"))
        last.meta.update(node.meta)
        new.append(last)
    for node, ph in zip(nodes, new):
        node.replace_all_uses_with(ph)
        graph.erase_node(node)
        owner, _, attr = node.target.rpartition(".")
        try:
            delattr(_attr(gm, owner) if owner else gm, attr)
        except AttributeError:
            pass
    graph.lint()
    gm.recompile()


def constant_specs(constants: list) -> list[ConstantSpec]:
    """The literal form of trace-made constants for PRECOMPILE_METADATA, decoded by
    the driver at load.

    Args:
        constants: the tensors the trace made (``x + torch.tensor(2.0)``), on any
            device, any layout; they are copied to the CPU here, not changed.
    Returns:
        one dict per tensor, in order: ``{"dtype": "torch.float32", "shape": [2, 3],
        "device_type": "cpu"|"cuda", "data": base64 (ASCII) of its raw bytes in
        C-contiguous order ("" for an empty tensor)}``.
    Raises:
        RuntimeError: (torch) a tensor that has no byte view (sparse, quantized).
    """
    out: list[ConstantSpec] = []
    for t in constants:
        flat = t.detach().to("cpu").clone().contiguous()
        data = bytes(flat.reshape(-1).view(torch.uint8).tolist()) if flat.numel() else b""
        out.append(
            {
                "dtype": str(t.dtype),
                "shape": list(t.shape),
                "device_type": t.device.type,
                "data": base64.b64encode(data).decode("ascii"),
            }
        )
    return out


def _fake_constants(fake_inputs: list, constants: list) -> list:
    """``constants`` as fake tensors of the fake mode of ``fake_inputs`` (a symbolic
    trace compiles against fakes)."""
    mode = next(
        (getattr(t, "fake_mode", None) for t in fake_inputs if getattr(t, "fake_mode", None)), None
    )
    if mode is None:
        return list(constants)
    return [mode.from_tensor(c, static_shapes=True) for c in constants]


def reassigned_buffers(
    modules: list, names: list[str], leaves: list, target: str
) -> list[tuple[int, Any]]:
    """``[(index, new tensor)]`` for each lifted buffer (``names[index]``, ``m{i}.path``)
    that the call reassigned (``self.steps = self.steps + 1``): the tensor in its
    module's ``_buffers`` is no longer ``leaves[index]``, the one the trace put there.
    Call it inside the reparametrization, after the call.

    Raises:
        CaptureError: the new value is no tensor, or has another shape or dtype (the
            loaded function copies it into the buffer the caller passes).
    """
    out = []
    for index, (name, leaf) in enumerate(zip(names, leaves)):
        i, _, local = name.partition(".")
        owner_path, _, attr = local.rpartition(".")
        owner = modules[int(i[1:])].get_submodule(owner_path)
        if attr not in owner._buffers:
            continue
        new = owner._buffers[attr]
        if new is leaf:
            continue
        if not isinstance(new, torch.Tensor) or new.shape != leaf.shape or new.dtype != leaf.dtype:
            got = (
                "None"
                if new is None
                else (
                    f"shape {list(new.shape)}, dtype {new.dtype}"
                    if isinstance(new, torch.Tensor)
                    else type(new).__name__
                )
            )
            raise CaptureError(
                f"the call reassigns buffer {local!r} with a value of {got}; "
                f"it was shape {list(leaf.shape)}, dtype {leaf.dtype}. The loaded function copies "
                "a reassigned buffer's new value into the buffer, so keep its shape and dtype",
                target=target,
            )
        out.append((index, new))
    return out
