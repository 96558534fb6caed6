"""Per-call cost of the serving driver alone, on CPU: ns per call with no kernels.

A pair is captured (engine ``eager``: the driver is the same code as the frozen
engine's) for a stack of N transformer-like blocks (LayerNorm, 4 Linear, Dropout,
GELU: 7 submodules and 12 tensors per block), then its kernel call is replaced by
one that returns a ready output tensor: what is timed is the driver (argument walk,
model and input checks, ambient checks, grad mode switch, output rebuild) and
nothing else. N = 4 and 48 show whether the cost grows with the model.

With ``--baseline REV`` the same pairs are also served by the driver of git
revision REV (the source half's driver block swapped), interleaved in the same
process: the ratio is the change.

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
DRIVER = "precompile_build/engines/_driver.py"
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


def _source(layers: int, tmp: Path) -> str:
    model = nn.Sequential(*[Block() for _ in range(layers)]).eval()
    x = torch.randn(1, 16)
    paths = {"artifact_path": tmp / f"l{layers}.py", "cache_path": tmp / f"l{layers}.cache"}
    with precompile_build.capture(forward, engine="eager", **paths) as f:
        f(model, x)
    return paths["artifact_path"].read_text()


def _serve(source: str, driver: str | None, layers: int):
    if driver is not None:  # swap the driver block for another revision's
        start = source.index("# ---- driver: the calling convention")
        source = source[:start] + driver
    ns: dict = {"__name__": f"pair_{layers}"}
    exec(compile(source, "pair.py", "exec"), ns)
    fn = ns["load"](None)
    model = nn.Sequential(*[Block() for _ in range(layers)]).eval()
    x = torch.randn(1, 16)
    out = [fn(model, x)]  # the real result once; then the kernels are replaced
    fn._run = lambda flat: out
    return fn, model, x


def _time(fn, model, x, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn(model, x)
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 48])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", help="git revision whose driver is measured beside this one")
    ap.add_argument("--out", help="write a markdown table here")
    a = ap.parse_args()
    baseline = None
    if a.baseline:
        baseline = subprocess.run(["git", "show", f"{a.baseline}:{DRIVER}"], cwd=REPO, check=True,
                                  capture_output=True, text=True).stdout
    cases = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.layers:
            src = _source(n, Path(tmp))
            cases[("this", n)] = _serve(src, None, n)
            if baseline:
                cases[(a.baseline, n)] = _serve(src, baseline, n)
    times = {k: [] for k in cases}
    for fn, m, x in cases.values():  # warm
        _time(fn, m, x, 200)
    for _ in range(a.rounds):  # interleaved rounds
        for k, (fn, m, x) in cases.items():
            times[k].append(_time(fn, m, x, a.calls))
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        "# Driver overhead per call (CPU, no kernels)",
        "",
        f"`python bench/driver_overhead.py {' '.join(sys.argv[1:])}` "
        f"- torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs (shared), median of {a.rounds} interleaved rounds x {a.calls} calls.",
        "Each block: 7 submodules, 12 parameters; input 1x16; the kernel call returns a ready tensor.",
        "",
        "| driver | " + " | ".join(f"{n} layers (ns/call)" for n in a.layers) + " | 48/4 |" if a.layers == [4, 48]
        else "| driver | " + " | ".join(f"{n} layers (ns/call)" for n in a.layers) + " |",
        "|---|" + "---|" * (len(a.layers) + (1 if a.layers == [4, 48] else 0)),
    ]
    for who in ["this"] + ([a.baseline] if baseline else []):
        row = [f"{med[(who, n)]:.0f}" for n in a.layers]
        if a.layers == [4, 48]:
            row.append(f"{med[(who, 48)] / med[(who, 4)]:.2f}")
        lines.append(f"| {'this branch' if who == 'this' else 'baseline ' + who} | " + " | ".join(row) + " |")
    if baseline:
        lines += ["", "Speed-up over the baseline: " + ", ".join(
            f"{n} layers {med[(a.baseline, n)] / med[('this', n)]:.1f}x" for n in a.layers)]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
