"""Where a cold capture's seconds go, against torch.compile's cold compile of the same
call (issue 24, capture seconds; bench/results/gpu_check_h200.md, sessions 11-12).

    python bench/capture_profile.py --mode capture --size 1b            # on the GPU
    python bench/capture_profile.py --mode compile --size 1b
    python bench/capture_profile.py --mode capture --size 1b --sample   # + a stack sample
    python bench/capture_profile.py --mode capture --size 1b --inductor triton.autotune_at_compile_time=1
    LLAMA_BENCH_DEVICE=cpu LLAMA_BENCH_DTYPE=float32 python bench/capture_profile.py --size tiny

One process per run (run each mode in its own, interleaved, on an idle host): the
Llama of bench/scale_llama.py (``--size``, random weights), the target ``forward(model,
ids) -> logits``, with fresh Inductor and Triton caches (a temp dir) unless
TORCHINDUCTOR_CACHE_DIR is set. Prints one JSON line ``PROFILE {...}``:

- ``total_s``: from the model built to the first synchronized result (seconds);
- ``steps_s``: the capture's own steps (the frozen engine's trace_call, run_real_call,
  standalone_compile, validate), inclusive seconds; empty for ``compile``;
- ``compile_times_s``: ``torch._dynamo.utils.compile_times`` (seconds per timed
  function, summed, 0.01 s and up: ``create_aot_dispatcher_function``, ``compile_fx_inner``, ...);
- ``kernel_definitions``: Inductor's ``async_compile_cache_miss`` counter (each Triton
  kernel definition, counted before the in-memory cache; a tuning script defines its
  kernels again).

``--sample``: the main thread's stack every 2 ms (a thread reading
``sys._current_frames``; cProfile on Python 3.12 gave broken cumulative times), then
per phase (capture: trace, compile, real, validate; compile: dynamo, compile) the
functions holding the most samples, inclusive and own, in percent of the phase's
samples. ``--inductor KEY=VALUE`` (repeatable): an Inductor setting for the run
(``options={"inductor": ...}`` of the capture, ``torch.compile(options=...)``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parent / "runtime")]

# (phase, a function whose frame on the stack puts a sample in it; the last found wins)
PHASES = {
    "capture": [
        ("trace", "trace_call"),
        ("compile", "standalone_compile"),
        ("real", "run_real_call"),
        ("validate", "validate"),
    ],
    "compile": [("dynamo", "_compile"), ("compile", "call_user_compiler")],
}


def _inductor_setting(text: str) -> tuple[str, object]:
    """``KEY=VALUE`` -> (key, the value read as JSON: ``1``, ``false``, ``"name"``)."""
    key, _, value = text.partition("=")
    try:
        return key, json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'{text!r}: give KEY=VALUE with a JSON value (1, false, "x")'
        ) from None


def _timed(totals: dict, name: str, fn):
    """``fn`` adding its outermost calls' seconds to ``totals[name]``."""
    depth = [0]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        depth[0] += 1
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            depth[0] -= 1
            if not depth[0]:
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - t

    return wrapper


class StackSampler:
    """The main thread's stack (file, function, first line) every ``interval`` seconds."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.samples, self._stop = interval, [], threading.Event()
        self._main = threading.get_ident()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            frame, stack = sys._current_frames().get(self._main), []
            while frame is not None:
                code = frame.f_code
                stack.append(
                    (os.path.basename(code.co_filename), code.co_name, code.co_firstlineno)
                )
                frame = frame.f_back
            self.samples.append(stack)
            time.sleep(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def report(self, phases, top: int = 25) -> list[str]:
        """Per phase, the ``top`` functions by inclusive and by own samples (percent)."""
        grouped = collections.defaultdict(list)
        for stack in self.samples:
            names = {s[1] for s in stack}
            grouped[next((p for p, fn in reversed(phases) if fn in names), "other")].append(stack)
        lines = []
        for phase, stacks in grouped.items():
            lines.append(
                f"== phase {phase}: {len(stacks)} samples ({len(stacks) * self.interval:.1f} s at least)"
            )
            inclusive = collections.Counter(s for stack in stacks for s in set(stack))
            own = collections.Counter(stack[0] for stack in stacks if stack)
            for title, counter in (("inclusive", inclusive), ("own", own)):
                lines.append(f"-- {title}")
                lines += [
                    f"{100 * n / len(stacks):5.1f}% {f}:{line}({name})"
                    for (f, name, line), n in counter.most_common(top)
                ]
        return lines


def main() -> None:
    import scale_llama  # (stdlib only at import: torch comes after the cache dirs are set)

    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mode", choices=sorted(PHASES), default="capture")
    ap.add_argument(
        "--size", default="1b", choices=list(scale_llama.SIZES), help="bench/scale_llama.py's SIZES"
    )
    ap.add_argument(
        "--sample", action="store_true", help="also a 2 ms stack sample of the main thread"
    )
    ap.add_argument(
        "--inductor", action="append", default=[], type=_inductor_setting, metavar="KEY=VALUE"
    )
    a = ap.parse_args()
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:  # a cold run: before torch is imported
        cold = tempfile.mkdtemp(prefix="capture-profile-")
        os.environ.update(
            TORCHINDUCTOR_CACHE_DIR=f"{cold}/inductor", TRITON_CACHE_DIR=f"{cold}/triton"
        )

    import torch
    from torch._dynamo.utils import compile_times, counters

    settings = dict(a.inductor)
    steps: dict = {}
    if a.mode == "capture":
        import precompile_build
        from precompile_build.engines import frozen

        for name in (
            "trace_call",
            "run_real_call",
            "validate",
        ):  # frozen.py looks them up when it runs
            setattr(frozen, name, _timed(steps, name, getattr(frozen, name)))
        torch._inductor.standalone_compile = _timed(
            steps, "standalone_compile", torch._inductor.standalone_compile
        )
    model, ids = scale_llama.build(a.size)
    scale_llama._sync()
    sampler = StackSampler()
    with (
        tempfile.TemporaryDirectory() as out,
        torch.no_grad(),
        sampler if a.sample else contextlib.nullcontext(),
    ):
        t0 = time.perf_counter()
        if a.mode == "capture":
            with precompile_build.capture(
                scale_llama.forward,
                engine="frozen",
                target="t",
                artifact_path=f"{out}/t.py",
                cache_path=f"{out}/t.cache",
                options={"inductor": settings} if settings else None,
            ) as f:
                f(model, ids)
        else:
            torch.compile(scale_llama.forward, options=settings or None)(model, ids)
        scale_llama._sync()
        total = time.perf_counter() - t0
    names, seconds = compile_times(repr="csv", aggregate=True)
    timed = dict(zip(names, map(float, seconds)))
    print(
        "PROFILE "
        + json.dumps(
            {
                "mode": a.mode,
                "size": a.size,
                "device": scale_llama._device(),
                "torch": torch.__version__,
                "inductor": settings,
                "total_s": round(total, 3),
                "steps_s": {k: round(v, 3) for k, v in steps.items()},
                "compile_times_s": {
                    k: round(v, 3)
                    for k, v in sorted(timed.items(), key=lambda kv: -kv[1])
                    if v >= 0.01
                },
                "kernel_definitions": counters["inductor"].get("async_compile_cache_miss", 0),
            }
        ),
        flush=True,
    )
    if a.sample:
        print("\n".join(sampler.report(PHASES[a.mode])))


if __name__ == "__main__":
    main()
