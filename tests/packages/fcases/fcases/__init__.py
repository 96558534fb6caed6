"""Models for the frozen-engine tests: buffers mutated by the call, a training step,
tied weights, a frozen parameter, structured outputs, mixed precision, dynamic dims.

Every constructor takes ``device``: the targets are captured (and the tests run) on
CUDA where the host has it, else on the CPU. Weights are drawn on the CPU first, so
one seed gives the same model on every device."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch import nn


def device() -> str:
    """Where the build captures and the tests run: CUDA when the host has it."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def bn_model(seed: int = 0, device: str = "cpu") -> nn.Module:
    torch.manual_seed(seed)
    return (
        nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
        .train()
        .to(device)
    )


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


def tied_model(seed: int = 0, device: str = "cpu") -> Tied:
    torch.manual_seed(seed)
    return Tied().to(device)


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
    return Out(logits=logits.detach(), extra=None), Stats(
        loss=loss.detach(), steps=model.steps.clone()
    )


def example_ids(device: str = "cpu") -> torch.Tensor:
    return (torch.arange(12).reshape(2, 6) % 32).to(device)


def mixed_models(seed: int = 0, device: str = "cpu"):
    """A bf16 model, an fp16 model and an fp32 model run under autocast."""
    torch.manual_seed(seed)
    low = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)).to(device, torch.bfloat16)
    half = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 8)).to(device, torch.float16)
    auto = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    return low, half, auto


def mixed(low, half, auto, x):
    """bf16 weights and activations; fp16 ones; then fp32 weights under bf16 autocast."""
    y = low(x.to(torch.bfloat16))
    h = half(x.to(torch.float16))
    with torch.autocast(x.device.type, dtype=torch.bfloat16):
        z = auto(x)
    return y, h, z


class Attn(nn.Module):
    """Embedding, causal self-attention, output head: batch and sequence length are
    free dims of the computation (dynamic-dims cases)."""

    def __init__(self, vocab: int = 32, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.emb = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(dim, vocab)


def attn_model(seed: int = 0, device: str = "cpu") -> Attn:
    torch.manual_seed(seed)
    return Attn().to(device)


def attn_step(model, ids, targets):
    """Logits and next-token loss of ``ids`` (B, T); backward accumulates grads."""
    B, T = ids.shape
    x = model.emb(ids)
    q, k, v = model.qkv(x).split(x.shape[-1], dim=-1)
    q, k, v = (t.view(B, T, model.heads, -1).transpose(1, 2) for t in (q, k, v))
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    logits = model.head(y.transpose(1, 2).reshape(B, T, -1))
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
    loss.backward()
    return logits.detach(), loss.detach()


def attn_batch(batch: int, seq: int, seed: int = 0, device: str = "cpu"):
    """Token ids and targets, (batch, seq) int64 each."""
    g = torch.Generator().manual_seed(seed)
    ids, targets = (
        torch.randint(0, 32, (batch, seq), generator=g),
        torch.randint(0, 32, (batch, seq), generator=g),
    )
    return ids.to(device), targets.to(device)
