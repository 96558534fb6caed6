"""What serialising CUDA graph replays costs a server: one loaded function called from
1, 2 and 4 threads at once (the decode case of bench/steady_state.py: 4 blocks, d=512,
batch 1 x 1 token, fp32), graphs on and off, each thread with its own inputs, on the
default stream and with a CUDA stream per thread; eager in the same threads alongside.

Reported per row: calls per second over all threads (median of ``--rounds`` rounds of
``--calls`` calls per thread) and the ratio to the same mechanism with one thread;
every thread's last output is compared with eager's for its input.

    PYTHONPATH=$PWD:$PWD/runtime python bench/concurrent_graphs.py --out bench/results/concurrent_graphs_cuda.md
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from steady_state import forward, load_pair, make_case


def run(fn, xs, streams):
    """Seconds for every thread to make its calls; each thread's last output."""
    n = len(xs)
    outs, errors = [None] * n, []
    barrier = threading.Barrier(n + 1)

    def serve(i):
        try:
            ctx = torch.cuda.stream(torch.cuda.Stream()) if streams else torch.cuda.device(0)
            with ctx, torch.no_grad():
                barrier.wait()
                for x in xs[i]:
                    outs[i] = fn(x)
                torch.cuda.current_stream().synchronize()
        except Exception as e:  # reported, not hidden
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    torch.cuda.synchronize()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - t0, outs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.calls < 1 or a.rounds < 1:
        ap.error("--calls and --rounds take a positive number")
    model, _, (x0,) = make_case("decode", "cuda")
    rows = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        plain = load_pair(model, forward, (x0,), Path(tmp))
        graphed = plain.with_cuda_graphs()
        mechs = {
            "eager": lambda x: model(x),
            "pair, graphs off": lambda x: plain(model, x),
            "pair, graphs on": lambda x: graphed(model, x),
        }
        for streams in (False, True):
            for threads in (1, 2, 4):
                xs = [[torch.randn_like(x0) for _ in range(a.calls)] for _ in range(threads)]
                want = [model(row[-1]) for row in xs]
                for name, fn in mechs.items():
                    run(fn, [row[:5] for row in xs], streams)  # warm-up (graphs: record)
                    secs, worst = [], 0.0
                    for _ in range(a.rounds):
                        s, outs = run(fn, xs, streams)
                        secs.append(s)
                        worst = max(
                            worst, max(float((o - w).abs().max()) for o, w in zip(outs, want))
                        )
                    rate = threads * a.calls / statistics.median(secs)
                    rows.append((name, threads, streams, rate, worst))
                    print(
                        f"{name}, {threads} thread(s), {'stream per thread' if streams else 'one stream'}: "
                        f"{rate:,.0f} calls/s, max |diff| {worst:.2e}",
                        flush=True,
                    )
        recorded = graphed._graphs.recorded
    one = {(n, s): r for n, t, s, r, _ in rows if t == 1}
    lines = [
        "# CUDA graphs under concurrent calls (bench/concurrent_graphs.py)",
        "",
        f"Decode case (4 blocks, d=512, 1 x 1 token, fp32), {torch.cuda.get_device_name()}, torch "
        f"{torch.__version__}; {a.calls} calls per thread, median of {a.rounds} rounds; graphs "
        f"recorded: {recorded}. Replays of one loaded function are serialised by a lock.",
        "",
        "| mechanism | threads | streams | calls/s (all threads) | vs 1 thread | max abs diff vs eager |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, t, s, r, worst in rows:
        lines.append(
            f"| {name} | {t} | {'per thread' if s else 'one'} | {r:,.0f} | "
            f"{r / one[(name, s)]:.2f}x | {worst:.1e} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
