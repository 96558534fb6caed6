"""A tiny GPT-style decoder over bytes.

Token + learned position embeddings, ``n_layers`` pre-norm blocks (RMSNorm, causal
self-attention, RMSNorm, SiLU MLP, residuals), a final RMSNorm and an output head
tied to the token embedding. No dropout and no biases: the forward pass is a pure
function of the weights and the token ids.

Initial weights come from a ``torch.Generator`` seeded by the caller, drawn on the
CPU in a fixed order, so ``build_model(seed=0)`` gives identical weights on every
call and on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int = 256
    """Byte-level: one token per UTF-8 byte."""
    d_model: int = 64
    """Width of the residual stream."""
    n_layers: int = 2
    """Number of decoder blocks."""
    n_heads: int = 4
    """Attention heads; ``d_model`` must be divisible by it."""
    max_seq: int = 64
    """Longest sequence the position embedding covers."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of ``d_model``."""
    norm_eps: float = 1e-5
    """Epsilon of every RMSNorm."""
    init_std: float = 0.02
    """Standard deviation of the initial weights (residual projections are scaled
    down by ``sqrt(2 * n_layers)``, as in GPT-2)."""

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, computed in fp32 (the eager reference that
    :func:`tinylm.kernels.fused_rmsnorm` is checked against)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=-1)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.down = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.up(x)))


class Block(nn.Module):
    def __init__(self, cfg: TinyLMConfig) -> None:
        super().__init__()
        self.norm_attn = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.norm_mlp = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm_attn(x))
        return x + self.mlp(self.norm_mlp(x))


class TinyLM(nn.Module):
    """``TinyLM(cfg)(ids) -> logits``: ids ``(B, T)`` int64, logits ``(B, T, vocab)``."""

    def __init__(self, cfg: TinyLMConfig | None = None) -> None:
        super().__init__()
        self.config = cfg = cfg or TinyLMConfig()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm_f = RMSNorm(cfg.d_model, cfg.norm_eps)
        # The output head is the token embedding (tied): no separate parameter.

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Token + position embedding of ``ids`` ``(B, T)`` -> ``(B, T, d_model)``."""
        T = ids.shape[-1]
        if T > self.config.max_seq:
            raise ValueError(f"sequence length {T} exceeds max_seq={self.config.max_seq}")
        pos = torch.arange(T, device=ids.device)
        return self.tok_emb(ids) + self.pos_emb(pos)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.norm_f(x), self.tok_emb.weight)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator) -> None:
        """Draw every weight from ``generator`` (a CPU generator), in parameter order."""
        cfg = self.config
        resid_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        for name, p in self.named_parameters():
            if name.endswith(("norm_attn.weight", "norm_mlp.weight", "norm_f.weight")):
                p.fill_(1.0)
                continue
            std = (
                resid_std
                if name.endswith(("attn.proj.weight", "mlp.down.weight"))
                else cfg.init_std
            )
            p.copy_(torch.randn(p.shape, generator=generator, dtype=torch.float32) * std)


def build_model(
    seed: int = 0,
    *,
    device: str | torch.device = "cpu",
    config: TinyLMConfig | None = None,
) -> TinyLM:
    """A :class:`TinyLM` with deterministic initial weights.

    The module is built on the CPU, then every weight is refilled from
    ``torch.Generator().manual_seed(seed)`` and the model moved to ``device``: the same
    seed gives bit-identical weights every time, on every device. The global RNG's
    state is saved and restored around construction, so building a model does not
    change it. (Not built on the meta device: torch's meta-device init imports
    torch._dynamo, seconds of import a serving process does not need.)
    """
    with torch.random.fork_rng(devices=[]):
        model = TinyLM(config)
    model.init_weights(torch.Generator(device="cpu").manual_seed(seed))
    return model.to(device)
