"""On a GPU: a CUDA out-of-memory error in one call of a loaded function
leaves it usable for the next, CUDA graphs included.

The loaded function (a frozen CUDA MLP, graphs on, every size recorded) is called with
the GPU full (filler tensors take its free memory and the caching allocator's free
blocks, so the call's allocations fail as on a server whose other models took it) at each stage of its
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
    """The GPU full but for about ``spare`` bytes of device memory, as on a server whose
    other models took it: filler tensors take the device's free memory and then the free
    blocks inside the caching allocator's segments. ``empty_cache()`` releases only
    segments with nothing live in them; a segment holding a live tensor (the test's
    input, eager's output: 2 MiB each, in a 20 MiB segment) keeps its free rest, and a
    call's 8 MiB activation fitted there on the H200 (session 14: the call ran with the
    device's memory all taken). ``torch.cuda.set_per_process_memory_fraction(0)`` did not
    make torch 2.11's allocator refuse there either."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    fillers = []

    def take(size):  # blocks of `size` bytes until the allocator refuses one
        while True:
            try:
                fillers.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
            except torch.cuda.OutOfMemoryError:
                return

    free, _ = torch.cuda.mem_get_info()
    size = spare // (2 << 20) * (2 << 20)
    kept = torch.empty(size, dtype=torch.uint8, device="cuda") if size else None  # its own segment
    size = (free - size) // (2 << 20) * (2 << 20)
    while size > 0 and not fillers:
        try:
            fillers.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.cuda.OutOfMemoryError:  # the driver keeps some: step down to what it gives
            size -= 2 << 20
    for bits in range(30, 8, -1):  # what is left: segments' free blocks, the driver's rest
        take(1 << bits)
    if kept is not None:  # its segment back to the device: `spare` bytes a call can take
        del kept
        torch.cuda.empty_cache()
    try:
        yield
    finally:
        fillers.clear()
        torch.cuda.empty_cache()


def _must_run_out_of_memory(call):
    """``call()`` must raise torch.cuda.OutOfMemoryError; where it returns, the failure
    shows the allocator's state (which pool gave the call its memory)."""
    try:
        call()
    except torch.cuda.OutOfMemoryError:
        return
    pytest.fail("the call ran with the GPU full:\n" + torch.cuda.memory_summary(abbreviated=True))


@pytest.fixture(autouse=True)
def _no_grad():
    """Calls as a server makes them, under no_grad, as the pair was captured (a call with
    grad on and parameters requiring grad is refused before it allocates)."""
    with torch.no_grad():
        yield


@pytest.fixture
def mlp(tmp_path):
    """(model, input [512, 1024] fp32: 2 MiB, eager's output, the loaded function with
    graphs on, every size recorded: its second call)."""
    from _pairs import load_pair, pair_paths

    import precompile_build

    m, x = _mlp(), torch.randn(512, 1024, device="cuda")
    with (
        torch.no_grad(),
        precompile_build.capture(forward, engine="frozen", **pair_paths(tmp_path)) as f,
    ):
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
        with _full_gpu():
            _must_run_out_of_memory(lambda: fn(m, x))

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
    plainly and answers (in the segment the undone recording's static input gave
    back: 20 MiB, enough for the plain run's 8 + 2 MiB), the caller's stream current
    again; the next call records and replays eager's result, and torch's RNG works."""
    from precompile_runtime import CudaGraphWarning

    m, x, want, fn = mlp
    stream = torch.cuda.current_stream()
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudaGraphWarning)
        torch.testing.assert_close(fn(m, x), want, rtol=2e-3, atol=2e-3)  # the warm-up
        # the static input's copy (2 MiB, from a 20 MiB segment) fits, the recording's
        # 8 MiB activation (a 20 MiB segment of the graph's own pool) does not
        with _full_gpu(spare=24 << 20):
            y = fn(m, x)
        assert torch.cuda.current_stream() == stream
        assert (fn._graphs.recorded, fn._graphs.failed, fn._graphs.out_of_memory) == (0, 0, 1)
        torch.testing.assert_close(y, want, rtol=2e-3, atol=2e-3)
        for _ in range(3):
            torch.testing.assert_close(fn(m, x), want, rtol=2e-3, atol=2e-3)
    assert (fn._graphs.recorded, fn._graphs.failed) == (1, 0)
    torch.rand(8, device="cuda")
    torch.nn.functional.dropout(x, 0.5, training=True)
