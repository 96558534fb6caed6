"""Steady-state time per call, in one process, mechanisms interleaved: eager,
torch.compile, torch.compile(mode="reduce-overhead") (CUDA graphs; CUDA only),
and the precompiled pair with CUDA graphs off and on (on: CUDA only).

Cases (CUDA sizes; ``--device cpu`` uses the tiny analogues in brackets):

- ``decode``: 4 pre-norm transformer blocks, d=512, 8 heads, batch 1 x 1 token,
  fp32: an LLM decode step, where launches dominate [d=128, 4 heads];
- ``tinylm``: the example project's TinyLM forward at batch 1 x 32 tokens;
- ``gpt``: 4 blocks, bf16, batch 8 x 512 tokens x d=1024, 16 heads: compute-bound
  [fp32, 2 x 32 tokens x d=64, 2 layers];
- ``bert``: the model matrix's ``bert_embed`` (tests/packages/modelzoo: a tiny random
  transformers BertModel, mean-pooled over a padded batch of 2 x 16 tokens), the same
  on both devices.

The pair is captured here with the frozen engine and loaded with the source's
``load(kernel_dir)``, the call ``load_packaged`` makes after its checks (those run
once per process and are not in a call's time). Each round runs every mechanism
``--calls`` times (synchronised before and after), each round starting one mechanism
later (a fixed order charges any drift within a round, such as the H200's SM clock
falling from 1980 to about 1500 MHz under load, to the same mechanism); the table
gives the median over ``--rounds`` rounds, the round spread ((slowest - fastest
round) / median; each round's time is also printed to stdout) and each result's largest
difference from eager.

    PYTHONPATH=$PWD:$PWD/runtime:$PWD/example_project python bench/steady_state.py \
        --device cpu --out bench/results/steady_state_cpu.md
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "example_project"))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def blocks(n, d, heads):
    return nn.Sequential(*[Block(d, heads) for _ in range(n)])


def forward(model, x):
    return model(x)


def make_case(name, device):
    """``(model, fn, args)``: the case's model, the captured function, its inputs."""
    torch.manual_seed(0)
    cuda = device == "cuda"
    if name == "decode":
        d, h = (512, 8) if cuda else (128, 4)
        return blocks(4, d, h).to(device).eval(), forward, (torch.randn(1, 1, d, device=device),)
    if name == "tinylm":
        import tinylm

        ids, _ = tinylm.example_batch(device, batch=1)
        return tinylm.build_model(seed=0, device=device).eval(), forward, (ids,)
    if name == "gpt":
        if cuda:
            m = blocks(4, 1024, 16).to(device, torch.bfloat16).eval()
            return m, forward, (torch.randn(8, 512, 1024, device=device, dtype=torch.bfloat16),)
        return blocks(2, 64, 4).eval(), forward, (torch.randn(2, 32, 64),)
    if name == "bert":
        sys.path.insert(0, str(REPO / "tests" / "packages" / "modelzoo"))
        import modelzoo

        model, args = modelzoo.example("bert_embed", device)
        return model.eval(), modelzoo.mean_pooled, args
    raise ValueError(name)


def load_pair(model, fn, args, tmp: Path):
    import precompile_build
    from precompile_runtime.envelope import loads

    paths = {"artifact_path": tmp / "t.py", "cache_path": tmp / "t.cache"}
    with torch.no_grad(), precompile_build.capture(fn, engine="frozen", **paths) as f:
        f(model, *args)
    env = loads(paths["cache_path"].read_bytes())
    for name, blob in env.blobs.items():
        (tmp / "k" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "k" / name).write_bytes(blob)
    ns: dict = {"__name__": "pair"}
    exec(compile(paths["artifact_path"].read_text(), "t.py", "exec"), ns)
    return ns["load"](str(tmp / "k")).with_cuda_graphs(False)


def mechanisms(model, fn, args, device, tmp: Path):
    out = {"eager": lambda: fn(model, *args)}
    compiled = torch.compile(fn)
    out["torch.compile"] = lambda: compiled(model, *args)
    if device == "cuda":
        ro = torch.compile(fn, mode="reduce-overhead")
        out["torch.compile reduce-overhead"] = lambda: ro(model, *args)
    pair = load_pair(model, fn, args, tmp)
    out["pair, graphs off"] = lambda: pair(model, *args)
    if device == "cuda":
        graphed = pair.with_cuda_graphs()
        out["pair, graphs on"] = lambda: graphed(model, *args)
        out["pair, graphs on"].graphs = graphed._graphs  # recorded / plain counts
    return out


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def run_case(name, device, calls, rounds, log):
    model, fn, args = make_case(name, device)
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        mechs = mechanisms(model, fn, args, device, Path(tmp))
        want = fn(model, *args).float()
        errs, first = {}, {}
        for k, fn in mechs.items():  # warm up: compile, record; first calls timed
            sync(device)
            t0 = time.perf_counter()
            got = fn()
            sync(device)
            first[k] = (time.perf_counter() - t0) * 1e3
            for _ in range(5):
                got = fn()
            errs[k] = float((got.float() - want).abs().max())
        times = {k: [] for k in mechs}
        order = list(mechs.items())
        for r in range(rounds):  # each round starts one mechanism later: no fixed position
            for k, fn in order[r % len(order) :] + order[: r % len(order)]:
                sync(device)
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                sync(device)
                times[k].append((time.perf_counter() - t0) * 1e3 / calls)
        graphs = {
            k: (f.graphs.recorded, f.graphs.plain, f.graphs.last_ratio)
            for k, f in mechs.items()
            if hasattr(f, "graphs")
        }
    med = {k: statistics.median(v) for k, v in times.items()}
    log(f"{name}: " + ", ".join(f"{k} {v:.4f} ms" for k, v in med.items()))
    log(
        f"{name} rounds: "
        + "; ".join(f"{k} " + " ".join(f"{t:.3f}" for t in v) for k, v in times.items())
    )
    spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    return med, errs, first, graphs, spread


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--cases", nargs="+", default=["decode", "tinylm", "gpt", "bert"])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (CPU on a shared host)")
    ap.add_argument("--out")
    a = ap.parse_args()
    for name in ("calls", "rounds", "threads"):
        if getattr(a, name) is not None and getattr(a, name) < 1:
            ap.error(f"--{name} takes a positive number, not {getattr(a, name)}")
    if a.threads:
        torch.set_num_threads(a.threads)
    what = (
        torch.cuda.get_device_name()
        if a.device == "cuda"
        else f"{platform.machine()} CPU (torch threads: {torch.get_num_threads()})"
    )
    lines = [
        f"# Steady state per call ({a.device})",
        "",
        f"`python bench/steady_state.py {' '.join(sys.argv[1:])}` - torch {torch.__version__}, "
        f"Python {platform.python_version()}, {what}; one process, mechanisms interleaved, "
        f"median of {a.rounds} rounds x {a.calls} calls; ms per call; vs X: this mechanism's "
        "time over X's (below 1x: faster); round spread: (slowest - fastest round) / median "
        "(each round's time is printed to stdout); err: max |result - eager|.",
        "First call ms: the first call in this process, made after the pair was captured and",
        "loaded here, so for torch.compile it includes compiling and for the pair only the",
        "call; cold starts are bench/cold_start.py's."
        + (
            " With graphs on, the first call is the warm-up run, the second a timed plain run"
            " (launch-bound or compute-bound?), the third records."
            if a.device == "cuda"
            else ""
        ),
        "",
    ]

    def write():
        if a.out:
            Path(a.out).write_text("\n".join(lines) + "\n")

    for name in a.cases:
        try:
            med, errs, first, graphs, spread = run_case(name, a.device, a.calls, a.rounds, print)
        except Exception:
            lines += [f"## {name}", "", "failed:", "```", traceback.format_exc()[-2000:], "```", ""]
            write()
            continue
        ref = med["torch.compile"]
        ro = med.get("torch.compile reduce-overhead")
        lines += [
            f"## {name}",
            "",
            "| mechanism | ms per call | round spread | vs torch.compile | vs reduce-overhead | first call ms | err |",
            "|---|---|---|---|---|---|---|",
        ]
        for k, v in med.items():
            vs_ro = f"{v / ro:.2f}x" if ro else "-"
            err = errs[k]
            lines.append(
                f"| {k} | {v:.4f} | {spread[k]:.0%} | {v / ref:.2f}x | {vs_ro} | {first[k]:.0f} | "
                f"{err:.1e} |"
                if math.isfinite(err)
                else f"| {k} | {v:.4f} | | | | | nan |"
            )
        for k, (recorded, plain, ratio) in graphs.items():
            told = (
                f"; GPU time / CPU time of the timed run: {ratio:.2f} (a graph is recorded at "
                "1.5 or below)"
                if ratio is not None
                else ""
            )
            lines += [
                "",
                f"{k}: {recorded} graph(s) recorded, {plain} size(s) run without one "
                f"(compute-bound at its timed run){told}",
            ]
        lines.append("")
        write()
    print("\n".join(lines))
    write()


if __name__ == "__main__":
    main()
