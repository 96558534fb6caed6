"""Models of the cold-start benchmark and their example inputs.

- ``tinylm``: the example project's model (tinylm.build_model(seed=0)), forward on
  a (2, 32) batch of token ids.
- ``gpt_block``: a 4-layer pre-norm GPT block stack (attention + MLP). On CUDA:
  bf16, batch 8, sequence 512, width 1024, 16 heads (the figure the issue quotes).
  On CPU, fp32 and batch 2, sequence 128, width 256, 4 heads, so that Inductor's C++
  compile and a CPU forward stay within a CI machine's minutes.
"""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


def gpt_block_config(device: str) -> dict:
    if device == "cuda":
        return dict(layers=4, batch=8, seq=512, d=1024, heads=16, dtype=torch.bfloat16)
    return dict(layers=4, batch=2, seq=128, d=256, heads=4, dtype=torch.float32)


def build(name: str, device: str):
    """Returns (model, example_args) for ``name`` on ``device``; weights seeded."""
    torch.manual_seed(0)
    if name == "tinylm":
        import tinylm

        model = tinylm.build_model(seed=0, device=device).eval()
        ids, _ = tinylm.example_batch(device)
        return model, (ids,)
    if name == "gpt_block":
        c = gpt_block_config(device)
        model = nn.Sequential(*[Block(c["d"], c["heads"]) for _ in range(c["layers"])])
        model = model.to(device=device, dtype=c["dtype"]).eval()
        x = torch.randn(c["batch"], c["seq"], c["d"], device=device, dtype=c["dtype"])
        return model, (x,)
    raise ValueError(f"unknown model {name!r}: use tinylm or gpt_block")


def forward(model, *args):
    """The benchmarked function: inference forward."""
    with torch.no_grad():
        return model(*args)
