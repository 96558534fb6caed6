"""Where the host time of one CUDA-graph decode step goes.

The decode step of bench/decode.py's model (``step(model, ids, StaticCache, pos)``,
a Llama of about 1B parameters in bf16 on CUDA) is captured with the frozen engine and
``cuda_graphs`` in this process, loaded from the pair, warmed up until it replays,
then called ``--steps`` times in a loop that reads one stop flag per step (as
bench/decode.py's loops and transformers' ``generate`` do). Printed (and written to
``--out`` as JSON):

- whether the argument walk took the fast path (``_fast_leaves`` not None);
- per-step medians (us) of each piece of the loaded function's host work, timed by
  wrapping the source half's functions (a wrapper adds ~0.2 us): the checks, the graph
  lookup, the input copies, ``CUDAGraph.replay``, the output copies, the result;
- the top functions by own time under cProfile over the same loop;
- CUDA: a torch.profiler timeline of ``--steps`` steps of the loop that reads each
  step's stop flag one step later (bench/decode.py's ``_lagged`` paths): GPU busy and
  idle time per step, the kernels per step, and the kernels launched outside the graph
  (the loop's own and the call's copies) with their GPU time.

``--inductor KEY=VALUE`` passes an Inductor setting to the capture (e.g.
``combo_kernels=1``: fewer, horizontally fused kernels: fewer gaps between them).

    PYTHONPATH=$PWD:$PWD/runtime python bench/decode_host.py --layers 16 --out /tmp/host.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

# the pieces of the loaded function timed per step, by name in the source half
PIECES = (
    "_check_ambient",
    "_flatten_call",
    "_fast_leaves",
    "_cached_params",
    "_check_inputs",
    "_constants",
    "_check_no_aliases",
    "_rebuild",
)
GRAPH_PIECES = ("_call", "_find", "_replay")


def _module(layers: int, tmp: Path, device: str):
    import decode

    cfg = dict(decode.SIZES[device], num_hidden_layers=layers)
    (tmp / "llmdecode.py").write_text(decode.MODULE.format(config=cfg, max_cache=256))
    sys.path.insert(0, str(tmp))
    import llmdecode

    return llmdecode


def _load(src: Path, cache: Path):
    from precompile_runtime.envelope import loads

    env = loads(cache.read_bytes())
    kdir = src.parent / "kernels"
    for name, blob in env.blobs.items():
        (kdir / name).parent.mkdir(parents=True, exist_ok=True)
        (kdir / name).write_bytes(blob)
    ns: dict = {"__name__": "pair"}
    exec(compile(src.read_text(), str(src), "exec"), ns)
    return ns["load"](str(kdir)), ns


def _timed(ns: dict, times: dict):
    """Wrap the source half's PIECES (and the graphs' methods) to add their seconds to ``times``."""

    def wrap(fn, name):
        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times.setdefault(name, []).append(time.perf_counter() - t0)

        return timed

    for name in PIECES:
        if name in ns:
            ns[name] = wrap(ns[name], name)
    cls = ns.get("_CudaGraphs")  # (CUDA pairs only)
    for name in GRAPH_PIECES if cls else ():
        setattr(cls, name, wrap(getattr(cls, name), "graphs." + name))
    import torch

    orig = torch.cuda.CUDAGraph.replay
    torch.cuda.CUDAGraph.replay = wrap(orig, "CUDAGraph.replay")
    return orig


def _lagged_timeline(decode, model, cache, token, pos, n) -> dict:
    """GPU busy/idle per step of the lagged loop (torch.profiler), and its kernels."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    def run(k, token):
        stop = None
        pos.zero_()
        cache.reset()
        for _ in range(k):
            logits = decode(model, token[:, None], cache, pos)
            token = logits.argmax(-1)
            pos.add_(1)
            flag = (token == -1).all()
            if stop is not None and bool(stop):
                break
            stop = flag
        torch.cuda.synchronize()
        return token

    token = run(5, token)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        run(n, token)
        wall = time.perf_counter() - t0
    spans = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    busy, end = 0.0, None
    for s0, s1, _ in spans:
        if end is None or s0 >= end:
            busy += s1 - s0
            end = s1
        elif s1 > end:
            busy += s1 - end
            end = s1
    total = spans[-1][1] - spans[0][0] if spans else 0.0
    names: dict = {}
    for s0, s1, name in spans:
        c, t = names.get(name, (0, 0.0))
        names[name] = (c + 1, t + s1 - s0)
    rare = {
        k[:90]: {"per_step": round(c / n, 2), "us": round(t / c, 2)}
        for k, (c, t) in names.items()
        if c <= 2 * n
    }
    return {
        "steps": n,
        "wall_ms_per_step": wall / n * 1e3,
        "gpu_span_ms_per_step": total / n / 1e3,
        "gpu_busy_ms_per_step": busy / n / 1e3,
        "kernels_per_step": len(spans) / n,
        "kernel_sum_ms_per_step": sum(s1 - s0 for s0, s1, _ in spans) / n / 1e3,
        "few_per_step": dict(sorted(rare.items(), key=lambda kv: -kv[1]["us"])[:25]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--steps", type=int, default=100, help="per loop (the cache holds 256 positions)"
    )
    ap.add_argument(
        "--inductor", action="append", default=[], help="KEY=VALUE (true/false, an int, else text)"
    )
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (no graphs)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()

    import torch

    import precompile_build

    tmp = Path(tempfile.mkdtemp(prefix="decode_host_"))
    lm = _module(a.layers, tmp, a.device)
    dev = a.device
    model = lm.build(dev)
    ids = lm.prompt(a.batch, 1, dev).contiguous()
    src, cache_file = tmp / "decode.py", tmp / "decode.cache"
    options: dict = {"cuda_graphs": dev == "cuda"}
    if a.inductor:
        import decode

        options["inductor"] = dict(map(decode.inductor_setting, a.inductor))
    t0 = time.perf_counter()
    with (
        torch.no_grad(),
        precompile_build.capture(
            lm.step,
            artifact_path=src,
            cache_path=cache_file,
            target="decode",
            engine="frozen",
            options=options,
        ) as f,
    ):
        f(model, ids, lm.static_cache(model, a.batch, dev), torch.tensor([0], device=dev))
    capture_s = time.perf_counter() - t0
    decode, ns = _load(src, cache_file)
    cache = lm.static_cache(model, a.batch, dev)
    pos = torch.tensor([0], device=dev)
    token = ids[:, 0]
    out: dict = {
        "layers": a.layers,
        "batch": a.batch,
        "capture_s": round(capture_s, 1),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name() if dev == "cuda" else None,
    }

    def loop(n):
        nonlocal token
        pos.zero_()  # (the cache holds 256 positions: from the start again)
        cache.reset()
        for _ in range(n):
            logits = decode(model, token[:, None], cache, pos)
            token = logits.argmax(-1)
            pos.add_(1)
            bool((token == -1).all())

    with torch.no_grad():
        loop(8)  # warm-up, timed run, recording, replays
        out["graphs_recorded"] = decode._graphs.recorded if decode._graphs else None
        out["fast_walk"] = ns["_fast_leaves"]((model, token[:, None], cache, pos), {}) is not None
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loop(a.steps)
        out["step_us"] = (time.perf_counter() - t0) / a.steps * 1e6
        times: dict = {}
        orig = _timed(ns, times)
        try:
            loop(a.steps)
        finally:
            torch.cuda.CUDAGraph.replay = orig
        out["pieces_us"] = {k: round(statistics.median(v) * 1e6, 1) for k, v in times.items()}
        out["calls_per_step"] = {k: len(v) / a.steps for k, v in times.items()}
        prof = cProfile.Profile()
        prof.enable()
        loop(a.steps)
        prof.disable()
        if dev == "cuda":
            out["lagged"] = _lagged_timeline(decode, model, cache, token, pos, min(a.steps, 50))
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    out["cprofile"] = s.getvalue().splitlines()[:60]
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
