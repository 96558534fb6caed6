"""The time Inductor's autotuner gave each candidate config of each Triton kernel, when
one bench/steady_state.py case is captured (the pair) or compiled by torch.compile, in
this (fresh) process, and the kernel time per call that followed.

    python bench/autotune_configs.py --case gpt --mechanism pair
    python bench/autotune_configs.py --case gpt --mechanism torch.compile

Prints one line per autotuning (kernel name, {config: ms as timed}), then the kernel
time per call over ``--calls`` calls (``torch.profiler``, CUDA kernels' self time) and
the five longest kernels. Run each mechanism in its own process (autotuning results are
kept per process; ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` pointing at
empty folders keep saved configs out). CUDA only. Behind the GELU note of
bench/results/steady_state_cuda.md (session 5): without the capture's fix the first
config timed of an in-place kernel read 0.634 ms against 0.12 ms for the second.
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


def _print_autotuning():
    """Wrap CachingAutotuner.benchmark_all_configs to print what it measured."""
    from torch._inductor.runtime import triton_heuristics as th

    timed = th.CachingAutotuner.benchmark_all_configs

    def benchmark_all_configs(self, *args, **kwargs):
        result = timed(self, *args, **kwargs)
        name = getattr(self.fn, "__name__", "?")
        print(f"autotune {name}: " + ", ".join(f"{{{l.config}}} {t:.4f} ms" for l, t in result.items()),
              flush=True)
        return result

    th.CachingAutotuner.benchmark_all_configs = benchmark_all_configs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="gpt", choices=("decode", "tinylm", "gpt", "bert"))
    ap.add_argument("--mechanism", default="pair", choices=("pair", "torch.compile"))
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/autotune_configs.py: needs a CUDA device")
    _print_autotuning()
    model, fn, args = steady_state.make_case(a.case, "cuda")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        if a.mechanism == "pair":
            loaded = steady_state.load_pair(model, fn, args, Path(tmp))
            call = lambda: loaded(model, *args)  # noqa: E731
        else:
            compiled = torch.compile(fn)
            call = lambda: compiled(model, *args)  # noqa: E731
        for _ in range(10):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.calls):
                call()
            torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    per_call = sum(e.self_device_time_total for e in events) / a.calls / 1000
    print(f"== {a.mechanism}: kernel time per call {per_call:.4f} ms")
    for e in sorted(events, key=lambda e: -e.self_device_time_total)[:5]:
        print(f"  {e.self_device_time_total / a.calls / 1000:8.4f} ms x{e.count // a.calls:3d}  {e.key[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
