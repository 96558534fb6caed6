"""CUDA graphs over frozen CUDA kernels (``cuda-graphs = true``, ``with_cuda_graphs``).

Each test captures a small CUDA call with the frozen engine, loads the pair in this
process with graphs on and compares every call with eager: steady replay, weights
swapped or loaded between calls, a moved model, a parameter's storage replaced
behind the runtime's back, outputs kept across calls, one graph per dynamic size
(LRU bounded), inputs the function writes to, and a serving process with the
compile guard on that imports no compiler module. Skipped without CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

try:
    import torch
except ImportError:  # pragma: no cover - CI without torch
    torch = None

HAVE_CUDA = torch is not None and torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_mlp(device="cuda"):
    nn = torch.nn
    torch.manual_seed(0)
    return (
        nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 16))
        .to(device)
        .eval()
    )


def forward(model, x):
    return model(x)


def _capture(tmp_path, fn, *args, options=None):
    import precompile_build

    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with precompile_build.capture(fn, engine="frozen", options=options, **paths) as f:
        f(*args)
    return paths


def _load(tmp_path, cuda_graphs=True, **kw):
    from _pairs import load_pair

    return load_pair(tmp_path / "t.py", tmp_path / "t.cache").with_cuda_graphs(cuda_graphs, **kw)


def _eq(got, want):
    torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)


@pytest.fixture()
def mlp_pair(tmp_path):
    m, x = make_mlp(), torch.randn(4, 32, device="cuda")
    _capture(tmp_path, forward, m, x)
    return tmp_path, m


def test_replays_equal_eager_and_record_once(mlp_pair):
    tmp, m = mlp_pair
    fn = _load(tmp)
    assert fn.cuda_graphs
    for _ in range(6):
        x = torch.randn(4, 32, device="cuda")
        with torch.no_grad():
            _eq(fn(m, x), m(x))
    assert (
        fn._graphs.recorded == 1
    )  # call 1 warms up, call 2 is timed, call 3 records, the rest replay
    assert fn._graphs.plain == 0  # launch-bound: worth its graph


def matmul_chain(x):
    for _ in range(8):
        x = torch.tanh(x @ x)
    return x


def test_compute_bound_sizes_run_without_a_graph(tmp_path):
    """A call whose kernels keep the GPU busy far longer than issuing them takes (eight
    2048x2048 matmuls: milliseconds of GPU, microseconds of launches) gains nothing
    from a graph and would pay the copies: after its timed second call it runs plainly.
    compute_bound="graph" records it anyway (at its second call: nothing to time)."""
    x = torch.randn(2048, 2048, device="cuda") / 32
    _capture(tmp_path, matmul_chain, x)
    with torch.no_grad():
        want = matmul_chain(x)
    fn = _load(tmp_path)
    for _ in range(4):
        _eq(fn(x), want)
    assert (fn._graphs.recorded, fn._graphs.plain) == (0, 1)
    forced = _load(tmp_path, compute_bound="graph")
    for _ in range(2):
        _eq(forced(x), want)
    assert (forced._graphs.recorded, forced._graphs.plain) == (1, 0)
    _eq(forced(x), want)  # a replay
    with pytest.raises(ValueError, match="compute_bound takes 'plain' or 'graph'"):
        _load(tmp_path, compute_bound="auto")


def test_swapped_loaded_and_moved_weights(mlp_pair):
    tmp, m = mlp_pair
    fn = _load(tmp)
    x = torch.randn(4, 32, device="cuda")
    for _ in range(3):
        fn(m, x)
    m[0].weight = torch.nn.Parameter(torch.randn(64, 32, device="cuda"))  # swapped: new address
    with torch.no_grad():
        _eq(fn(m, x), m(x))
    assert fn._graphs.recorded == 2
    m.load_state_dict({k: v * 0.5 for k, v in m.state_dict().items()})  # in place: same addresses
    with torch.no_grad():
        _eq(fn(m, x), m(x))
    assert fn._graphs.recorded == 2
    m[3].weight.data = m[3].weight.data.clone() + 1  # behind the runtime's back: address check
    with torch.no_grad():
        _eq(fn(m, x), m(x))
    assert fn._graphs.recorded == 3
    m.cpu().cuda()  # moved away and back: new addresses
    with torch.no_grad():
        _eq(fn(m, x), m(x))
    assert fn._graphs.recorded == 4
    if torch.cuda.device_count() > 1:  # another device: the kernels run without a graph
        m1, x1 = m.to("cuda:1"), x.to("cuda:1")
        for _ in range(3):
            with torch.no_grad():
                _eq(fn(m1, x1), m1(x1))
        assert fn._graphs.recorded == 4


def test_kept_outputs_are_not_overwritten(mlp_pair):
    tmp, m = mlp_pair
    fn = _load(tmp)
    xs = [torch.randn(4, 32, device="cuda") for _ in range(4)]
    outs = [fn(m, x) for x in xs]
    with torch.no_grad():
        for o, x in zip(outs, xs):
            _eq(o, m(x))
    aliasing = _load(tmp, copy_outputs=False)  # explicit opt-in: the graph's own outputs
    for x in xs[:2]:
        aliasing(m, x)
    first = aliasing(m, xs[2])
    aliasing(m, xs[3])
    with torch.no_grad():
        _eq(first, m(xs[3]))  # overwritten by the next replay, as documented


def test_one_graph_per_dynamic_size_lru(tmp_path):
    m, x = make_mlp(), torch.randn(4, 32, device="cuda")
    torch._dynamo.mark_dynamic(x, 0, min=2, max=64)
    _capture(tmp_path, forward, m, x)
    fn = _load(tmp_path, max_graphs=2)
    for _round in range(2):
        for b in (2, 3, 8):
            for _ in range(3):  # round 0: warm-up, timed run, recording; round 1: see below
                x = torch.randn(b, 32, device="cuda")
                with torch.no_grad():
                    _eq(fn(m, x), m(x))
    assert len(fn._graphs._graphs) == 2 and fn._graphs.plain == 0
    # 3 sizes, 2 graphs kept: in round 1 each size's graph had been dropped (least
    # recently used) and is recorded again at once, its key still warm
    assert fn._graphs.recorded == 6


def test_inputs_the_function_writes_are_copied_back(tmp_path):
    def ema(avg, x):
        avg.mul_(0.5).add_(x)
        return avg * 2

    avg, x = torch.zeros(64, device="cuda"), torch.randn(64, device="cuda")
    _capture(tmp_path, ema, avg.clone(), x)
    fn = _load(tmp_path)
    ref = torch.zeros(64, device="cuda")
    for _ in range(4):
        x = torch.randn(64, device="cuda")
        got = fn(avg, x)
        want = ema(ref, x)
        _eq(got, want)
        _eq(avg, ref)


def test_training_targets_are_refused(tmp_path):
    from precompile_runtime.errors import CallError

    def step(m, x):
        loss = m(x).square().mean()
        loss.backward()
        return loss.detach()

    m = make_mlp()
    _capture(tmp_path, step, m, torch.randn(4, 32, device="cuda"))
    with pytest.raises(CallError, match="runs a backward"):
        _load(tmp_path)


SERVE = textwrap.dedent("""
    import json, sys
    import precompile_runtime  # installs the serving guard (PRECOMPILE_NO_COMPILE=1)
    import torch
    sys.path.insert(0, sys.argv[2])
    from test_gpu_cudagraphs import _load, make_mlp
    from pathlib import Path
    fn = _load(Path(sys.argv[1]))
    m = make_mlp()
    errs = []
    for _ in range(5):
        x = torch.randn(4, 32, device="cuda")
        with torch.no_grad():
            errs.append(float((fn(m, x) - m(x)).abs().max()))
    print(json.dumps({"errs": errs, "recorded": fn._graphs.recorded,
                      "compiler_modules": sorted(k for k in sys.modules
                                                 if k.startswith(("torch._inductor", "torch._dynamo", "triton")))}))
""")


def test_recording_compiles_nothing(mlp_pair, tmp_path_factory):
    tmp, _ = mlp_pair
    script = tmp_path_factory.mktemp("serve") / "serve.py"
    script.write_text(SERVE)
    empty = tmp_path_factory.mktemp("caches")
    env = dict(
        os.environ,
        PRECOMPILE_NO_COMPILE="1",
        TORCHINDUCTOR_CACHE_DIR=str(empty / "ind"),
        TRITON_CACHE_DIR=str(empty / "tri"),
        PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "runtime")]),
    )
    out = subprocess.run(
        [sys.executable, str(script), str(tmp), os.path.join(REPO, "tests")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert max(r["errs"]) < 2e-3 and r["recorded"] == 1
    assert r["compiler_modules"] == []
    assert not os.listdir(empty)


# ---- other tensors, failed recordings, threads (the server's ways of calling) ------


def _eager(m, x):
    with torch.no_grad():
        return m(x)


def test_other_instances_assigned_and_moved_weights_interleaved(mlp_pair):
    """Each model's tensors get their own graph: another instance, weights assigned
    with load_state_dict(assign=True), a model moved away and back, called in turns,
    each gives eager's result; torch's RNG and a new loaded function still work after."""
    tmp, m1 = mlp_pair
    fn = _load(tmp)
    x = torch.randn(4, 32, device="cuda")
    m2 = make_mlp()
    for p in m2.parameters():
        p.data.mul_(0.5)
    m3 = make_mlp()
    m3.load_state_dict({k: v.clone() * 2 for k, v in m1.state_dict().items()}, assign=True)
    for _ in range(4):
        for m in (m1, m2, m3):
            _eq(fn(m, x), _eager(m, x))
    m2.cpu()
    m2.cuda()
    for _ in range(3):
        for m in (m3, m2, m1):
            _eq(fn(m, x), _eager(m, x))
    assert fn._graphs.recorded == 4 and fn._graphs.failed == 0
    torch.rand(3, device="cuda")  # the CUDA generator is not left in capture mode
    again = _load(tmp)
    for _ in range(3):
        _eq(again(m1, x), _eager(m1, x))
    assert again._graphs.recorded == 1


def _sync_while_recording(fn):
    """Make fn's recordings fail the way an op that synchronises does."""
    run = fn._graphs._run

    def run_or_sync(flat):
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return run(flat)

    fn._graphs._run = run_or_sync


def test_a_failed_recording_is_undone(mlp_pair):
    """A recording that fails (here: a synchronisation inside the capture) is undone:
    one CudaGraphWarning, eager's result for that call and every later one (that size
    runs plainly), the caller's stream current again, torch's RNG usable (a failed
    capture used to leave the generator in capture mode: "Offset increment outside
    graph capture"), and graphs of another loaded function record and replay."""
    from precompile_runtime import CudaGraphWarning

    tmp, m = mlp_pair
    fn = _load(tmp)
    _sync_while_recording(fn)
    x = torch.randn(4, 32, device="cuda")
    stream = torch.cuda.current_stream()
    with pytest.warns(CudaGraphWarning, match="recording a CUDA graph failed"):
        for _ in range(3):
            _eq(fn(m, x), _eager(m, x))
    assert torch.cuda.current_stream() == stream
    assert (fn._graphs.failed, fn._graphs.recorded) == (1, 0)
    for _ in range(3):
        y = torch.randn(4, 32, device="cuda")
        _eq(fn(m, y), _eager(m, y))
    torch.rand(8, device="cuda")
    torch.nn.functional.dropout(x, 0.5, training=True)
    other = _load(tmp)
    for _ in range(4):
        _eq(other(m, x), _eager(m, x))
    assert other._graphs.recorded == 1


def test_graphs_of_a_deleted_model_are_freed(mlp_pair):
    """A deleted model's graph goes at the next call; the loaded function's graphs go
    with it: GPU memory allocated returns to where it was before the first call."""
    import gc

    tmp, _ = mlp_pair
    x = torch.randn(4, 32, device="cuda")
    gc.collect()
    before = torch.cuda.memory_allocated()
    fn = _load(tmp)
    m = make_mlp()
    for _ in range(3):
        fn(m, x)
    assert len(fn._graphs._graphs) == 1
    del m
    gc.collect()
    m2 = make_mlp()
    for _ in range(2):
        _eq(fn(m2, x), _eager(m2, x))
    assert len(fn._graphs._graphs) == 1 and fn._graphs.recorded == 2
    del fn, m2
    gc.collect()
    assert torch.cuda.memory_allocated() <= before


@pytest.mark.parametrize("streams", [False, True], ids=["default-stream", "stream-per-thread"])
def test_concurrent_calls_give_eager_results(mlp_pair, streams):
    """Four threads call one loaded function at once, 20 calls each with inputs of
    their own, each keeping its last output (on one stream, and on a stream per
    thread): every output equals eager's for that thread's input."""
    import threading

    tmp, m = mlp_pair
    fn = _load(tmp)
    xs = [[torch.randn(4, 32, device="cuda") for _ in range(20)] for _ in range(4)]
    want = [_eager(m, row[-1]) for row in xs]
    got, errors = [None] * 4, []
    torch.cuda.synchronize()

    def serve(i):
        try:
            ctx = torch.cuda.stream(torch.cuda.Stream()) if streams else torch.cuda.device(0)
            with ctx:
                for x in xs[i]:
                    got[i] = fn(m, x)
                torch.cuda.current_stream().synchronize()
        except Exception as e:  # pragma: no cover - what this test looks for
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for g, w in zip(got, want):
        _eq(g, w)
    assert fn._graphs.recorded == 1


def test_three_caches_interleaved_match_eager(tmp_path):
    """A decode-like step that writes its cache in place: three caches (three
    requests) called in turns each get a graph reading their cache in place; every
    step's output and every cache equal eager's."""

    def step(cache, pos, x):
        cache.index_copy_(0, pos, x)
        return (cache.sum(0) * x).tanh()

    cache0 = torch.zeros(16, 32, device="cuda")
    _capture(
        tmp_path, step, cache0, torch.tensor([0], device="cuda"), torch.randn(1, 32, device="cuda")
    )
    fn = _load(tmp_path)
    caches = [torch.zeros(16, 32, device="cuda") for _ in range(3)]
    refs = [c.clone() for c in caches]
    for t in range(12):
        for c, r in zip(caches, refs):
            pos, x = torch.tensor([t], device="cuda"), torch.randn(1, 32, device="cuda")
            _eq(fn(c, pos, x), step(r, pos, x))
            _eq(c, r)
    assert fn._graphs.recorded == 3 and len(fn._graphs._graphs[0].static_inputs) == 2  # pos, x
