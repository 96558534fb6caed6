"""Per-call cost of the serving driver alone, on CPU: ns per call with no kernels.

A pair is captured (engine ``eager``: the driver is the same code as the frozen
engine's) for a stack of N transformer-like blocks (LayerNorm, 4 Linear, Dropout,
GELU: 7 submodules and 12 tensors per block), then its kernel call is replaced by
one that returns a ready output tensor: what is timed is the driver (argument walk,
model and input checks, ambient checks, grad mode switch, output rebuild) and
nothing else. N = 4 and 48 show whether the cost grows with the model.

``--decode L [L ...]`` (needs transformers) adds LLM decode steps of a Llama with L
layers (hidden 32): ``lm_step(model, ids, cache, pos)`` with a transformers StaticCache
argument (a pytree of 3 tensors per layer, walked and checked per call) and the export
wrapper form ``wrapper(input_ids=, cache_position=)`` (its cache tensors are buffers).
These pairs get the frozen engine's alias check (inputs written in place: the cache),
which the eager engine's driver skips. ``graphs`` columns: the same StaticCache call
through the CUDA graph lookup of frozen CUDA pairs (``cuda_graphs.py``: size key,
addresses of what the graph reads in place, input copies, output copies) after the
driver, with a stand-in graph whose replay does nothing (no GPU needed).

With ``--baseline recorded`` the same pairs captured with ``options={"guards":
"recorded"}`` are served beside them: the cost of the guards' per-call checks
(templates/guards.py). With ``--baseline REV`` the same pairs are also served by the driver of git
revision REV (the source half's driver, calling-convention and pytree-type blocks
swapped for REV's, those REV has), interleaved in the same process: the ratio is the
change.

    PYTHONPATH=$PWD:$PWD/runtime python bench/driver_overhead.py --baseline de90e17 \
        --out bench/results/driver_overhead_cpu.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import precompile_build

REPO = Path(__file__).resolve().parent.parent
DRIVER = "precompile_build/templates/driver.py"
# the source half's blocks after the models' settings, in codegen.py's order, by header
BLOCKS = [
    ("precompile_build/templates/pytree_types.py", "# ---- pytree registration of transformers"),
    ("precompile_build/templates/state_values.py", "# ---- plain Python values and hooks"),
    ("precompile_build/templates/call_args.py", "# ---- the calling convention: arguments"),
    (DRIVER, "# ---- driver: the calling convention"),
    ("precompile_build/templates/dynamic_sizes.py", "# ---- dynamic dims: symbols bound"),
    ("precompile_build/templates/assumed_state.py", "# ---- the Python state the trace assumed"),
]
# where a revision before the layout by stage (c264384) kept each block
OLD_PATHS = {
    "precompile_build/templates/pytree_types.py": "precompile_build/engines/_pytree_types.py",
    "precompile_build/templates/call_args.py": "precompile_build/engines/_call_args.py",
    DRIVER: "precompile_build/engines/_driver.py",
}
GRAPHS = "precompile_build/templates/cuda_graphs.py"
nn = torch.nn


class Block(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.q, self.o = nn.Linear(d, d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.drop = nn.Dropout(0.1)
        self.act = nn.GELU()

    def forward(self, x):
        h = self.norm(x)
        x = x + self.drop(self.o(self.q(h)))
        return x + self.down(self.act(self.up(h)))


def forward(model, x):
    return model(x)


def _source(layers: int, tmp: Path, options: dict | None = None) -> str:
    model = nn.Sequential(*[Block() for _ in range(layers)]).eval()
    x = torch.randn(1, 16)
    tag = "r" if options else ""
    paths = {
        "artifact_path": tmp / f"l{layers}{tag}.py",
        "cache_path": tmp / f"l{layers}{tag}.cache",
    }
    with precompile_build.capture(forward, engine="eager", options=options, **paths) as f:
        f(model, x)
    return paths["artifact_path"].read_text()


def _llama(layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def _static_cache(model):
    from transformers import StaticCache

    cfg = model.config
    cache = StaticCache(config=cfg, max_cache_len=64)
    cache.early_initialization(
        1, cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads, model.dtype, "cpu"
    )
    return cache


def lm_step(model, ids, cache, pos):
    return model(input_ids=ids, past_key_values=cache, cache_position=pos).logits[:, -1]


def wrapper_step(wrapper, ids, pos):
    return wrapper(input_ids=ids, cache_position=pos)


def _wrapper(model):
    from transformers.integrations.executorch import TorchExportableModuleWithStaticCache

    model.generation_config.cache_implementation = "static"
    return TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=64, device="cpu")


def _decode_case(kind: str, layers: int):
    """(step, argument maker) of a decode case: ``make()`` gives the call's arguments."""
    model = _llama(layers)
    ids, pos = torch.tensor([[1]]), torch.tensor([0])
    if kind == "cache":
        cache = _static_cache(model)
        return lm_step, lambda: (model, ids, cache, pos)
    wrapper = _wrapper(model)
    return wrapper_step, lambda: (wrapper, ids, pos)


def _decode_source(kind: str, layers: int, tmp: Path, options: dict | None = None) -> str:
    step, make = _decode_case(kind, layers)
    tag = "r" if options else ""
    paths = {
        "artifact_path": tmp / f"{kind}{layers}{tag}.py",
        "cache_path": tmp / f"{kind}{layers}{tag}.cache",
    }
    with (
        torch.no_grad(),
        precompile_build.capture(step, engine="eager", options=options, **paths) as f,
    ):
        f(*make())
    return paths["artifact_path"].read_text()


def _swap(source: str, blocks: dict) -> str:
    """``source`` with its blocks from the first of ``blocks`` on replaced by those."""
    start = min(
        source.index(header) for path, header in BLOCKS if path in blocks and header in source
    )
    return source[:start] + "\n\n".join(
        blocks[p].rstrip("\n") + "\n" for p, _ in BLOCKS if p in blocks
    )


def _serve(source: str, blocks: dict | None, case: str, make):
    if blocks is not None:  # swap the serving blocks for another revision's
        source = _swap(source, blocks)
    ns: dict = {"__name__": f"pair_{case}"}
    exec(compile(source, "pair.py", "exec"), ns)
    fn = ns["load"](None)
    if ns["_META"].get("mutated_inputs"):
        ns["_CHECK_ALIASES"] = True  # what the frozen engine's driver checks
    args = make()
    with torch.no_grad():
        out = [fn(*args)]  # the real result once; then the kernels are replaced
    fn._run = lambda flat: out
    return fn, args


class _StandInGraph:
    def replay(self):
        pass


def _with_graphs(fn, graphs_code: str):
    """``fn`` (a served pair) with the CUDA graph lookup after its driver: the call's
    flat inputs go to ``_CudaGraphs`` (recording and replay stand-ins, cuda:0 as the
    device), as a frozen CUDA pair's call does."""
    ns = fn.__call__.__globals__
    ns["_META"]["device"] = "cuda"
    exec(compile(graphs_code, "cuda_graphs.py", "exec"), ns)
    run = fn._run
    graphs = ns["_CudaGraphs"](run, True, 8, "graph")
    graphs._capture = lambda inputs: (_StandInGraph(), tuple(run(inputs)))
    graphs._current_stream = lambda: "stream"
    graphs._stream_object = lambda: None
    cuda0 = torch.device("cuda", 0)
    fn._run = lambda flat: graphs(flat, cuda0)
    return fn


def _time(fn, args, calls: int) -> float:
    with torch.no_grad():  # as the decode pairs were captured (a call with grad on is refused)
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn(*args)
        return (time.perf_counter_ns() - t0) / calls


def _checks(fn) -> str:
    """What the pair's assumed-state check holds (templates/assumed_state.py): the
    attributes the trace read, how many of them (dicts, lists, sets) a call compares
    between full checks, and the hook entries."""
    ns = fn.__call__.__globals__
    reads = sum(len(attrs) for *_, attrs in ns.get("_READS", ()))
    watched = max((len(e[4]) for e in ns.get("_FAST", {}).values() if len(e) > 4), default=0)
    hooks = ns.get("_HOOKS") or {}
    return f"{reads} / {watched} / {len(hooks.get('modules', ())) + len(hooks.get('global', ()))}"


def _guards(fn) -> str:
    """The guards' checks of the pair (templates/guards.py): all / those run per call."""
    checks = fn.__call__.__globals__.get("_G_CHECKS") or []
    return f"{len(checks)} / {sum(1 for c in checks if c[4])}"


def _revision_blocks(rev: str) -> dict:
    blocks = {}
    for path, _ in BLOCKS:
        for at in (path, OLD_PATHS.get(path)):
            p = subprocess.run(
                ["git", "show", f"{rev}:{at}"], cwd=REPO, capture_output=True, text=True
            )
            if at and p.returncode == 0:
                blocks[path] = p.stdout
                break
    return blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 48])
    ap.add_argument(
        "--decode",
        type=int,
        nargs="*",
        default=[],
        help="Llama decode steps of these layer counts (StaticCache argument, export wrapper)",
    )
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument(
        "--baseline",
        help="git revision whose driver is measured beside this one; "
        "'recorded': the same driver, pairs captured with options guards='recorded' "
        "(the cost of the guards' checks, capturing/dynamo_guards.py)",
    )
    ap.add_argument("--out", help="write a markdown table here")
    a = ap.parse_args()
    recorded = a.baseline == "recorded"
    baseline = {} if recorded else _revision_blocks(a.baseline) if a.baseline else None
    cases = {}  # (who, case) -> (fn, args)
    columns = [f"{n} layers" for n in a.layers]
    with tempfile.TemporaryDirectory() as tmp:
        sources = []
        for n in a.layers:

            def make(n=n):
                return nn.Sequential(*[Block() for _ in range(n)]).eval(), torch.randn(1, 16)

            sources.append((f"{n} layers", _source(n, Path(tmp)), make))
        for n in a.decode:
            for kind in ("cache", "wrapper", "graphs"):
                name = f"decode {kind} {n}L"
                columns.append(name)
                sources.append(
                    (
                        name,
                        _decode_source("cache" if kind == "graphs" else kind, n, Path(tmp)),
                        _decode_case("cache" if kind == "graphs" else kind, n)[1],
                    )
                )
        graphs_code = {"this": (REPO / GRAPHS).read_text()}
        if baseline and not recorded:
            graphs_code[a.baseline] = subprocess.run(
                ["git", "show", f"{a.baseline}:{GRAPHS}"],
                cwd=REPO,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        plain = {}  # case -> the source captured with guards="recorded" ("--baseline recorded")
        if recorded:
            opts = {"guards": "recorded"}
            for n in a.layers:
                plain[f"{n} layers"] = _source(n, Path(tmp), opts)
            for n in a.decode:
                for kind in ("cache", "wrapper", "graphs"):
                    plain[f"decode {kind} {n}L"] = _decode_source(
                        "cache" if kind == "graphs" else kind, n, Path(tmp), opts
                    )
            graphs_code["recorded"] = graphs_code["this"]
        for name, src, make in sources:
            for who, blocks in [("this", None)] + (
                [(a.baseline, baseline)] if baseline is not None else []
            ):
                fn, args = _serve(
                    plain[name] if recorded and who != "this" else src,
                    None if recorded else blocks,
                    name,
                    make,
                )
                if " graphs " in name:
                    fn = _with_graphs(fn, graphs_code[who])
                cases[(who, name)] = (fn, args)
    times = {k: [] for k in cases}
    for fn, args in cases.values():  # warm
        _time(fn, args, 200)
    for _ in range(a.rounds):  # interleaved rounds
        for k, (fn, args) in cases.items():
            times[k].append(_time(fn, args, a.calls))
    med = {k: statistics.median(v) for k, v in times.items()}
    growth = a.layers == [4, 48]
    lines = [
        "# Driver overhead per call (CPU, no kernels)",
        "",
        f"`python bench/driver_overhead.py {' '.join(sys.argv[1:])}` "
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs (shared), median of {a.rounds} interleaved rounds x {a.calls} calls.",
        "Each block: 7 submodules, 12 parameters; input 1x16; the kernel call returns a ready tensor."
        + (
            " Decode: a Llama of L layers (hidden 32), one token; `cache`: `lm_step(model, ids, "
            "StaticCache, pos)`, `wrapper`: transformers' export wrapper; alias check on."
            if a.decode
            else ""
        ),
        "",
        "| driver | "
        + " | ".join(f"{c} (ns/call)" for c in columns)
        + (" | 48/4 |" if growth else " |"),
        "|---|" + "---|" * (len(columns) + growth),
    ]
    for who in ["this"] + ([a.baseline] if baseline is not None else []):
        row = [f"{med[(who, c)]:.0f}" for c in columns]
        if growth:
            row.append(f"{med[(who, '48 layers')] / med[(who, '4 layers')]:.2f}")
        lines.append(
            f"| {'this branch' if who == 'this' else 'baseline ' + who} | " + " | ".join(row) + " |"
        )
    lines.append(
        "| checks: attributes read / compared per call / hooks |"
        + "".join(f" {_checks(cases[('this', c)][0])} |" for c in columns)
        + (" |" if growth else "")
    )
    lines.append(
        "| guards: checks / run per call |"
        + "".join(f" {_guards(cases[('this', c)][0])} |" for c in columns)
        + (" |" if growth else "")
    )
    if baseline is not None:
        lines += [
            "",
            "This branch over the baseline: "
            + ", ".join(f"{c} {med[('this', c)] / med[(a.baseline, c)]:.2f}x" for c in columns),
        ]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
