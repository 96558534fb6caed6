"""Per-kernel GPU time of one bench/steady_state.py case: the captured pair (graphs
off) and torch.compile, to see where a steady-state difference goes (which kernels,
how long each), and optionally what Inductor's autotuner measured for each config.

    python bench/profile_kernels.py --case gpt [--calls 20]
    python bench/profile_kernels.py --case gpt --mechanisms pair --print-autotuning

Prints, per mechanism, the kernel time per call (sum of CUDA kernel self time over
``--calls`` calls, from ``torch.profiler``, divided by the calls) and the ten longest
kernels. ``--print-autotuning`` also prints one line per autotuning (kernel name,
each config's time as timed, ms); run one mechanism per fresh process then, with
``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` pointing at empty folders
(autotuning results are kept per process and saved configs are reused). CUDA only.
Behind the GPT-block notes of bench/results/steady_state_cuda.md (session 4: the
GELU kernel; session 5: without the capture's fix the first config timed of that
in-place kernel read 0.634 ms against 0.12 ms for the second).
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
        print(
            f"autotune {name}: "
            + ", ".join(f"{{{launcher.config}}} {t:.4f} ms" for launcher, t in result.items()),
            flush=True,
        )
        return result

    th.CachingAutotuner.benchmark_all_configs = benchmark_all_configs


def kernel_times(call, calls: int = 20, top: int = 10) -> dict:
    """Per-kernel GPU time of ``call()`` (CUDA; warmed up by the caller), from
    ``torch.profiler`` over ``calls`` synchronized calls: ``{"kernel_ms": kernel time
    per call (ms, the sum of CUDA kernels' self time / calls), "kernels": kernel launches
    per call, "top": [[ms per call, launches per call, name], ...] of the ``top``
    longest}``. A CUDA graph's replayed kernels appear where CUPTI traces graph nodes
    (not yet checked on the GPU host): a graph mechanism with 0 kernels was not traced."""
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    longest = sorted(events, key=lambda e: -e.self_device_time_total)[:top]
    return {
        "kernel_ms": sum(e.self_device_time_total for e in events) / calls / 1000,
        "kernels": sum(e.count for e in events) / calls,
        "top": [
            [e.self_device_time_total / calls / 1000, e.count / calls, e.key[:110]] for e in longest
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="gpt", choices=("decode", "tinylm", "gpt", "bert"))
    ap.add_argument(
        "--mechanisms",
        default="pair,torch.compile",
        help="comma-separated: pair, torch.compile (in this order)",
    )
    ap.add_argument("--print-autotuning", action="store_true")
    ap.add_argument("--calls", type=int, default=20)
    a = ap.parse_args()
    wanted = [m.strip() for m in a.mechanisms.split(",") if m.strip()]
    unknown = sorted(set(wanted) - {"pair", "torch.compile"})
    if unknown or not wanted:
        raise SystemExit(
            f"bench/profile_kernels.py: --mechanisms takes pair and/or torch.compile, not {a.mechanisms!r}"
        )
    if not torch.cuda.is_available():
        raise SystemExit("bench/profile_kernels.py: needs a CUDA device")
    if a.print_autotuning:
        _print_autotuning()
    model, fn, args = steady_state.make_case(a.case, "cuda")
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        calls = {}
        for m in wanted:  # built lazily in this order: the first one autotunes first
            if m == "pair":
                pair = steady_state.load_pair(model, fn, args, Path(tmp))
                calls[m] = lambda pair=pair: pair(model, *args)
            else:
                compiled = torch.compile(fn)
                calls[m] = lambda compiled=compiled: compiled(model, *args)
        for name, call in calls.items():
            for _ in range(10):  # warm up (and compile)
                call()
            k = kernel_times(call, a.calls)
            print(
                f"== {name}: kernel time per call {k['kernel_ms']:.4f} ms, kernels per call {k['kernels']:.0f}"
            )
            for ms, n, key in k["top"]:
                print(f"  {ms:8.4f} ms x{n:3.0f}  {key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
