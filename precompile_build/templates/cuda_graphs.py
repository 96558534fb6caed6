# ---- CUDA graphs of the frozen kernels ----------------------------------------------
# Appended after the driver (driver.py) in the source half of frozen CUDA targets only
# (codegen.py); reads the driver's _META, _RUNS_BACKWARD and CallError.
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from .source_names import _DYN, _META, _RUNS_BACKWARD, CallError
# end stand-ins

import threading as _threading
import time as _time
import warnings as _warnings
import weakref as _weakref

try:
    from precompile_runtime.errors import CudaGraphWarning
except ImportError:  # pragma: no cover - an older precompile-runtime, or none

    class CudaGraphWarning(UserWarning):  # type: ignore[no-redef]
        """A CUDA graph could not be recorded; that call and its size run without one."""


_DATA_PTRS_EQUAL = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
_TIME_NEXT = "time the next call"  # a warm key whose next call is the timed plain run


def _out_of_memory(exc):
    """Whether a failed recording ran out of GPU memory: torch's OutOfMemoryError, or
    an error that says so, where capture_end's own error replaced it."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower():
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


class _Graph:
    __slots__ = ("key", "graph", "static_inputs", "outputs", "ptrs", "refs")
    key: tuple
    graph: object
    static_inputs: list
    outputs: object
    ptrs: list
    refs: list


class _CudaGraphs:
    """CUDA graphs of the frozen kernels, one per input sizes and tensor addresses.

    A graph reads and writes fixed addresses. Parameters, buffers, the trace-made
    constants and user inputs the code writes in place (KV caches, running statistics)
    are read in place, as torch/_inductor/cudagraph_trees.py does with static inputs:
    their addresses are part of the graph's key, compared before each replay, so a
    swapped checkpoint, a moved model, another model instance or another cache gets a
    graph of its own and nothing is replayed with stale pointers. The other user
    inputs are copied into the graph's static buffers; outputs are copied out
    (copy_outputs=False hands out the graph's own tensors, overwritten by the next
    replay of that graph).

    Each size key (device, the sizes of the user inputs copied, of all user inputs
    with dynamic dims) is recorded at its third call: the first
    warms up (kernels loaded, allocator settled), the second is a plain run timed on
    the CPU and the GPU. Where the GPU took more than COMPUTE_BOUND times the CPU's
    time the call is compute-bound: a graph removes launch work only, so that size
    runs plainly (compute_bound="graph" records every size, at its second call). A
    size already recorded records new addresses at once. A recording that ran out of
    GPU memory is undone (see _recover), that call runs plainly (raising the
    OutOfMemoryError where that fails too) and the size records at its next call; an
    out-of-memory error in a plain run or a replay leaves nothing to undo: the next
    call is served as if it had not happened. Any other recording that fails is undone
    and its size runs plainly from then on, with one CudaGraphWarning; so does a size recorded over MAX_RECORDINGS x max_graphs times
    (its tensors move on every call: no graph would be replayed).

    Bounded: at most max_graphs graphs, least recently used dropped (its size stays
    warm), at most max_graphs warm sizes and max_graphs compute-bound sizes
    remembered, KEYS_KEPT failed sizes and recording counts. A graph whose parameters or buffers were freed (a deleted model,
    weights assigned anew) is dropped at the next call; all go with the loaded function.

    Thread-safe: one lock serialises this loaded function's calls with graphs (the
    static buffers are shared), a call on another CUDA stream than the previous one
    waits for that stream first, and a thread records only after it ran the kernels
    once plainly (libraries make per-thread handles at first use). Graphs are recorded on the first device a call
    uses; calls on another device run the frozen kernels without a graph (torch's
    capture stream is made once per process, on one device).
    """

    COMPUTE_BOUND = 1.5
    MAX_RECORDINGS = 4  # recordings of one size, per graph kept, before it runs plainly
    KEYS_KEPT = 64  # sizes remembered as failed or counted by recordings; threads likewise

    def __init__(self, run, copy_outputs, max_graphs, compute_bound="plain"):
        # the arguments were checked by CompiledArtifact.with_cuda_graphs
        if _RUNS_BACKWARD:
            raise CallError(
                f"target {_META['target']!r} runs a backward (a training step): CUDA graphs "
                "serve inference targets only here; load it with cuda_graphs=False"
            )
        self._run = run
        self._probe = compute_bound == "plain"
        self._copy = bool(copy_outputs)
        self._max = max_graphs
        self._lock = _threading.RLock()
        self._graphs = []  # _Graph objects, least recently used first
        self._warm = {}  # size keys without a graph -> _TIME_NEXT, a timing or None; least recently seen first
        self._plain = {}  # size keys found compute-bound: run without a graph
        self._failed = {}  # size keys whose recording failed (or thrashed): run without a graph
        self._recordings = {}  # size key -> graphs recorded for it
        self._threads = set()  # idents of the threads that ran the kernels plainly
        self._freed = []  # appended to when a tensor a graph reads in place is freed
        self._pool = None  # the graphs' private memory pool, while one of them lives
        self._device: int = None  # type: ignore[assignment]  # the one device graphs are recorded on (set at the first call)
        self._stream = None  # (handle, Stream) of the latest replay's CUDA stream
        n = len(_META["params"])
        n_user = len(_META["tensor_inputs"])
        mutated = set(_META.get("mutated_inputs", []))
        self._n = n
        self._static_idx: list = None  # type: ignore[assignment]  # set at the first call (the constants follow the inputs)
        self._written_user = sorted(i for i in mutated if n <= i < n + n_user)
        self._copied = [i for i in range(n, n + n_user) if i not in mutated]
        # the inputs whose sizes key a graph: with dynamic dims every user input; else
        # the driver has checked that the inputs written in place have the captured
        # sizes (a decode step's cache: 3 tensors a layer), so only the copied ones
        self._key_idx = list(range(n, n + n_user)) if _DYN else self._copied
        self.recorded = 0  # graphs recorded so far (tests, benchmarks)
        self.plain = 0  # decisions "compute-bound: run without a graph" so far
        self.failed = 0  # recordings that failed (each warned once)
        self.out_of_memory = (
            0  # recordings that ran out of GPU memory (retried at the size's next call)
        )
        self.last_ratio = None  # GPU time / CPU time of the latest timed run decided on

    def __call__(self, flat, device):
        with self._lock:
            return self._call(flat, device)

    def _call(self, flat, device):
        if self._device is None:
            self._device = device.index
        elif device.index != self._device:
            return self._plain_run(flat)
        if self._static_idx is None:
            n_inputs = self._n + len(_META["tensor_inputs"])
            self._static_idx = (
                list(range(self._n)) + self._written_user + list(range(n_inputs, len(flat)))
            )
        if self._freed:
            self._drop_freed()
        key = (device.index, *[flat[i].shape for i in self._key_idx])
        if key in self._plain:
            self._plain[key] = self._plain.pop(key)  # the most recently seen: kept longest
            return self._plain_run(flat)
        if key in self._failed:
            return self._plain_run(flat)
        g = self._find(key, flat)
        if g is None:
            if key not in self._warm and any(h.key == key for h in self._graphs):
                self._warm[key] = None  # a recorded size with other tensors: record now
            if key not in self._warm:
                return self._warm_up(key, flat)
            timing = self._warm[key]
            if timing is _TIME_NEXT:
                return self._timed_run(key, flat)
            if self._compute_bound(timing):
                del self._warm[key]
                self._plain[key] = None
                if len(self._plain) > self._max:
                    del self._plain[next(iter(self._plain))]
                self.plain += 1
                return self._plain_run(flat)
            if _threading.get_ident() not in self._threads:
                # this thread's first run of the kernels: cuBLAS/cuDNN make per-thread
                # handles at first use, which a capture refuses; it records next time
                self._warm[key] = None
                return self._plain_run(flat)
            del self._warm[key]
            if self._thrashing(key):
                return self._plain_run(flat)
            g = self._record(key, flat)
            if g is None:  # failed, undone and warned about: this size runs plainly
                return self._plain_run(flat)
            self.recorded += 1
            self._graphs.append(g)
            if len(self._graphs) > self._max:  # dropped: its size stays warm
                self._keep_warm(self._graphs.pop(0).key)
        return self._replay(g, flat)

    def _find(self, key, flat):
        """The graph of this size whose in-place tensors are at flat's addresses, made
        the most recently used; or None."""
        graphs = self._graphs
        for i in range(len(graphs) - 1, -1, -1):
            g = graphs[i]
            if g.key != key:
                continue
            if _DATA_PTRS_EQUAL is not None:
                same = _DATA_PTRS_EQUAL(flat, g.ptrs, self._static_idx)
            else:
                same = all(flat[j].data_ptr() == g.ptrs[j] for j in self._static_idx)
            if same:
                if i != len(graphs) - 1:
                    graphs.append(graphs.pop(i))
                return g
        return None

    def _replay(self, g, flat):
        raw = self._current_stream()
        if self._stream is None or raw != self._stream[0]:
            stream = self._stream_object()
            if self._stream is not None:
                stream.wait_stream(
                    self._stream[1]
                )  # the last replay's buffers are still in use there
            self._stream = (raw, stream)
        if self._copied:
            torch._foreach_copy_(g.static_inputs, [flat[i] for i in self._copied])
        g.graph.replay()
        if self._copy:
            return [o.clone() for o in g.outputs]
        return list(g.outputs)

    def _plain_run(self, flat):
        """The kernels without a graph, noting the thread (see _call)."""
        threads = self._threads
        if len(threads) > self.KEYS_KEPT:  # threads come and go: a forgotten one warms up again
            threads.clear()
        threads.add(_threading.get_ident())
        return self._run(flat)

    @staticmethod
    def _current_stream():
        """The current CUDA stream's handle (an int: torch.cuda.current_stream() makes
        a Stream object per call, microseconds on every replay)."""
        return torch._C._cuda_getCurrentRawStream(torch._C._cuda_getDevice())

    @staticmethod
    def _stream_object():
        """The current CUDA stream (a torch.cuda.Stream), when its handle changed."""
        return torch.cuda.current_stream()

    def _keep_warm(self, key, timing=None):
        self._warm.pop(key, None)  # to the end: the most recently seen
        self._warm[key] = timing
        if len(self._warm) > self._max:
            del self._warm[next(iter(self._warm))]

    def _warm_up(self, key, flat):
        """The first call of a size: a plain run; its next call is timed (probing) or records."""
        self._keep_warm(key, _TIME_NEXT if self._probe else None)
        return self._plain_run(flat)

    def _timed_run(self, key, flat):
        """The second call of a probed size: a plain run, timed on the CPU and the GPU."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = _time.perf_counter()
        start.record()
        out = self._plain_run(flat)
        end.record()
        self._keep_warm(key, (start, end, (_time.perf_counter() - t0) * 1e3))
        return out

    def _compute_bound(self, timing):
        """Whether the timed run's GPU time exceeded COMPUTE_BOUND x its CPU time."""
        if timing is None:  # re-recording (evicted, or other tensors)
            return False
        start, end, cpu_ms = timing
        end.synchronize()
        self.last_ratio = start.elapsed_time(end) / max(cpu_ms, 1e-6)
        return self.last_ratio > self.COMPUTE_BOUND

    def _thrashing(self, key):
        """Whether this size has been recorded so often (tensors read in place at new
        addresses on every call, e.g. a cache cloned per call) that a graph would never
        be replayed: then it runs plainly from now on, with one CudaGraphWarning."""
        n = self._recordings[key] = self._recordings.pop(key, 0) + 1  # to the end: most recent
        if len(self._recordings) > self.KEYS_KEPT:
            del self._recordings[next(iter(self._recordings))]
        if n <= self.MAX_RECORDINGS * self._max:
            return False
        self._run_plainly(key)
        _warnings.warn(
            f"target {_META['target']!r}: {n - 1} CUDA graphs recorded for the same input sizes "
            "(the parameters, buffers or inputs written in place were at other addresses each "
            "time, e.g. a cache cloned per call); these sizes run the frozen kernels without a "
            "graph from now on. Pass the same tensors (write into one cache), or load it with "
            "cuda_graphs=False",
            CudaGraphWarning,
            stacklevel=4,
        )
        return True

    def _run_plainly(self, key):
        """Mark a size to run without a graph from now on (the KEYS_KEPT latest kept)."""
        self._failed[key] = None
        if len(self._failed) > self.KEYS_KEPT:
            del self._failed[next(iter(self._failed))]

    def _drop_freed(self):
        """Drop the graphs that read a freed tensor; their sizes stay warm (the next
        call with live tensors records at once, as after an eviction)."""
        self._freed.clear()
        live = []
        for g in self._graphs:
            if all(r() is not None for r in g.refs):
                live.append(g)
            else:
                self._keep_warm(g.key)
        self._graphs = live
        if not live:
            self._pool = None

    def _record(self, key, flat):
        """Record the kernels' launches for these tensors: a _Graph, or None when the
        recording failed (undone; out of memory: the size records again at its next
        call; else warned about once and the size marked to run plainly)."""
        g = _Graph()
        g.key = key
        try:
            g.static_inputs = [
                torch.empty_strided(
                    flat[i].shape, flat[i].stride(), dtype=flat[i].dtype, device=flat[i].device
                )
                for i in self._copied
            ]
            inputs = list(flat)
            for i, buf in zip(self._copied, g.static_inputs):
                buf.copy_(flat[i])
                inputs[i] = buf
            g.ptrs = [None] * len(flat)
            for i in self._static_idx:
                g.ptrs[i] = flat[i].data_ptr()
            g.graph, g.outputs = self._capture(inputs)
        except Exception as e:
            del g  # its static buffers go before the plain run that follows
            self._recover()
            if _out_of_memory(e):  # this call's memory, not the size's: record it next time
                self.out_of_memory += 1
                self._keep_warm(key)
                return None
            self._run_plainly(key)
            self.failed += 1
            _warnings.warn(
                f"target {_META['target']!r}: recording a CUDA graph failed ({type(e).__name__}: "
                f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); calls of these input "
                "sizes run the frozen kernels without a graph (results unchanged). Load it with "
                "cuda_graphs=False to silence this",
                CudaGraphWarning,
                stacklevel=4,
            )
            return None
        # the model's own tensors (persistent objects): a graph of a freed model goes
        # at the next call; in-place user inputs (caches) may be fresh views per call,
        # so theirs are left to the least-recently-used bound
        freed = self._freed
        g.refs = [
            _weakref.ref(flat[i], lambda _r, box=freed: box.append(1))  # type: ignore[misc]
            for i in range(self._n)
        ]
        return g

    def _capture(self, inputs):
        """(graph, outputs) of one recording of the kernels on ``inputs``."""
        if self._pool is None:
            # a pool handle lives only while a graph recorded into it does: a new one
            # when none is left (recording into a dead handle fails an allocator assert)
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        caller = torch.cuda.current_stream()
        torch.cuda.synchronize(self._device)
        try:
            # thread_local: other threads may use CUDA (allocate, synchronise) meanwhile
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                outputs = tuple(self._run(inputs))
        except BaseException:
            # when capture_end raises, torch.cuda.graph leaves its capture stream current
            torch.cuda.set_stream(caller)
            raise
        return graph, outputs

    def _recover(self):
        """Undo a failed recording (the caller's stream is current again, _capture):
        the pool is given up (a new one for the next recording), and one small
        successful recording ends the CUDA generators' capture state, which a failed
        capture_begin or capture_end leaves on (later RNG use would fail: "Offset
        increment outside graph capture")."""
        self._pool = None
        try:
            scratch = torch.zeros(1, device=torch.device("cuda", self._device))
            probe = torch.cuda.CUDAGraph()
            with torch.cuda.graph(probe, capture_error_mode="thread_local"):
                scratch.add_(1)
            del probe
        except Exception:  # pragma: no cover - nothing more to undo from Python
            pass
        torch.cuda.synchronize(self._device)
