"""The capture's trace step, three ways, in one process (capture seconds).

    python bench/trace_speed.py                      # CPU: 16 layers, hidden 256, fp32
    python bench/trace_speed.py --device cuda --dtype bfloat16 --hidden 2048 --layers 16 \\
        --heads 32 --kv-heads 8 --intermediate 8192 --vocab 32000 --tokens 128

A transformers ``LlamaForCausalLM`` (random weights), the target ``forward(model, ids)
-> logits``; each repeat times ``tracing.trace_call`` (what the frozen engine's
``trace`` step runs: capture_stats' ``trace`` seconds) with the export tracer:

  before    ``torch.export.export(strict=False)`` then ``run_decompositions({})``,
            each node's stack trace recorded (aten_export.py before the one pass)
  two-pass  the same without stack traces (aten_export.py's path where torch lacks
            the one-pass entry point)
  one-pass  ``torch.export._trace._export(pre_dispatch=False)`` with the functional
            composite ops kept whole, without stack traces (aten_export.py's default)

in turn, so all see the same machine. It also checks that the graphs hold the same
ATen ops (counts per op; the two-pass graphs' ``aten._assert_tensor_metadata`` checks
aside, which the one pass does not record) and prints one line per result.
``--no-grad``: traced under ``torch.no_grad()`` (as bench/scale_llama.py captures).
``--profile``: the top functions (``SORT``: cumulative seconds) of one more one-pass
trace. ``--md PATH``: a markdown section of the result, appended.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

IGNORED_OPS = {"aten._assert_tensor_metadata.default"}


def build(a):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=max(256, a.tokens),
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, a.dtype))
    try:
        with torch.device(a.device):
            model = transformers.LlamaForCausalLM(cfg).eval()
            ids = torch.randint(0, a.vocab, (1, a.tokens))
    finally:
        torch.set_default_dtype(default)
    return model, ids


def forward(model, ids):
    return model(ids, use_cache=False).logits


PATHS = ("before", "two-pass", "one-pass")


def trace_once(model, ids, path: str):
    """(seconds, op counts) of one ``trace_call`` along ``path`` (one of PATHS)."""
    import contextlib

    from precompile_build.capturing import aten_export, tracing

    saved = aten_export._one_pass_export, aten_export._no_stack_traces
    if path != "one-pass":
        aten_export._one_pass_export = lambda: None
    if path == "before":
        aten_export._no_stack_traces = contextlib.nullcontext
    try:
        t0 = time.perf_counter()
        traced = tracing.trace_call(forward, (model, ids), {}, target="forward", tracer="export")
        seconds = time.perf_counter() - t0
    finally:
        aten_export._one_pass_export, aten_export._no_stack_traces = saved
    ops = collections.Counter(
        str(n.target)
        for n in traced.graph_module.graph.nodes
        if n.op == "call_function" and str(n.target) not in IGNORED_OPS
    )
    return seconds, ops


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument(
        "--reps", type=int, default=3, help="timed traces per path (after one warm-up of each)"
    )
    p.add_argument(
        "--no-grad",
        action="store_true",
        help="trace under torch.no_grad() (as bench/scale_llama.py "
        "captures); default: grad mode on, as a plain call",
    )
    p.add_argument("--profile", action="store_true")
    p.add_argument("--md", type=Path)
    a = p.parse_args()
    import torch

    model, ids = build(a)
    if a.no_grad:
        torch.set_grad_enabled(False)
    for path in PATHS:  # warm-up: imports, first-call caches of each path
        trace_once(model, ids, path)
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    ops = {}
    for _ in range(a.reps):
        for path in PATHS:
            s, ops[path] = trace_once(model, ids, path)
            times[path].append(s)
            print(f"trace {path}: {s:.2f} s", flush=True)
    med = {p: statistics.median(times[p]) for p in PATHS}
    print(
        "median "
        + ", ".join(f"{p} {med[p]:.2f} s" for p in PATHS)
        + f": one-pass/before {med['one-pass'] / med['before']:.2f}"
    )
    same = all(ops[p] == ops["before"] for p in PATHS)
    diff = (
        ""
        if same
        else "".join(
            f"; {p}: only before {dict(ops['before'] - ops[p])}, only {p} {dict(ops[p] - ops['before'])}"
            for p in PATHS[1:]
            if ops[p] != ops["before"]
        )
    )
    print(f"same ops: {same} ({sum(ops['one-pass'].values())} op nodes){diff}")
    if a.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        trace_once(model, ids, "one-pass")
        prof.disable()
        pstats.Stats(prof).sort_stats(os.environ.get("SORT", "cumulative")).print_stats(40)
    if a.md:
        shape = (
            f"{a.layers} layers, hidden {a.hidden}, intermediate {a.intermediate}, {a.heads}/{a.kv_heads} "
            f"heads, vocab {a.vocab}, {a.dtype} on {a.device}, 1 x {a.tokens} tokens, "
            + ("under `torch.no_grad()`" if a.no_grad else "grad mode on")
        )
        what = {
            "before": "`export` + `run_decompositions({})`, stack traces (before)",
            "two-pass": "`export` + `run_decompositions({})` (where torch lacks the one pass)",
            "one-pass": "`_export(pre_dispatch=False)`, composite ops kept (default)",
        }
        rows = "".join(
            f"| {what[p]} | {' / '.join(f'{x:.2f}' for x in times[p])} | {med[p]:.2f} | "
            f"{med[p] / med['before']:.2f} |\n"
            for p in PATHS
        )
        head = (
            "" if a.md.exists() else "# The trace step: one-pass vs two-pass export (issue 24)\n\n"
        )
        with a.md.open("a") as f:
            f.write(
                head + f"## {shape}\n\n"
                f"Produced by `python bench/{Path(__file__).name} {' '.join(sys.argv[1:])}` (torch {torch.__version__}): "
                "`tracing.trace_call` (the capture's `trace` step) of a LlamaForCausalLM with the export "
                "tracer, the paths in turn in one process after one warm-up trace each.\n\n"
                "| path | seconds per trace | median | ratio to before |\n| --- | --- | --- | --- |\n"
                + rows
                + f"\nSame ATen ops in all graphs (counts per op, `_assert_tensor_metadata` aside): "
                f"{same}{diff}.\n\n"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
