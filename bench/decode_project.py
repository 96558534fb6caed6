"""The project bench/decode.py builds: the model module, the capture script, the wheel.

``MODULE`` is the package's one module (the model, its cache, the steps), imported by
the capture scripts and by decode.py's workers: the same seed, so the same weights,
everywhere. ``CAPTURE`` captures one target per (kind, batch):

- ``prefill_b<B>``: ``step`` over the prompt, its length dynamic;
- ``decode_b<B>``: ``step`` for one token;
- ``greedy_b<B>``: ``greedy_step``, one token with the argmax, the position and the
  results kept on the device: a server loop's whole step in the captured function,
  so that a CUDA graph replays all of it (decode.py's ``*_greedy`` paths).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SIZES = {
    "cpu": dict(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.014,
        dtype="float32",
    ),
    "cuda": dict(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        initializer_range=0.005,
        dtype="bfloat16",
    ),
}

# The package the wheel is built from: its module builds the model and is imported by
# the capture scripts and by the workers (same seed, same weights everywhere).
MODULE = '''
"""The decoding benchmark's model, cache and step (written by bench/decode.py)."""
import torch

CONFIG = {config!r}
MAX_CACHE = {max_cache}


def build(device):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = dict(CONFIG)
    dtype = getattr(torch, cfg.pop("dtype"))
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=MAX_CACHE, tie_word_embeddings=False,
                                             eos_token_id=None, bos_token_id=None, pad_token_id=None, **cfg))
        # decidable greedy tokens (bench/decode.py's docstring): unit-variance embeddings,
        # the lm_head their rows permuted; the layers' weights small (initializer_range)
        g = torch.Generator(device=device).manual_seed(2)
        emb = torch.randn(cfg["vocab_size"], cfg["hidden_size"], generator=g, device=device)
        perm = torch.randperm(cfg["vocab_size"], generator=g, device=device)
        with torch.no_grad():
            model.model.embed_tokens.weight.copy_(emb)
            model.lm_head.weight.copy_(emb[perm] / cfg["hidden_size"] ** 0.5)
    model.generation_config.eos_token_id = None
    return model.to(dtype).eval()


def static_cache(model, batch, device):
    from transformers import StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=MAX_CACHE)
    cache.early_initialization(batch, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads,
                               model.dtype, device)
    return cache


def step(model, ids, cache, pos):
    """Logits of the last position [batch, vocab]; the cache is written in place."""
    return model(input_ids=ids, past_key_values=cache, cache_position=pos).logits[:, -1]


STOP = -1  # the stop token the loops check for: none (every path decodes --steps)


def greedy_step(model, token, cache, pos, tokens, logits):
    """One greedy token with nothing read back: the logits of ``token`` [batch, 1] at
    position ``pos`` [1] (the cache written in place); their argmax written into
    ``token`` and into ``tokens[:, pos + 1]`` ([batch, MAX_CACHE] int64), the logits
    into ``logits[:, pos + 1]`` ([batch, MAX_CACHE, vocab]); ``pos`` advanced by one.
    Returns the stop flag (0-dim bool: every row's next token is STOP)."""
    out = model(input_ids=token, past_key_values=cache, cache_position=pos).logits[:, -1]
    nxt = out.argmax(-1)
    at = pos + 1
    tokens.index_copy_(1, at, nxt[:, None])
    logits.index_copy_(1, at, out[:, None].to(logits.dtype))
    token.copy_(nxt[:, None])
    pos.add_(1)
    return (nxt == STOP).all()


def greedy_buffers(model, batch, device):
    """(tokens, logits): the zeroed results greedy_step writes, [batch, MAX_CACHE]
    int64 and [batch, MAX_CACHE, vocab] in the model's dtype."""
    tokens = torch.zeros(batch, MAX_CACHE, dtype=torch.long, device=device)
    return tokens, torch.zeros(batch, MAX_CACHE, model.config.vocab_size, dtype=model.dtype, device=device)


def prompt(batch, n, device):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG["vocab_size"], (batch, n), generator=g).to(device)
'''

CAPTURE = '''
"""Capture prefill_b<B> (dynamic prompt length), decode_b<B> or greedy_b<B>: argv = kind, batch."""
import json
import os
import sys

import torch

import precompile_build
import llmdecode

kind, batch = sys.argv[1], int(sys.argv[2])
device = os.environ.get("PRECOMPILE_DEVICE", "cpu")
model = llmdecode.build(device)
ids = llmdecode.prompt(batch, 8, device)
pos = torch.arange(8, device=device)
if kind == "prefill":
    torch._dynamo.mark_dynamic(ids, 1, min=2, max=64)
    torch._dynamo.mark_dynamic(pos, 0, min=2, max=64)
else:
    # contiguous, as a decode loop's token[:, None] is (a slice of the batch's prompt
    # would be captured with its row stride)
    ids, pos = ids[:, :1].contiguous(), pos[:1].contiguous()
settings = json.loads(os.environ.get("DECODE_INDUCTOR") or "{}")  # bench/decode.py --inductor
options = {"inductor": settings} if settings else None
cache = llmdecode.static_cache(model, batch, device)
if kind == "greedy":
    with torch.no_grad(), precompile_build.capture(llmdecode.greedy_step, options=options) as f:
        f(model, ids, cache, pos, *llmdecode.greedy_buffers(model, batch, device))
else:
    with torch.no_grad(), precompile_build.capture(llmdecode.step, options=options) as f:
        f(model, ids, cache, pos)
'''


def write_project(
    work: Path,
    device: str,
    batches: list[int],
    max_cache: int,
    kinds=("prefill", "decode"),
    inductor: dict | None = None,
) -> Path:
    """Write the project under ``work/project``: the ``llmdecode`` package (MODULE for
    ``device``'s size, caches of ``max_cache`` tokens), the capture script, and one
    target per kind (``prefill``, ``decode``, ``greedy``) and batch, each captured with
    the Inductor settings ``inductor``. Returns the project's folder."""
    proj = work / "project"
    (proj / "llmdecode").mkdir(parents=True, exist_ok=True)
    (proj / "captures").mkdir(exist_ok=True)
    (proj / "llmdecode" / "__init__.py").write_text(
        MODULE.format(config=SIZES[device], max_cache=max_cache)
    )
    (proj / "captures" / "capture.py").write_text(CAPTURE)
    targets = "".join(
        textwrap.dedent(f'''
        [tool.precompile.targets.{kind}_b{b}]
        script = "captures/capture.py"
        args = ["{kind}", "{b}"]
        device = "{device}"
        timeout = 1800
        env = {{ DECODE_INDUCTOR = {json.dumps(json.dumps(inductor or {}))} }}
        ''')
        for b in batches
        for kind in kinds
    )
    (proj / "pyproject.toml").write_text(
        textwrap.dedent("""
        [build-system]
        requires = ["precompile-build", "torch", "transformers"]
        build-backend = "precompile_build.backend"

        [project]
        name = "llmdecode"
        version = "0.1.0"
        dependencies = ["torch", "transformers"]

        [tool.setuptools]
        packages = ["llmdecode"]

        [tool.precompile]
        package = "llmdecode"
        """)
        + targets
    )
    return proj


def build_wheel(work: Path, proj: Path) -> float:
    """Build and install the wheel into work/site; returns the build's seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]))
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--wheel",
            "--outdir",
            str(work / "dist"),
            str(proj),
        ],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - t0
    wheel = next((work / "dist").glob("llmdecode-*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(work / "site"),
            str(wheel),
        ],
        check=True,
    )
    return seconds
