"""Per-kernel GPU time of one bench/steady_state.py case: the captured pair (graphs
off) against torch.compile, in one process, to see where a steady-state difference
goes (which kernels, how long each).

    python bench/profile_kernels.py --case gpt [--calls 20]

Prints, per mechanism, the kernel time per call (sum of CUDA kernel self time over
``--calls`` calls, from ``torch.profiler``, divided by the calls) and the ten longest
kernels. CUDA only. Used for the GPT-block note in bench/results/steady_state_cuda.md.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import steady_state  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="gpt", choices=("decode", "tinylm", "gpt", "bert"))
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/profile_kernels.py: needs a CUDA device")
    model, fn, args = steady_state.make_case(a.case, "cuda")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        pair = steady_state.load_pair(model, fn, args, Path(tmp))
        compiled = torch.compile(fn)
        for name, call in (("pair", lambda: pair(model, *args)), ("torch.compile", lambda: compiled(model, *args))):
            for _ in range(10):  # warm up (and compile)
                call()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(a.calls):
                    call()
                torch.cuda.synchronize()
            events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
            per_call = sum(e.self_device_time_total for e in events) / a.calls / 1000
            launches = sum(e.count for e in events) / a.calls
            print(f"== {name}: kernel time per call {per_call:.4f} ms, kernels per call {launches:.0f}")
            for e in sorted(events, key=lambda e: -e.self_device_time_total)[:10]:
                print(f"  {e.self_device_time_total / a.calls / 1000:8.4f} ms x{e.count // a.calls:3d}  {e.key[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
