"""Tensor-parallel models as a serving process builds them under torchrun: the default
process group from the environment, a 1-D DeviceMesh over the world (named ``tp``),
the model sharded with ``parallelize_module``. The capture scripts and the serving
script (serve.py) build the same seeded weights with these functions."""

from __future__ import annotations

import torch
import torch.distributed as dist

VOCAB = 128
MAX_CACHE = 32
PROMPT = 8
TOKENS = 16


def init_world(dp: int = 1):
    """``dist.init_process_group()`` from torchrun's environment (or the build's) and
    the ``tp`` mesh over the whole world; with ``dp`` > 1 a ``(dp, tp)`` mesh and its
    ``tp`` part (rank 0's tensor-parallel group is ranks 0, 1; rank 2's 2, 3)."""
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized():
        dist.init_process_group()
    device = "cuda" if torch.cuda.is_available() and dist.get_backend() == "nccl" else "cpu"
    if dp > 1:
        return init_device_mesh(
            device, (dp, dist.get_world_size() // dp), mesh_dim_names=("dp", "tp")
        )["tp"]
    return init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("tp",))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


def build_mlp(mesh):
    """The MLP, ``up`` colwise and ``down`` rowwise (one all-reduce per call)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = MLP().eval()
    return parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def mlp_call(model, x):
    return model(x)


def mlp_input():
    return torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


# ---- a tiny transformers Llama at TP = world size ----------------------------------
LLAMA_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}


def llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )


def build_llama(mesh):
    """A seeded tiny LlamaForCausalLM with q/k/v/gate/up colwise and o/down rowwise in
    every layer (embeddings, norms and lm_head replicated)."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config()).eval()
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {
        f"model.layers.{i}.{name}": styles[style]()
        for i in range(model.config.num_hidden_layers)
        for name, style in LLAMA_PLAN.items()
    }
    return parallelize_module(model, mesh, plan)


def static_cache(model):
    """A StaticCache sized for this rank's share of the KV heads."""
    from transformers import StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=MAX_CACHE)
    cache.early_initialization(
        1,
        cfg.num_key_value_heads // dist.get_world_size(),
        cfg.hidden_size // cfg.num_attention_heads,
        model.dtype,
        model.device,
    )
    return cache


def forward(model, ids):
    """The logits of a whole prompt, no cache."""
    return model(input_ids=ids, use_cache=False).logits


def decode_step(model, ids, cache, pos):
    """One decoding call: the last position's logits; ``cache`` written in place at ``pos``."""
    return model(input_ids=ids, past_key_values=cache, cache_position=pos).logits[:, -1]


def prompt():
    return torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(3))


def greedy(step, model, ids, tokens=TOKENS):
    """Greedy tokens through ``step`` (called as :func:`decode_step`) and a fresh
    StaticCache: the prompt one token at a time, then ``tokens`` tokens."""
    cache = static_cache(model)
    for i in range(ids.shape[1]):
        logits = step(model, ids[:, i : i + 1], cache, torch.tensor([i]))
    out = []
    for i in range(tokens):
        token = logits.argmax(-1)
        out.append(int(token))
        logits = step(model, token[:, None], cache, torch.tensor([ids.shape[1] + i]))
    return out
