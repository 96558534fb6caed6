"""Which example inputs a capture shares with the caller instead of copying.

A capture traces the call, runs the compiled code once and validates it (the graph,
the frozen kernels, the wide reference) on the example inputs: the model's lifted
parameters and buffers and the call's tensors. A copy of every input per run holds
the weights several times over, where the model itself holds them once. So a
capture copies only what a run may write (:func:`written_inputs`): the caller's
model is never changed, and each run starts from the values the call started from;
the tensors a graph only reads are shared (:func:`example_input`).
"""

from __future__ import annotations

import operator

import torch

from .layouts import example_clone, memory_layout

# ops that write their running-stat arguments without an alias annotation in their
# schema (`native_batch_norm(Tensor? running_mean, ...)` updates it in training)
_HIDDEN_WRITERS = (
    "native_batch_norm",
    "_native_batch_norm_legit",
    "batch_norm",
    "cudnn_batch_norm",
    "miopen_batch_norm",
    "_batch_norm_impl_index",
    "_batch_norm_with_update",
)


def example_input(t, shared_storage: bool = False):
    """``t`` itself (detached) where it already has the layout the pair is compiled
    for (:func:`.layouts.example_clone`'s strides), is 16-byte aligned and shares no
    memory with another input (``shared_storage``); else that clone."""
    t = t.detach()
    if shared_storage or t.layout != torch.strided or memory_layout(t) == "overlapping":
        return example_clone(t)
    if (t.storage_offset() * t.element_size()) % 16:
        return example_clone(t)
    if t.is_contiguous() and t.stride() != torch.empty(t.shape, device="meta").stride():
        return example_clone(t)  # a size-1 dim with an arbitrary stride
    return t


def example_inputs(tensors: list) -> list:
    """:func:`example_input` of each of ``tensors`` (flat, in order); inputs that share
    a storage with another are cloned (a trace would see them alias)."""
    seen: dict = {}
    for t in tensors:
        key = _storage_key(t)
        seen[key] = seen.get(key, 0) + 1
    return [example_input(t, shared_storage=seen[_storage_key(t)] > 1) for t in tensors]


def _storage_key(t):
    try:
        return (t.device, t.untyped_storage().data_ptr())
    except Exception:  # noqa: BLE001 - no storage (a tensor subclass): never shared
        return id(t)


def written_inputs(gm) -> set[int]:
    """Positions of the flat inputs the graph ``gm`` may write to: those an op writes
    (an alias annotation ``Tensor(a!)`` in its schema, also through views of the input,
    e.g. ``copy_`` of a mutated buffer), the running stats of a batch norm (written
    without one), and, to be safe, every input a call that is no ATen op reads
    (a higher-order op, a user kernel)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = set()
    for i, p in enumerate(placeholders):
        stack, seen = [p], {p}
        while stack and i not in written:
            v = stack.pop()
            for u in v.users:
                if u in seen or u.op == "output":
                    continue
                seen.add(u)
                if u.op != "call_function":
                    written.add(i)
                    break
                if u.target is operator.getitem:
                    stack.append(u)
                    continue
                if not isinstance(u.target, torch._ops.OpOverload):
                    written.add(i)
                    break
                if writes(u, v):
                    written.add(i)
                    break
                if any(r.alias_info is not None for r in u.target._schema.returns):
                    stack.append(u)  # a view of the input: its writes are the input's
    return written


def writes(node, value) -> bool:
    """True when ``node``, an fx node, is an ATen op call that may write the ``value``
    it reads: an alias annotation ``Tensor(a!)`` on the argument (positional, keyword or
    in a list), or an op that writes without one (a batch norm's running stats)."""
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    schema = node.target._schema
    name = node.target._schema.name.split("::")[-1]
    if name in _HIDDEN_WRITERS:
        return True
    for j, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        a = node.args[j] if j < len(node.args) else node.kwargs.get(arg.name)
        if a is value or (isinstance(a, (list, tuple)) and any(x is value for x in a)):
            return True
    return False


def own_written(example: list, sources: list, written) -> list:
    """``example`` (from :func:`example_inputs` of ``sources``) with a clone in place of
    each shared input in ``written``: the call that runs next may write the caller's."""
    return [
        example_clone(t) if i in written and _storage_key(t) == _storage_key(sources[i]) else t
        for i, t in enumerate(example)
    ]


def run_inputs(inputs: list, written) -> list:
    """The inputs for one run of a graph or its compiled code: a clone
    (:func:`.layouts.example_clone`) of each input in ``written``, the others as they
    are (the run only reads them)."""
    return [example_clone(t) if i in written else t for i, t in enumerate(inputs)]


_SAME_SIZE_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def checksum(t) -> int:
    """A 64-bit digest of ``t``'s bits (``torch.hash_tensor``'s xor of them where this
    torch has it, else the sum of the bits read as integers): the same before and
    after a run that left ``t`` alone, different (but for an improbable collision)
    after one that wrote to it. Reads ``t`` in place, no copy."""
    t = t.detach()
    if t.numel() == 0:
        return 0
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    if hasattr(torch, "hash_tensor"):
        try:
            return int(torch.hash_tensor(t).view(torch.int64))
        except (RuntimeError, TypeError, NotImplementedError):  # a dtype or device it lacks
            pass
    bits = _SAME_SIZE_INT.get(t.element_size())
    if bits is None or t.is_complex():
        return int(t.abs().sum().double().view(torch.int64))
    return int(t.view(getattr(torch, bits)).sum(dtype=torch.int64))
