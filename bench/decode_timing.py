"""Timing pieces of bench/decode.py's loops: the stop flags a lagged loop reads, the
kernel floor of a step, and the per-step breakdown of a graphs path (CUDA)."""

from __future__ import annotations

import time


def sync(device: str) -> None:
    """Wait for the GPU (``device`` "cuda"); nothing on CPU."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class StopFlags:
    """The ``_lagged`` loops' stop flags, each read one step after it was computed.

    On CUDA a flag is copied to pinned host memory without waiting, and read after
    waiting for that copy only (a CUDA event): ``bool(flag)`` of the previous step's
    flag would wait for the step just launched too (a device-to-host copy waits for
    all the work queued before it), and the GPU would idle while the host prepares
    the next call. On CPU the previous flag is read as it is."""

    def __init__(self, device: str):
        import torch

        self.cuda = device == "cuda"
        if self.cuda:
            self.host = torch.zeros(2, dtype=torch.bool, pin_memory=True)
            self.copied = [torch.cuda.Event(), torch.cuda.Event()]
        self.steps = 0
        self.previous = None

    def lagged(self, flag) -> bool:
        """Keep this step's ``flag`` (a 0-dim bool tensor); returns the previous step's
        (False at the first step)."""
        first = self.steps == 0
        slot, self.steps = self.steps % 2, self.steps + 1
        if not self.cuda:
            previous, self.previous = self.previous, flag
            return not first and bool(previous)
        self.host[slot].copy_(flag, non_blocking=True)
        self.copied[slot].record()
        if first:
            return False
        self.copied[1 - slot].synchronize()
        return bool(self.host[1 - slot])


def kernel_floor(one_step, device, n=20) -> float:
    """GPU time of one decode step's kernels (ms): torch.profiler over ``n`` calls of
    ``one_step()`` (a step of the frozen kernels without graphs, its position advanced:
    MAX_CACHE leaves room for them)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):  # warm
        one_step()
    sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            one_step()
        sync(device)
    total_us = sum(e.device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
    return total_us / n / 1e3


def breakdown(call, after, n=20, lagged=False) -> dict:
    """Median per-step times of the graphs path (us; GPU replay in ms): where the host
    time goes, measured by wrapping CUDAGraph.replay for ``n`` steps of the loop: the
    loaded function's ``call()``, then the loop's ``after(result) -> stop flag`` and the
    flag's read (``lagged``: each step's read after the next step is launched)."""
    import statistics

    import torch

    orig = torch.cuda.CUDAGraph.replay
    marks: list = []

    def replay(self):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        marks.append(time.perf_counter())
        start.record()
        orig(self)
        end.record()
        marks.append(time.perf_counter())
        marks.append((start, end))

    rows = []
    torch.cuda.CUDAGraph.replay = replay
    flags = StopFlags("cuda")
    try:
        for _ in range(n):
            marks.clear()
            t0 = time.perf_counter()
            result = call()
            t1 = time.perf_counter()
            flag = after(result)
            flags.lagged(flag) if lagged else bool(flag)
            t2 = time.perf_counter()
            if len(marks) != 3:  # no replay (a plain run): not a graph step
                continue
            r0, r1, events = marks
            rows.append(
                {
                    "driver_before_replay_us": (r0 - t0) * 1e6,
                    "replay_call_us": (r1 - r0) * 1e6,
                    "driver_after_replay_us": (t1 - r1) * 1e6,
                    "loop_and_wait_us": (t2 - t1) * 1e6,
                    "replay_gpu_ms": events,
                    "step_ms": (t2 - t0) * 1e3,
                }
            )
    finally:
        torch.cuda.CUDAGraph.replay = orig
    if not rows:
        return {"steps": 0}
    # a lagged loop has not waited for its last replays: their events are read after the GPU is done
    torch.cuda.synchronize()
    for r in rows:
        start, end = r["replay_gpu_ms"]
        r["replay_gpu_ms"] = start.elapsed_time(end)
    return {"steps": len(rows), **{k: statistics.median(r[k] for r in rows) for k in rows[0]}}
