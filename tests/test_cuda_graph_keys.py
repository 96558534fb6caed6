"""Which CUDA graph serves a call, checked without a GPU: a graph is keyed by the input
sizes and by the addresses of what it reads in place (parameters, buffers, inputs the
function writes such as caches); a failed recording leaves that size to plain runs;
graphs of freed models go; concurrent calls keep the bookkeeping whole.

Recording and replay are stand-ins (tests/test_driver_fast_path.py `_stand_in_recording`):
the stand-in graph returns the first tensor it was recorded with, so a result tells
which graph served the call. The real graphs: tests/test_gpu_cudagraphs.py.
"""

from __future__ import annotations

import threading
import warnings

import pytest

torch = pytest.importorskip("torch")

from test_driver_fast_path import _capture, _graphs_ns, _model, _stand_in_recording  # noqa: E402

from precompile_runtime import CudaGraphWarning  # noqa: E402

CUDA0 = torch.device("cuda", 0)


def forward(m, x):
    return m(x)


def _graphs(tmp_path, fn, *args, max_graphs=8, fail=()):
    ns = _graphs_ns(_capture(tmp_path, fn, *args))
    runs = []
    graphs = ns["_CudaGraphs"](
        lambda flat: runs.append(len(flat)) or [flat[-1] * 2], True, max_graphs, "graph"
    )
    _stand_in_recording(graphs, fail=fail)
    return ns, graphs, runs


def _flat(ns, m, x):
    return ns["_cached_params"]([m]) + [x]


def test_each_model_instance_gets_its_own_graph(tmp_path):
    """Other parameter tensors (another instance, weights assigned anew, a moved
    model) record a graph of their own at once, for a size already recorded; calls
    interleaved between the models replay each model's graph, never another's."""
    m1, x = _model(1), torch.randn(2, 8)
    ns, graphs, runs = _graphs(tmp_path, forward, m1, x)
    for _ in range(2):  # warm-up, then recording
        graphs(_flat(ns, m1, x), CUDA0)
    assert graphs.recorded == 1
    m2 = _model(1)
    m3 = _model(1)
    m3.load_state_dict(m1.state_dict(), assign=True)  # m1's tensors: m1's graph
    out = graphs(_flat(ns, m2, x), CUDA0)  # a recorded size, other tensors: records now
    assert graphs.recorded == 2 and out[0].data_ptr() != m2[0].fc.weight.data_ptr()
    assert torch.equal(out[0], m2[0].fc.weight)  # the stand-in returns its first tensor
    for m in (m1, m2, m1, m2):
        assert torch.equal(graphs(_flat(ns, m, x), CUDA0)[0], m[0].fc.weight)
    assert torch.equal(graphs(_flat(ns, m3, x), CUDA0)[0], m1[0].fc.weight)
    assert graphs.recorded == 2  # m3 holds m1's tensors: m1's graph serves it
    m2[0].fc.weight = torch.nn.Parameter(torch.randn(8, 8))  # one tensor replaced
    assert torch.equal(graphs(_flat(ns, m2, x), CUDA0)[0], m2[0].fc.weight)
    assert graphs.recorded == 3


def test_graphs_of_freed_models_are_dropped(tmp_path):
    """A graph whose parameters were freed goes at the next call (and with it the pool
    once none is left); at most max_graphs graphs are kept, least recently used first."""
    import gc

    x = torch.randn(2, 8)
    ns, graphs, _ = _graphs(tmp_path, forward, _model(1), x, max_graphs=2)
    models = [_model(1) for _ in range(3)]
    for m in models:
        for _ in range(2):
            graphs(_flat(ns, m, x), CUDA0)
    assert graphs.recorded == 3 and len(graphs._graphs) == 2  # the first model's graph dropped
    graphs._pool = "the pool of the graphs recorded so far"
    del m
    models.clear()
    gc.collect()
    assert graphs._freed
    keep = _model(1)
    graphs(_flat(ns, keep, x), CUDA0)  # the freed models' graphs go before this one records
    assert graphs.recorded == 4 and len(graphs._graphs) == 1
    assert graphs._pool is None  # none was left: this recording took a new pool


def test_inputs_written_in_place_are_read_in_place(tmp_path):
    """An input the function writes (a cache) is part of the graph's key, not copied
    into a static buffer: three caches interleaved get three graphs, each call
    replays its own cache's; the other inputs are copied into the graph's buffers."""

    def step(cache, x):
        cache.mul_(0.5).add_(x)
        return cache * 2

    ns, graphs, runs = _graphs(tmp_path, step, torch.zeros(4), torch.randn(4))
    assert ns["_META"]["mutated_inputs"] == [0]
    caches = [torch.zeros(4) for _ in range(3)]
    x = torch.randn(4)
    for c in caches:
        graphs([c, x], CUDA0)
        graphs([c, x], CUDA0)
    assert graphs.recorded == 3
    assert all(len(g.static_inputs) == 1 for g in graphs._graphs)  # x only
    for c in caches[::-1] + caches:
        assert graphs([c, x], CUDA0)[0].data_ptr() != c.data_ptr()
    assert [g.ptrs[0] for g in graphs._graphs] == [c.data_ptr() for c in caches]  # LRU order
    assert graphs.recorded == 3


def test_a_failed_recording_runs_that_size_plainly_with_one_warning(tmp_path):
    ns, graphs, runs = _graphs(tmp_path, lambda x: x * 2, torch.randn(3), fail=(5,))
    with pytest.warns(
        CudaGraphWarning,
        match=r"target 't': recording a CUDA graph failed \(RuntimeError: "
        r"operation not permitted when stream is capturing\); calls of these input sizes "
        r"run the frozen kernels without a graph",
    ):
        for _ in range(2):
            out = graphs([torch.ones(5)], CUDA0)
    assert (
        torch.equal(out[0], torch.full((5,), 2.0)) and graphs.failed == 1 and graphs.recorded == 0
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: later calls of that size run plainly
        for _ in range(3):
            assert torch.equal(graphs([torch.ones(5)], CUDA0)[0], torch.full((5,), 2.0))
        for _ in range(2):  # another size still records
            graphs([torch.ones(3)], CUDA0)
    assert graphs.failed == 1 and graphs.recorded == 1 and len(runs) == 2 + 3 + 1


def test_a_recording_that_runs_out_of_memory_records_at_the_next_call(tmp_path):
    """A recording that ran out of GPU memory (torch's OutOfMemoryError, or capture_end's
    error that replaced it) is undone and that call runs plainly, with no warning; the
    size is not given up: its next call records (was: run plainly for good).
    Real memory: tests/test_gpu_serve.py."""
    ns, graphs, runs = _graphs(tmp_path, lambda x: x * 2, torch.randn(3))
    record, left = graphs._capture, [2]

    def capture(inputs):
        left[0] -= 1
        if left[0] == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        if left[0] == 0:
            try:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
            except torch.cuda.OutOfMemoryError:  # as torch.cuda.graph's __exit__ replaces it
                msg = "CUDA error: operation failed due to a previous error during capture"
                raise RuntimeError(msg)  # noqa: B904
        return record(inputs)

    graphs._capture = capture
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):  # a warm-up, two recordings out of memory: plain runs
            assert torch.equal(graphs([torch.ones(5)], CUDA0)[0], torch.full((5,), 2.0))
        assert (graphs.out_of_memory, graphs.failed, graphs.recorded, len(runs)) == (2, 0, 0, 3)
        for _ in range(2):  # a recording, a replay: the stand-in graph's output
            assert torch.equal(graphs([torch.ones(5)], CUDA0)[0], torch.ones(5))
    assert (graphs.out_of_memory, graphs.failed, graphs.recorded, len(runs)) == (2, 0, 1, 3)


def test_concurrent_calls_keep_the_bookkeeping_whole(tmp_path):
    """Four threads, four models, one size: every call gets its own model's graph,
    each model is recorded once."""
    x = torch.randn(2, 8)
    ns, graphs, _ = _graphs(tmp_path, forward, _model(1), x)
    models = [_model(1) for _ in range(4)]
    flats = [_flat(ns, m, x) for m in models]
    wrong, errors = [], []

    def serve(i):
        try:
            for _ in range(50):
                out = graphs(list(flats[i]), CUDA0)
                if len(graphs._graphs) and out[0].shape == models[i][0].fc.weight.shape:
                    if not torch.equal(out[0], models[i][0].fc.weight) and not torch.equal(
                        out[0], x * 2
                    ):
                        wrong.append(i)
        except Exception as e:  # pragma: no cover - the failure this test looks for
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and wrong == []
    assert graphs.recorded == 4 and len(graphs._graphs) == 4


def test_a_size_whose_tensors_move_every_call_stops_recording(tmp_path):
    """A cache cloned per call would record a graph per call, never replayed: after
    MAX_RECORDINGS x max_graphs recordings that size runs plainly, with one warning."""

    def step(cache, x):
        cache.add_(x)
        return cache * 2

    ns, graphs, runs = _graphs(tmp_path, step, torch.zeros(4), torch.randn(4), max_graphs=2)
    limit = graphs.MAX_RECORDINGS * 2
    x = torch.randn(4)
    caches = [torch.zeros(4) for _ in range(limit + 6)]  # alive: each at an address of its own
    with pytest.warns(
        CudaGraphWarning,
        match=r"CUDA graphs recorded for the same input sizes .* "
        r"run the frozen kernels without a graph from now on",
    ):
        for c in caches[:-1]:
            graphs([c, x], CUDA0)
    assert graphs.recorded == limit and len(graphs._graphs) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = graphs([caches[-1], x], CUDA0)
    assert torch.equal(out[0], x * 2) and graphs.recorded == limit
