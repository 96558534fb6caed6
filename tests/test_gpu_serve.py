"""Issue 38 item 3 on a GPU: a CUDA out-of-memory error in one call of a loaded function
leaves it usable for the next, CUDA graphs included.

The loaded function (a frozen CUDA MLP, graphs on, every size recorded) is called with
the GPU full (a filler tensor takes its free memory, so the call's allocations fail as
on a server whose other models took it) at each stage of its
graph's life: the first (plain) call, the call that records, a replay (the output
copy); after each, with the memory given back, the next call equals eager, and the graph is
recorded and replayed as without the error. The stand-in version of the recording's
bookkeeping runs without a GPU: test_cuda_graph_keys.py. Skipped without CUDA.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest

try:
    import torch
except ImportError:  # pragma: no cover - CI without torch
    torch = None

HAVE_CUDA = torch is not None and torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")]


def _mlp():
    nn = torch.nn
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda().eval()


def forward(model, x):
    return model(x)


@contextlib.contextmanager
def _full_gpu(spare: int = 0):
    """The GPU full but for about ``spare`` bytes: a filler tensor takes the rest of its
    free memory (what the caching allocator cached is released first, so a call's new
    blocks need device memory that is not there), as on a server whose other models
    took it. (``torch.cuda.set_per_process_memory_fraction(0)`` did not make the
    allocator refuse on the H200 host with torch 2.11: calls under it ran.)"""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    size, filler = (free - spare) // (2 << 20) * (2 << 20), None
    while filler is None and size > 0:
        try:
            filler = torch.empty(size, dtype=torch.uint8, device="cuda")
        except torch.cuda.OutOfMemoryError:  # the driver keeps some: step down to what it gives
            size -= 2 << 20
    try:
        yield
    finally:
        del filler
        torch.cuda.empty_cache()


@pytest.fixture
def mlp(tmp_path):
    """(model, input [512, 1024] fp32: 2 MiB, eager's output, the loaded function with
    graphs on, every size recorded: its second call)."""
    from _pairs import load_pair, pair_paths

    import precompile_build

    m, x = _mlp(), torch.randn(512, 1024, device="cuda")
    with torch.no_grad(), precompile_build.capture(forward, engine="frozen", **pair_paths(tmp_path)) as f:
        f(m, x)
    fn = load_pair(tmp_path / "t.py", tmp_path / "t.cache").with_cuda_graphs(compute_bound="graph")
    with torch.no_grad():
        want = m(x)
    return m, x, want, fn


def test_an_out_of_memory_call_leaves_the_function_usable_graphs_included(mlp):
    from precompile_runtime import CudaGraphWarning

    m, x, want, fn = mlp

    def ok():
        torch.testing.assert_close(fn(m, x), want, rtol=2e-3, atol=2e-3)

    def out_of_memory():
        with _full_gpu(), pytest.raises(torch.cuda.OutOfMemoryError):
            fn(m, x)

    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphWarning)  # no size given up
        out_of_memory()  # the size's first call: a plain run
        out_of_memory()  # the call that records: undone, then a plain run, out of memory too
        assert (fn._graphs.recorded, fn._graphs.failed, fn._graphs.out_of_memory) == (0, 0, 1)
        ok()  # records and replays
        assert (fn._graphs.recorded, fn._graphs.failed) == (1, 0)
        out_of_memory()  # a replay: its output copy
        for _ in range(3):
            ok()  # replays of the same graph
    assert (fn._graphs.recorded, fn._graphs.failed, fn._graphs.plain) == (1, 0, 0)
    y = torch.randn(512, 1024, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(fn(m, y), m(y), rtol=2e-3, atol=2e-3)
    torch.rand(8, device="cuda")  # the RNG left usable by the undone recording


def test_a_recording_out_of_memory_inside_the_capture_is_undone(mlp):
    """The graph's static input fits (24 MiB spare) and the recording runs out of memory
    inside torch.cuda.graph (the 8 MiB hidden activation): undone, that call runs
    plainly (out of memory too), the caller's stream current again; the next call
    records and replays eager's result, and torch's RNG works."""
    from precompile_runtime import CudaGraphWarning

    m, x, want, fn = mlp
    stream = torch.cuda.current_stream()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphWarning)
        torch.testing.assert_close(fn(m, x), want, rtol=2e-3, atol=2e-3)  # the warm-up
        # the static input's copy (2 MiB, from a 20 MiB block) fits, the recording's 8 MiB
        # activation (another 20 MiB block) does not
        with _full_gpu(spare=24 << 20), pytest.raises(torch.cuda.OutOfMemoryError):
            fn(m, x)
        assert torch.cuda.current_stream() == stream
        assert (fn._graphs.recorded, fn._graphs.failed, fn._graphs.out_of_memory) == (0, 0, 1)
        for _ in range(3):
            torch.testing.assert_close(fn(m, x), want, rtol=2e-3, atol=2e-3)
    assert (fn._graphs.recorded, fn._graphs.failed) == (1, 0)
    torch.rand(8, device="cuda")
    torch.nn.functional.dropout(x, 0.5, training=True)
