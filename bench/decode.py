"""Greedy LLM decoding: time per token and first token, each path in a fresh process.

A Llama-shaped transformers model with random weights (CUDA: about 1.1B parameters,
bf16: hidden 2048, 16 layers, 32 heads, 8 KV heads, MLP 8192, vocabulary 32000; CPU:
hidden 256, 4 layers, fp32), a prompt of ``--prompt`` tokens, then ``--steps``
greedy tokens, at each batch of ``--batches``. Paths:

- ``eager``: a Python loop over ``model(input_ids=, past_key_values=StaticCache,
  cache_position=)`` (prefill, then one token per call), each token copied to the host;
- ``generate``: ``model.generate(past_key_values=StaticCache(...))`` (a fresh cache of
  one size per call, as ``cache_implementation="static"`` makes one), eager
  (``disable_compile=True``); ``generate_auto``: the same as transformers runs it by
  default (with a static cache it compiles the forward itself);
- ``generate_compile``: ``generate`` after ``model.forward = torch.compile(model.forward,
  fullgraph=True)``; ``generate_compile_ro``: with ``mode="reduce-overhead"``;
- ``load_packaged``: the same loop as ``eager`` on the targets of one wheel built here
  (``prefill_b<B>``: the prompt length dynamic; ``decode_b<B>``: one token), loaded with
  ``precompile_runtime.load_packaged``; ``load_packaged_graphs``: with
  ``cuda_graphs=True`` (CUDA only).

Per path: ``first token`` = seconds from the start of the path in its fresh process
(model built, weights on the device: not counted) to the first token on the host,
compiling or loading included; ``ms/token`` = the time of tokens 2..steps divided by
steps - 1 (generate: ``(t(steps) - t(1)) / (steps - 1)``, each a full generate call,
after the first-token call); tokens are compared with ``eager``'s. ``kernel floor``
(CUDA): the GPU time of one decode step's kernels (torch.profiler over 20 steps of
the frozen kernels without graphs): what a replayed graph can at best reach.

    PYTHONPATH=$PWD:$PWD/runtime python bench/decode.py --device cpu \\
        --out bench/results/decode_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (in the order they run: a run cut short has the cheap and the precompiled ones)
PATHS = ("eager", "load_packaged", "load_packaged_graphs", "generate", "generate_compile", "generate_compile_ro",
         "generate_auto")
SIZES = {
    "cpu": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, initializer_range=0.1, dtype="float32"),
    "cuda": dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                 num_attention_heads=32, num_key_value_heads=8, initializer_range=0.05, dtype="bfloat16"),
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
        model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=MAX_CACHE, **cfg))
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


def prompt(batch, n, device):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, CONFIG["vocab_size"], (batch, n), generator=g).to(device)
'''

CAPTURE = '''
"""Capture prefill_b<B> (dynamic prompt length) or decode_b<B>: argv = kind, batch."""
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
with torch.no_grad(), precompile_build.capture(llmdecode.step) as f:
    f(model, ids, llmdecode.static_cache(model, batch, device), pos)
'''


def write_project(work: Path, device: str, batches: list[int], max_cache: int) -> Path:
    proj = work / "project"
    (proj / "llmdecode").mkdir(parents=True, exist_ok=True)
    (proj / "captures").mkdir(exist_ok=True)
    (proj / "llmdecode" / "__init__.py").write_text(MODULE.format(config=SIZES[device], max_cache=max_cache))
    (proj / "captures" / "capture.py").write_text(CAPTURE)
    targets = "".join(textwrap.dedent(f'''
        [tool.precompile.targets.{kind}_b{b}]
        script = "captures/capture.py"
        args = ["{kind}", "{b}"]
        device = "{device}"
        timeout = 1800
        ''') for b in batches for kind in ("prefill", "decode"))
    (proj / "pyproject.toml").write_text(textwrap.dedent('''
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
        ''') + targets)
    return proj


def build_wheel(work: Path, proj: Path) -> float:
    """Build and install the wheel into work/site; returns the build's seconds."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check", "--wheel",
                    "--outdir", str(work / "dist"), str(proj)], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - t0
    wheel = next((work / "dist").glob("llmdecode-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(work / "site"),
                    str(wheel)], check=True)
    return seconds


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def worker(path: str, device: str, batch: int, steps: int, n_prompt: int) -> dict:
    """One path in this (fresh) process: first-token seconds, ms/token, tokens."""
    import llmdecode
    import torch

    model = llmdecode.build(device)
    ids = llmdecode.prompt(batch, n_prompt, device)
    _sync(device)
    out: dict = {}
    if path.startswith("generate"):
        if path != "generate":
            mode = "reduce-overhead" if path.endswith("_ro") else "default"
            model.forward = torch.compile(model.forward, fullgraph=True, mode=mode)

        extra = {} if path == "generate_auto" else {"disable_compile": True}

        def generate(n):
            _sync(device)
            t0 = time.perf_counter()
            # a fresh StaticCache of one size for every call: the compiled forward sees
            # the same shapes (generate's own static cache is sized by max_new_tokens)
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, past_key_values=llmdecode.static_cache(model, batch, device),
                                 pad_token_id=0, **extra)
            toks = seq[:, n_prompt:].tolist()
            return time.perf_counter() - t0, toks

        with torch.no_grad():
            out["first_token_s"], _ = generate(1)
            generate(3)  # a compiled path compiles its decode step here
            one, _ = generate(1)
            full, out["tokens"] = generate(steps)
        out["ms_per_token"] = (full - one) / (steps - 1) * 1e3
        return out
    t0 = time.perf_counter()
    if path == "eager":
        prefill = decode = llmdecode.step
    else:
        import precompile_runtime

        graphs = path == "load_packaged_graphs"
        prefill = precompile_runtime.load_packaged(f"prefill_b{batch}", package="llmdecode", strict=True)
        decode = precompile_runtime.load_packaged(f"decode_b{batch}", package="llmdecode", strict=True,
                                                  cuda_graphs=graphs)
    cache = llmdecode.static_cache(model, batch, device)
    tokens, times = [], []
    with torch.no_grad():
        token = prefill(model, ids, cache, torch.arange(n_prompt, device=device)).argmax(-1)
        tokens.append(token.cpu())
        out["first_token_s"] = time.perf_counter() - t0
        for i in range(steps - 1):
            t = time.perf_counter()
            token = decode(model, token[:, None], cache, torch.tensor([n_prompt + i], device=device)).argmax(-1)
            tokens.append(token.cpu())  # the host has each token (streamed), as generate's loop does
            times.append(time.perf_counter() - t)
        out["ms_per_token"] = sum(times) / len(times) * 1e3
        out["tokens"] = torch.stack(tokens, 1).tolist()
        if path == "load_packaged" and device == "cuda":
            out["kernel_ms_per_step"] = kernel_floor(decode, model, cache, token, n_prompt + steps, device)
    return out


def kernel_floor(decode, model, cache, token, start, device, n=20) -> float:
    """GPU time of one decode step's kernels (ms): torch.profiler over ``n`` steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    pos = [torch.tensor([start + i], device=device) for i in range(n)]  # MAX_CACHE leaves room
    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for p in pos:
            decode(model, token[:, None], cache, p)
        _sync(device)
    total_us = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return total_us / n / 1e3


def run_path(path: str, device: str, batch: int, steps: int, n_prompt: int, work: Path, timeout: float) -> dict:
    env = dict(os.environ)
    caches = work / f"cache-{path}-{batch}"
    shutil.rmtree(caches, ignore_errors=True)  # fresh compiler caches: a first run
    env.update(TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"), TRITON_CACHE_DIR=str(caches / "triton"),
               PRECOMPILE_CACHE_DIR=str(caches / "precompile"),
               PYTHONPATH=os.pathsep.join([str(work / "site"), str(ROOT), str(ROOT / "runtime"),
                                           env.get("PYTHONPATH", "")]))
    cmd = [sys.executable, __file__, "--worker", path, "--device", device, "--batches", str(batch),
           "--steps", str(steps), "--prompt", str(n_prompt)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {p.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def _first_difference(got, want):
    for r, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            if a != b:
                return f"row {r} token {i}"
    return None


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [f"# Greedy decoding ({meta['device']})", "",
             f"`{meta['command']}` - torch {meta['torch']}, transformers {meta['transformers']}, "
             f"{meta['host']}. Model: {meta['model']}. Prompt {meta['prompt']} tokens, then "
             f"{meta['steps']} greedy tokens; each path in a fresh process with empty compiler caches "
             f"(wheel built in {meta['build_s']:.0f} s).", "",
             "| batch | path | first token (s) | ms/token | vs eager | tokens equal eager | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['batch']} | {r['path']} | - | - | - | - | fails: {r['error']} |")
            continue
        note = []
        if r.get("kernel_ms_per_step") is not None:
            note.append(f"kernel floor {r['kernel_ms_per_step']:.3f} ms/step")
        if r.get("floor_ratio") is not None:
            note.append(f"{r['floor_ratio']:.2f}x the kernel floor")
        lines.append(f"| {r['batch']} | {r['path']} | {r['first_token_s']:.2f} | {r['ms_per_token']:.3f} | "
                     f"{r.get('vs_eager', float('nan')):.2f}x | {r['equal']} | {'; '.join(note)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if _cuda() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per path")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds for the whole run: a path that would start after it is skipped, "
                         "one running is stopped at it")
    ap.add_argument("--work", help="folder for the project, wheel and caches (default: a temp dir)")
    ap.add_argument("--out", help="write the markdown table here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.device, a.batches[0], a.steps, a.prompt)))
        return
    work = Path(a.work or tempfile.mkdtemp(prefix="decode-bench-"))
    paths = [p for p in a.paths if a.device == "cuda" or p != "load_packaged_graphs"]
    proj = write_project(work, a.device, a.batches, a.prompt + a.steps + 24)
    build_s = build_wheel(work, proj) if any(p.startswith("load_packaged") for p in paths) else 0.0
    write = _writer(a, build_s)
    rows: list[dict] = []
    start = time.perf_counter()
    for batch in a.batches:
        eager = None
        for path in paths:
            left = a.timeout if a.budget is None else min(a.timeout, a.budget - (time.perf_counter() - start))
            if left < 10:
                r = {"error": "not run: the --budget was spent"}
            else:
                r = run_path(path, a.device, batch, a.steps, a.prompt, work, left)
            r.update(path=path, batch=batch)
            if path == "eager" and "error" not in r:
                eager = r
            if "error" not in r and eager is not None:
                r["vs_eager"] = eager["ms_per_token"] / r["ms_per_token"]
                diff = _first_difference(r["tokens"], eager["tokens"])
                r["equal"] = "yes" if diff is None else f"no (first at {diff})"
            rows.append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "tokens"}), flush=True)
            floor = next((x["kernel_ms_per_step"] for x in rows if x["batch"] == batch and "kernel_ms_per_step" in x),
                         None)
            for x in rows:
                if x["batch"] == batch and floor and "error" not in x:
                    x["floor_ratio"] = x["ms_per_token"] / floor
            write(rows)  # after every path: a run cut short keeps what it measured


def _writer(a, build_s):
    import torch
    import transformers

    size = SIZES[a.device]
    meta = {"device": a.device, "command": "python bench/decode.py " + " ".join(sys.argv[1:]),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "host": f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs"
            + (f", {torch.cuda.get_device_name()}" if a.device == "cuda" else ""),
            "model": (f"Llama, hidden {size['hidden_size']}, {size['num_hidden_layers']} layers, "
                      f"{size['num_attention_heads']} heads ({size['num_key_value_heads']} KV), MLP "
                      f"{size['intermediate_size']}, vocabulary {size['vocab_size']}, {size['dtype']}"
                      + (", about 1.1B parameters" if a.device == "cuda" else "")),
            "prompt": a.prompt, "steps": a.steps, "build_s": build_s}

    def write(rows):
        if a.out:
            Path(a.out).write_text(markdown(meta, rows))

    return write


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    main()
