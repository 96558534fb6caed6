"""Models for the frozen-engine tests: buffers mutated by the call, a training step,
tied weights, a frozen parameter, structured outputs."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import nn


def bn_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4)).train()


def bn_step(model, x, scale: float):
    """Training step: BatchNorm statistics and num_batches_tracked mutate."""
    out = model(x)
    loss = (out * scale).square().mean()
    loss.backward()
    return {"loss": loss.detach(), "head": out[:, :2], "scale": scale}


class Tied(nn.Module):
    def __init__(self, vocab: int = 32, dim: int = 16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.proj.bias.requires_grad_(False)  # frozen: keeps .grad None
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.emb.weight  # tied
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))


def tied_model(seed: int = 0) -> Tied:
    torch.manual_seed(seed)
    return Tied()


class Out(NamedTuple):
    logits: torch.Tensor
    extra: object


@dataclasses.dataclass
class Stats:
    loss: torch.Tensor
    steps: torch.Tensor


def tied_forward(model, ids):
    """Forward + backward through tied weights; a counter buffer increments."""
    h = torch.tanh(model.proj(model.emb(ids)))
    logits = model.head(h)
    loss = logits.logsumexp(-1).mean()
    loss.backward()
    model.steps.add_(1)
    return Out(logits=logits.detach(), extra=None), Stats(loss=loss.detach(), steps=model.steps.clone())


def example_ids() -> torch.Tensor:
    return torch.arange(12).reshape(2, 6) % 32


def mixed_models(seed: int = 0):
    """A bf16 model and an fp32 model run under autocast."""
    torch.manual_seed(seed)
    low = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).to(torch.bfloat16)
    auto = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return low, auto


def mixed(low, auto, x):
    """bf16 weights and activations; then fp32 weights under bf16 autocast."""
    y = low(x.to(torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = auto(x)
    return y, z
