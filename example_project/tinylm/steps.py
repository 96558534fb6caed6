"""The functions the targets capture, as plain eager code.

The capture scripts hand these to ``precompile_build.capture``; ``tinylm.demo``
calls them again, eagerly, as the reference each loaded artifact is compared with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import kernels
from .model import TinyLM


def forward(model: TinyLM, ids: torch.Tensor) -> torch.Tensor:
    """Target ``forward``: logits ``(B, T, vocab)`` for token ids ``(B, T)``."""
    return model(ids)


def train_step(model: TinyLM, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Target ``train_step``: next-byte cross-entropy; gradients accumulate into
    ``model``'s parameters' ``.grad`` (like eager ``loss.backward()``). Returns the
    detached loss."""
    logits = model(ids)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    return loss.detach()


def triton_rmsnorm(model: TinyLM, ids: torch.Tensor) -> torch.Tensor:
    """Target ``triton_rmsnorm`` (CUDA): the final RMSNorm applied to the embeddings
    of ``ids`` by the custom Triton kernel. Inference only."""
    with torch.no_grad():
        h = model.embed(ids)
        return kernels.fused_rmsnorm(h, model.norm_f.weight, model.config.norm_eps)


def triton_rmsnorm_reference(model: TinyLM, ids: torch.Tensor) -> torch.Tensor:
    """Eager reference for :func:`triton_rmsnorm`."""
    with torch.no_grad():
        h = model.embed(ids)
        return kernels.rmsnorm_reference(h, model.norm_f.weight, model.config.norm_eps)
