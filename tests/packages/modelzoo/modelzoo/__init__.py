"""Library models people ship, in tiny random configurations (no downloads): the
public-model matrix of tests/test_models.py, bench/models.py and scripts/gpu_check.sh.

Each case names a builder (seeded: the capture, the test and the bench build the same
weights), example inputs, and the function that is captured. ``CASES[name]``:

- ``build()``: the model, on no device yet;
- ``inputs(device, **sizes)``: the example call's arguments after the model;
- ``fn``: the captured function, called ``fn(model, *inputs)``;
- ``train``: whether ``fn`` runs a backward (a training step);
- ``dynamic``: ``{input index: {dim: (min, max)}}`` marked before the capture;
- ``serve_sizes``: the sizes the test serves a dynamic case at.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

VOCAB = 128


def _seeded(build):
    def wrapped():
        torch.manual_seed(0)
        return build()

    return wrapped


# ---- transformers -------------------------------------------------------------------
@_seeded
def build_bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    return BertModel(cfg, add_pooling_layer=False).eval()


@_seeded
def build_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    # dropout off: the test compares parameters after 3 steps with eager's exactly
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    )
    return GPT2LMHeadModel(cfg)


@_seeded
def build_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


@_seeded
def build_bart():
    from transformers import BartConfig, BartModel

    cfg = BartConfig(
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    return BartModel(cfg).eval()


@_seeded
def build_hf_vit():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    return ViTModel(cfg, add_pooling_layer=False).eval()


# ---- timm -------------------------------------------------------------------------------
@_seeded
def build_resnet18():
    import timm

    return timm.create_model("resnet18", pretrained=False, num_classes=10)


@_seeded
def build_timm_vit():
    import timm

    return timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=10
    ).eval()


# ---- the captured functions -------------------------------------------------------------
def mean_pooled(model, ids, mask):
    """Sentence embedding: the mean of the last hidden states over unpadded tokens."""
    h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1)


def causal_lm(model, ids, mask):
    """A ModelOutput (CausalLMOutputWithCrossAttentions / CausalLMOutputWithPast)."""
    return model(input_ids=ids, attention_mask=mask, use_cache=False)


def lm_train_step(model, ids):
    """Language-model loss with labels=, backward inside; the optimizer stays outside."""
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    return loss.detach()


def seq2seq(model, ids, mask, decoder_ids):
    return model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids, use_cache=False)


def vit_hidden(model, pixels):
    return model(pixel_values=pixels)


def classify(model, x):
    return model(x)


def image_train_step(model, x, y):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    return loss.detach()


# ---- inputs -------------------------------------------------------------------------------
def _tokens(device, batch=2, seq=16, padded=True):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if padded:
        mask[-1, seq // 2 :] = 0  # a padded row: the masks have zeros
    return ids.to(device), mask.to(device)


def _images(device, batch=4):
    g = torch.Generator().manual_seed(2)
    return torch.randn(batch, 3, 32, 32, generator=g).to(device)


def _labels(device, batch=4):
    return (torch.arange(batch) % 10).to(device)


@dataclass
class Case:
    build: Callable[[], torch.nn.Module]
    inputs: Callable[..., tuple]
    fn: Callable
    train: bool = False
    dynamic: dict = field(default_factory=dict)
    serve_sizes: list = field(default_factory=list)
    library: str = "transformers"


CASES: dict[str, Case] = {
    "bert_embed": Case(
        build_bert,
        lambda d, seq=16: _tokens(d, seq=seq),
        mean_pooled,
        dynamic={0: {1: (8, 128)}, 1: {1: (8, 128)}},
        serve_sizes=[{"seq": 8}, {"seq": 40}, {"seq": 128}],
    ),
    "gpt2_forward": Case(build_gpt2, lambda d: _tokens(d), causal_lm),
    "gpt2_train": Case(
        build_gpt2, lambda d: _tokens(d, padded=False)[:1], lm_train_step, train=True
    ),
    "llama_forward": Case(build_llama, lambda d: _tokens(d), causal_lm),
    "bart_forward": Case(
        build_bart, lambda d: (*_tokens(d), _tokens(d, seq=8, padded=False)[0]), seq2seq
    ),
    "hf_vit": Case(build_hf_vit, lambda d: (_images(d, 2),), vit_hidden),
    "resnet18_eval": Case(
        lambda: build_resnet18().eval(),
        lambda d, batch=4: (_images(d, batch),),
        classify,
        dynamic={0: {0: (2, 16)}},
        serve_sizes=[{"batch": 2}, {"batch": 5}, {"batch": 16}],
        library="timm",
    ),
    "resnet18_train": Case(
        lambda: build_resnet18().train(),
        lambda d: (_images(d), _labels(d)),
        image_train_step,
        train=True,
        library="timm",
    ),
    "timm_vit": Case(build_timm_vit, lambda d: (_images(d, 2),), classify, library="timm"),
}


# ---- decoding: a static KV cache, prefill and one-token steps ---------------------------
MAX_CACHE = 48  # tokens a cache holds: the longest prompt + the decoded tokens
DECODE_STEPS = 32


def static_cache(model, device, batch=1):
    """A transformers StaticCache for ``model``, allocated on ``device`` (its tensors
    exist before the first call, as a captured step needs)."""
    from transformers import StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=MAX_CACHE)
    cache.early_initialization(
        batch,
        cfg.num_key_value_heads,
        cfg.hidden_size // cfg.num_attention_heads,
        model.dtype,
        device,
    )
    return cache


def lm_step(model, ids, cache, pos):
    """One greedy-decoding call, as generate makes it: the last position's logits
    ([batch, vocab]); ``cache`` (a StaticCache) is written in place at ``pos``."""
    return model(input_ids=ids, past_key_values=cache, cache_position=pos).logits[:, -1]


def export_wrapper(model, device, batch=1):
    """transformers' own export recipe, unmodified: the cache tensors are buffers of the
    wrapper and held by its ``static_cache`` too."""
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config.cache_implementation = "static"
    return TorchExportableModuleWithStaticCache(
        model, batch_size=batch, max_cache_len=MAX_CACHE, device=device
    )


def wrapper_step(wrapper, ids, pos):
    """A step of the export wrapper: logits [batch, tokens, vocab]."""
    return wrapper(input_ids=ids, cache_position=pos)


def prompt(device, n=6, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (1, n), generator=g).to(device)


@torch.no_grad()
def greedy(prefill, decode, model, cache, ids, steps=DECODE_STEPS):
    """Greedy tokens: ``prefill`` on the prompt, then ``steps`` calls of ``decode``;
    both called like :func:`lm_step`, under ``torch.no_grad()`` as ``generate`` calls
    them (a pair captured under no_grad refuses a call with grad on). Returns a
    generator of token ids (one per step): the caller interleaves several requests."""
    n = ids.shape[1]
    token = prefill(model, ids, cache, torch.arange(n, device=ids.device)).argmax(-1)
    for i in range(steps):
        yield int(token)
        token = decode(
            model, token[:, None], cache, torch.tensor([n + i], device=ids.device)
        ).argmax(-1)


@torch.no_grad()
def wrapper_greedy(step, wrapper, ids, steps=DECODE_STEPS):
    """Greedy tokens through the export wrapper, under ``torch.no_grad()``: the prompt
    one token at a time (how its own generate feeds it), then ``steps`` tokens."""
    dev = ids.device
    for i in range(ids.shape[1]):
        logits = step(wrapper, ids[:, i : i + 1], torch.tensor([i], device=dev))
    tokens = []
    for i in range(steps):
        token = logits[:, -1].argmax(-1)
        tokens.append(int(token))
        logits = step(wrapper, token[:, None], torch.tensor([ids.shape[1] + i], device=dev))
    return tokens


def capture_decoding(name: str, device: str) -> None:
    """Capture decoding target ``name`` (``llama_prefill``: a prompt of dynamic length;
    ``llama_decode``: one token; ``llama_wrapper_decode``: the export wrapper's step)."""
    import precompile_build

    model = build_llama().to(device)
    ids = prompt(device, 8)
    if name == "llama_wrapper_decode":
        with torch.no_grad(), precompile_build.capture(wrapper_step) as f:
            f(export_wrapper(model, device), ids[:, :1], torch.tensor([0], device=device))
        return
    pos = torch.arange(ids.shape[1], device=device)
    if name == "llama_prefill":
        torch._dynamo.mark_dynamic(ids, 1, min=2, max=16)
        torch._dynamo.mark_dynamic(pos, 0, min=2, max=16)
    else:
        ids, pos = ids[:, :1].contiguous(), pos[:1].contiguous()  # as a loop's token[:, None] is
    with torch.no_grad(), precompile_build.capture(lm_step) as f:
        f(model, ids, static_cache(model, device), pos)


DECODING = ("llama_prefill", "llama_decode", "llama_wrapper_decode")


def example(name: str, device: str, **sizes) -> tuple[torch.nn.Module, tuple]:
    """``(model, inputs)`` of case ``name`` on ``device`` at the given sizes."""
    case = CASES[name]
    return case.build().to(device), tuple(case.inputs(device, **sizes))


def mark(name: str, inputs: tuple) -> None:
    """Mark the case's dynamic dims on its example inputs (torch's own markers)."""
    for i, dims in CASES[name].dynamic.items():
        for d, (lo, hi) in dims.items():
            torch._dynamo.mark_dynamic(inputs[i], d, min=lo, max=hi)
