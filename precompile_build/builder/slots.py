"""Which captures may run at once: the `jobs` setting turned into device slots.

A CUDA capture always has a GPU to itself (two captures on one GPU would distort
each other's autotuning benchmarks and memory); CPU captures share the cores,
each Inductor compile already using several threads. ``jobs = "auto"``: one CUDA
capture per GPU, ``os.cpu_count() // 2`` (at least 1) CPU captures, no cap on the
sum. ``jobs = N``: at most N captures in all (and at most N on the CPU).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Optional


def cpu_limit(jobs: Optional[int]) -> int:
    """CPU captures at once: ``jobs``, or ``os.cpu_count() // 2`` (>= 1) for auto."""
    return jobs if jobs is not None else max(1, (os.cpu_count() or 2) // 2)


class Slots:
    """A thread-safe pool of capture slots.

    Args:
        jobs: the `jobs` setting (None: auto).
        gpus: ``CUDA_VISIBLE_DEVICES`` values of the usable GPUs, one slot each;
            empty: CUDA captures run one at a time with the inherited selection.
    """

    def __init__(self, jobs: Optional[int], gpus: Sequence[str]):
        self._cond = threading.Condition()
        self._total = jobs if jobs is not None else 1 << 30
        self._cpu = cpu_limit(jobs)
        self._gpus: list[Optional[str]] = list(gpus) or [None]

    def acquire(
        self, device: str, abort: threading.Event, count: int = 1
    ) -> tuple[bool, Optional[str]]:
        """Wait for a slot for a capture on ``device`` (``"cpu"`` or ``"cuda"``).

        Args:
            count: GPUs the capture needs (the ranks of a world-size target, one GPU
                each; a CPU capture takes one slot whatever its ranks).
        Returns:
            ``(True, gpu)`` with the GPU to use (None: cpu, or no GPU list; several:
            ``"0,1"``, as CUDA_VISIBLE_DEVICES), or ``(False, None)`` when ``abort``
            was set while waiting.
        """
        with self._cond:
            while not abort.is_set():
                need = 1 if device == "cpu" or self._gpus == [None] else count
                free = self._cpu > 0 if device == "cpu" else len(self._gpus) >= need
                if self._total > 0 and free:
                    self._total -= 1
                    if device == "cpu":
                        self._cpu -= 1
                        return True, None
                    taken, self._gpus = self._gpus[:need], self._gpus[need:]
                    return True, taken[0] if need == 1 else ",".join(map(str, taken))
                self._cond.wait(timeout=0.5)
        return False, None

    def release(self, device: str, gpu: Optional[str]) -> None:
        """Give back a slot taken by :meth:`acquire`."""
        with self._cond:
            self._total += 1
            if device == "cpu":
                self._cpu += 1
            else:
                self._gpus.extend(gpu.split(",") if gpu is not None and "," in gpu else [gpu])
                self._gpus.sort(key=lambda g: (g is None, len(str(g)), str(g)))
            self._cond.notify_all()
