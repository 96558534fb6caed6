"""Memory layouts of example tensors: what a pair is compiled (and its calls checked)
for. Shared by the tracer (tracing.py) and the dynamic-dims checks (dynamic_dims.py)."""

from __future__ import annotations

import torch


def example_clone(t):
    """A detached copy in the layout the pair is compiled (and its calls checked) for:
    canonical strides for a contiguous example (torch leaves a size-1 dim's stride
    arbitrary), the example's own strides otherwise (a slice with gaps, channels-last),
    contiguous where the example overlaps itself (an expand)."""
    t = t.detach()
    if t.is_contiguous() or memory_layout(t) == "overlapping":
        return t.clone(memory_format=torch.contiguous_format)
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def memory_layout(t) -> str:
    """``"dense"`` (the elements fill their memory in some dim order), ``"gapped"``
    (a slice: unused memory between them) or ``"overlapping"`` (two indices share
    memory, as after an expand): the tensor's dims, sorted by stride, must nest."""
    span, kind = 1, "dense"
    for st, n in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n != 1):
        if st < span:
            return "overlapping"
        if st > span:
            kind = "gapped"
        span = st * n
    return kind
