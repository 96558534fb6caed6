"""The driver's per-call checks: cached between model state changes, still complete.

A model argument is fully checked (structure, every tensor's dtype/device/shape/
stride, every submodule's train/eval flag) when it is first seen and again after
anything that bumps the model state epoch; in between a call does no walk over the
submodules. Each change a user can make between calls is caught; the ambient state
that changes what eager computes (autocast, grad mode for a captured backward) is
checked on every call. Pairs of the eager engine keep these tests cheap: the driver
is the same code for both engines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

import precompile_build  # noqa: E402
from precompile_runtime.errors import CallError  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
nn = torch.nn


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(self.drop(self.fc(x)).relu())


def _model(n=3):
    torch.manual_seed(0)
    return nn.Sequential(*[Block() for _ in range(n)]).eval()


def forward(m, x):
    return m(x)


def _capture(tmp_path, fn=forward, *args, engine="eager"):
    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with precompile_build.capture(fn, engine=engine, **paths) as f:
        f(*args)
    ns: dict = {"__name__": "pair"}
    exec(compile((tmp_path / "t.py").read_text(), "t.py", "exec"), ns)
    return ns


@pytest.fixture()
def pair(tmp_path):
    """(namespace of the loaded source, artifact, model, input); counts full checks."""
    m, x = _model(), torch.randn(2, 8)
    ns = _capture(tmp_path, forward, m, x)
    full = ns["_full_params"]
    ns["full_checks"] = 0

    def counting(modules):
        ns["full_checks"] += 1
        return full(modules)

    ns["_full_params"] = counting
    return ns, ns["load"](None), m, x


def test_steady_calls_skip_the_model_walk(pair):
    ns, fn, m, x = pair
    for _ in range(20):
        torch.testing.assert_close(fn(m, x), m(x))
    assert ns["full_checks"] == 1
    assert ns["_INPUT_GUARD"][0] is not None  # user tensors checked in C


def test_train_mode_of_the_model_or_one_submodule_is_caught(pair):
    ns, fn, m, x = pair
    fn(m, x)
    m.train()
    with pytest.raises(CallError, match="call model.eval()"):
        fn(m, x)
    m.eval()
    fn(m, x)
    m[1].drop.train()  # one submodule only
    with pytest.raises(CallError, match="train/eval mode"):
        fn(m, x)
    m[1].drop.eval()
    torch.testing.assert_close(fn(m, x), m(x))


def test_swapped_parameters_and_loaded_checkpoints_are_served(pair):
    ns, fn, m, x = pair
    fn(m, x)
    m[0].fc.weight = nn.Parameter(torch.randn(8, 8))  # a swap: a new tensor object
    torch.testing.assert_close(fn(m, x), m(x))
    m.load_state_dict(_model().state_dict() | {"2.fc.bias": torch.randn(8)})  # in place
    torch.testing.assert_close(fn(m, x), m(x))
    m.load_state_dict({k: v * 2 for k, v in m.state_dict().items()}, assign=True)
    torch.testing.assert_close(fn(m, x), m(x))
    m[2].fc.weight = nn.Parameter(torch.randn(8, 9))
    with pytest.raises(CallError, match=r"parameter/buffer m\.2\.fc\.weight: shape \[8, 9\]"):
        fn(m, x)


def test_a_converted_or_restructured_model_is_refused(pair):
    ns, fn, m, x = pair
    fn(m, x)
    m.double()  # to(), cuda(), half() go through the same nn.Module._apply
    with pytest.raises(CallError, match="dtype torch.float64"):
        fn(m, x)
    m.float()
    fn(m, x)
    m[1].extra = nn.Linear(2, 2)
    with pytest.raises(CallError, match="pass a model of the captured structure"):
        fn(m, x)
    del m[1].extra
    torch.testing.assert_close(fn(m, x), m(x))
    other = _model()  # another model object of the same structure: its own entry
    torch.testing.assert_close(fn(other, x), other(x))


def test_input_checks_after_the_guard_name_the_problem(pair):
    ns, fn, m, x = pair
    fn(m, x)
    with pytest.raises(CallError, match="dtype torch.float64"):
        fn(m, x.double())
    with pytest.raises(CallError, match="shape"):
        fn(m, torch.randn(3, 8))
    with pytest.raises(CallError, match="expected a tensor"):
        fn(m, 3)
    with pytest.raises(CallError, match="expected an nn.Module"):
        fn(x, x)
    torch.testing.assert_close(fn(m, x), m(x))


def test_autocast_at_call_time_is_refused(pair):
    ns, fn, m, x = pair
    fn(m, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with pytest.raises(
            CallError, match="called with cpu autocast to torch.bfloat16, but captured with it off"
        ):
            fn(m, x)
        with torch.autocast("cpu", enabled=False):  # the documented way out
            assert fn(m, x).dtype == torch.float32


def test_captured_under_autocast_needs_it_at_call_time(tmp_path):
    m, x = _model(1), torch.randn(2, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ns = _capture(tmp_path, forward, m, x)
        fn = ns["load"](None)
        got = fn(m, x)
        torch.testing.assert_close(got, m(x))
    assert ns["PRECOMPILE_METADATA"]["ambient"] == {"autocast": {"cpu": "torch.bfloat16"}}
    with pytest.raises(CallError, match="captured with it to torch.bfloat16"):
        fn(m, x)


# expected: the case runs a backward, which Dynamo does not trace
@pytest.mark.filterwarnings("ignore:.*the function runs a backward:UserWarning")
def test_a_captured_backward_under_no_grad_is_refused(tmp_path):
    def step(m, x):
        loss = m(x).sum()
        loss.backward()
        return loss.detach()

    m, x = nn.Linear(8, 2), torch.randn(2, 8)
    fn = _capture(tmp_path, step, m, x)["load"](None)
    fn(m, x)
    for ctx in (torch.no_grad, torch.inference_mode):
        with ctx(), pytest.raises(CallError, match="runs a backward"):
            fn(m, x)


def test_pairs_without_ambient_metadata_still_load(tmp_path):
    """Sources written before the ambient record: autocast assumed off."""
    m, x = _model(1), torch.randn(2, 8)
    _capture(tmp_path, forward, m, x)
    src = (tmp_path / "t.py").read_text().replace("'ambient'", "'ambient_unused'")
    ns: dict = {"__name__": "pair"}
    exec(compile(src, "t.py", "exec"), ns)
    fn = ns["load"](None)
    torch.testing.assert_close(fn(m, x), m(x))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(CallError, match="autocast"):
        fn(m, x)


def test_cuda_graphs_are_refused_for_cpu_targets(pair):
    ns, fn, m, x = pair
    with pytest.raises(CallError, match="frozen kernels"):
        fn.with_cuda_graphs()  # the eager engine has no kernels
    assert fn.with_cuda_graphs(False)(m, x).shape == (2, 8)


SERVE = """
import json, sys, torch
ns = {"__name__": "pair"}
exec(compile(open(sys.argv[1]).read(), "t.py", "exec"), ns)
fn = ns["load"](None)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)).eval()
x = torch.randn(2, 8)
for _ in range(5):
    out = fn(m, x)
print(json.dumps({
    "guard": type(ns["_INPUT_GUARD"][0]).__name__,
    "equal": bool(torch.equal(out, m(x))),
    "compiler_modules": sorted(k for k in sys.modules if k.startswith(("torch._dynamo", "torch._inductor"))),
}))
"""


def test_serving_imports_no_compiler_module(tmp_path):
    """TensorGuards is part of torch._C: using it imports no torch._dynamo."""
    m = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8)).eval()
    _capture(tmp_path, forward, m, torch.randn(2, 8))
    (tmp_path / "serve.py").write_text(SERVE)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "runtime")]))
    out = subprocess.run(
        [sys.executable, str(tmp_path / "serve.py"), str(tmp_path / "t.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r == {"guard": "TensorGuards", "equal": True, "compiler_modules": []}


def test_cuda_graphs_option_on_a_cpu_target_is_a_capture_error(tmp_path, monkeypatch):
    """`cuda-graphs = true` reaches the capture as PRECOMPILE_CUDA_GRAPHS=1."""
    monkeypatch.setenv("PRECOMPILE_CUDA_GRAPHS", "1")
    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    ran = []
    with pytest.raises(
        precompile_build.CaptureError,
        match="cuda-graphs = true needs a CUDA inference "
        "target; this one's arguments are on cpu: drop the option",
    ):
        with precompile_build.capture(
            lambda m, x: ran.append(x) or forward(m, x), engine="frozen", **paths
        ) as f:
            f(_model(1), torch.randn(2, 8))
    assert not (tmp_path / "t.py").exists() and ran == []  # refused before the trace


def test_load_packaged_cuda_graphs_override_is_one_twin_per_setting():
    """load_packaged(cuda_graphs=...) returns one artifact per setting, made once;
    loads without kernels (fallbacks, eager engine) are returned unchanged."""
    from precompile_runtime import loader

    made = []

    class Art:
        uses_kernels, cuda_graphs = True, False

        def with_cuda_graphs(self, enabled):
            made.append(enabled)
            twin = Art()
            twin.cuda_graphs = enabled
            return twin

    done = loader._Loaded(Art(), None, "")
    assert loader._with_graphs(done, None) is done.value
    assert loader._with_graphs(done, False) is done.value
    on = loader._with_graphs(done, True)
    assert on.cuda_graphs and loader._with_graphs(done, True) is on and made == [True]
    plain = Art()
    plain.uses_kernels = False
    assert loader._with_graphs(loader._Loaded(plain, None, ""), True) is plain


def test_two_model_arguments_are_cached_as_a_pair(tmp_path):
    def two(a, b, x):
        return b(a(x))

    a, b, x = nn.Linear(8, 8), nn.Linear(8, 4), torch.randn(2, 8)
    fn = _capture(tmp_path, two, a, b, x)["load"](None)
    torch.testing.assert_close(fn(a, b, x), b(a(x)))
    other = nn.Linear(8, 4)  # same first model, another second one: not the cached tensors
    torch.testing.assert_close(fn(a, other, x), other(a(x)))
    torch.testing.assert_close(fn(a, b, x), b(a(x)))


def test_cuda_graphs_option_with_another_engine_is_a_capture_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PRECOMPILE_CUDA_GRAPHS", "1")
    paths = {"artifact_path": tmp_path / "t.py", "cache_path": tmp_path / "t.cache"}
    with pytest.raises(
        precompile_build.CaptureError,
        match="replays the frozen engine's kernels, but this capture uses engine 'eager'",
    ):
        with precompile_build.capture(forward, engine="eager", **paths) as f:
            f(_model(1), torch.randn(2, 8))


def _double(x):
    return x * 2


def _graphs_ns(ns):
    """``ns`` (an executed pair) with the CUDA graph part that frozen CUDA pairs carry
    (precompile_build/templates/cuda_graphs.py), as if the pair had been captured on CUDA."""
    from precompile_build.engines import codegen

    ns["_META"]["device"] = "cuda"
    exec(compile(codegen._template("cuda_graphs.py"), "cuda_graphs.py", "exec"), ns)
    return ns


def _stand_in_recording(graphs, fail=()):
    """Stand-ins for _CudaGraphs._capture/_recover/_current_stream/_stream_object without a GPU: a
    graph whose replay does nothing and whose output is the recording's first input;
    recording a first input of a size in ``fail`` raises (as a failed capture does)."""

    class Replay:
        def replay(self):
            pass

    def capture(inputs):
        if len(inputs[0]) in fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return Replay(), (inputs[0],)

    graphs._capture = capture
    graphs._recover = lambda: None
    graphs._current_stream = lambda: "stream"
    graphs._stream_object = lambda: None


def test_cuda_graph_bookkeeping_is_bounded(tmp_path):
    """CUDA graphs keep at most max_graphs graphs and max_graphs warm keys without a
    graph, however many input sizes they see; a size whose graph was dropped is
    recorded again at its next call, one forgotten warms up again. Checked without a
    GPU: recording is replaced by a stand-in graph (real graphs: test_gpu_cudagraphs.py)."""
    ns = _capture(tmp_path, _double, torch.randn(3))
    _graphs_ns(ns)
    runs = []
    graphs = ns["_CudaGraphs"](
        lambda flat: runs.append(len(flat[0])) or [flat[0] * 2], True, 2, "graph"
    )

    _stand_in_recording(graphs)
    cuda0 = torch.device("cuda", 0)
    for n in range(1, 11):  # each size twice: a warm-up, then a recording
        graphs([torch.ones(n)], cuda0)
        graphs([torch.ones(n)], cuda0)
    assert graphs.recorded == 10 and runs == list(range(1, 11))
    assert [g.key[1][0] for g in graphs._graphs] == [9, 10] and len(graphs._warm) == 2
    graphs([torch.ones(8)], cuda0)  # dropped recently: still warm, recorded at once
    assert graphs.recorded == 11
    graphs([torch.ones(1)], cuda0)  # dropped long ago: forgotten, warms up again
    assert graphs.recorded == 11 and runs[-1] == 1
    for n in range(11, 50):  # sizes seen once
        graphs([torch.ones(n)], cuda0)
    assert len(graphs._warm) == 2 and len(graphs._graphs) == 2


def test_compute_bound_sizes_are_kept_plain_and_bounded(tmp_path):
    """The second call of each size is a plain run timed on the CPU (issuing it) and
    the GPU, not the first (a cold one: first launches, allocations): at the third call
    a size whose GPU time exceeded 1.5x its CPU time runs plainly from then on, the
    others get a graph; at most max_graphs such sizes are remembered. Checked without
    a GPU: timings and recording are stand-ins (real ones: test_gpu_cudagraphs.py)."""
    ns = _capture(tmp_path, _double, torch.randn(3))
    _graphs_ns(ns)
    runs = []
    graphs = ns["_CudaGraphs"](lambda flat: runs.append(len(flat[0])) or [flat[0] * 2], True, 2)

    class Event:  # the GPU time of the timed run, in ms
        def __init__(self, ms):
            self.ms = ms

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return self.ms

    gpu_ms = {}  # size -> GPU ms of its timed run; its CPU time is 1 ms
    timed = []  # (size, plain runs of that size before it)

    def timed_run(key, flat):
        timed.append((key[1][0], runs.count(key[1][0])))
        graphs._keep_warm(key, (Event(gpu_ms[key[1][0]]), Event(0), 1.0))
        return graphs._run(flat)

    graphs._timed_run = timed_run
    _stand_in_recording(graphs)
    cuda0 = torch.device("cuda", 0)
    gpu_ms.update(
        {1: 1.2, 2: 1.6, 3: 9.0, 4: 9.0, 5: 9.0, 6: 9.0}
    )  # launch-bound, compute-bound x5
    graphs([torch.ones(1)], cuda0)
    assert timed == [] and runs == [1]  # the first call warms up, untimed
    for n in (1, 2):
        for _ in range(3 if n == 2 else 2):
            graphs([torch.ones(n)], cuda0)
    assert timed == [(1, 1), (2, 1)]  # each size's second call is the timed one
    assert (graphs.recorded, graphs.plain) == (1, 1) and runs == [1, 1, 2, 2, 2]  # 2 runs plainly
    assert graphs.last_ratio == pytest.approx(1.6)  # GPU/CPU time of the latest decision
    graphs([torch.ones(2)], cuda0)
    assert runs[-1] == 2 and len(timed) == 2  # plain from then on, not timed again
    for n in (3, 4, 5):
        for _ in range(3):
            graphs([torch.ones(n)], cuda0)
    assert graphs.plain == 4 and [k[1][0] for k in graphs._plain] == [4, 5]  # bounded by max_graphs
    graphs([torch.ones(4)], cuda0)  # a hit: 4 is now the most recently seen
    for _ in range(3):
        graphs([torch.ones(6)], cuda0)
    assert graphs.plain == 5 and [k[1][0] for k in graphs._plain] == [4, 6]  # 5 forgotten, not 4


def test_with_cuda_graphs_checks_its_arguments_first(tmp_path):
    """Bad arguments are ValueErrors naming the argument, for any target and with
    enabled=False too (they were accepted silently there, or hidden behind the CPU
    target's CallError); that CallError says what to change."""
    from _pairs import load_pair

    _capture(tmp_path, forward, _model(), torch.randn(2, 8), engine="frozen")
    fn = load_pair(tmp_path / "t.py", tmp_path / "t.cache")
    bad = [
        ({"max_graphs": 0}, r"max_graphs=0\): max_graphs takes a positive int"),
        ({"max_graphs": True}, r"max_graphs=True\): max_graphs takes a positive int"),
        (
            {"compute_bound": "grpah"},
            r"compute_bound='grpah'\): compute_bound takes 'plain' or 'graph'",
        ),
        ({"copy_outputs": None}, r"copy_outputs=None\): copy_outputs takes True or False"),
        ({"enabled": "no"}, r"enabled='no'\): enabled takes True or False"),
    ]
    for kw, text in bad:
        for enabled in (True, False):
            with pytest.raises(ValueError, match=r"target 't': with_cuda_graphs\(" + text):
                fn.with_cuda_graphs(**{"enabled": enabled, **kw})
    with pytest.raises(
        CallError,
        match=r"captured on cpu: load it without cuda_graphs "
        r"\(with_cuda_graphs\(False\)\), or capture it on a CUDA device",
    ):
        fn.with_cuda_graphs()
    plain = fn.with_cuda_graphs(False, max_graphs=2, compute_bound="graph")
    assert not plain.cuda_graphs and plain.uses_kernels


def test_timed_warm_keys_are_kept_by_recency(tmp_path):
    """Warm keys without a graph are bounded by max_graphs, the least recently seen
    forgotten: a size whose call was just timed outlives sizes first seen before it."""
    ns = _capture(tmp_path, _double, torch.randn(3))
    _graphs_ns(ns)
    graphs = ns["_CudaGraphs"](lambda flat: [flat[0] * 2], True, 2)
    graphs._timed_run = lambda key, flat: (
        graphs._keep_warm(key, (None, None, 1.0)) or graphs._run(flat)
    )
    cuda0 = torch.device("cuda", 0)
    for n in (1, 2, 1, 3):  # 1 warms up, 2 warms up, 1 is timed (now the newest), 3 warms up
        graphs([torch.ones(n)], cuda0)
    assert [k[1][0] for k in graphs._warm] == [1, 3]  # 2, the least recently seen, forgotten


def test_load_packaged_cuda_graphs_on_a_cpu_target_is_a_load_error(tmp_path, monkeypatch):
    """cuda_graphs=True for a target that can never replay graphs is refused when
    loading, with a LoadOptionError (a PrecompileLoadError and a ValueError) that says
    what to pass; the loaded target stays usable."""
    from _fake_packages import file_entry, make_package, on_path

    from precompile_runtime import LoadOptionError, PrecompileLoadError, load_packaged
    from precompile_runtime.envelope import sha256_hex

    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(tmp_path / "kcache"))
    monkeypatch.delenv("PRECOMPILE_STRICT", raising=False)
    p = on_path(monkeypatch, make_package(tmp_path))  # then its pair replaced by a real one
    paths = {"artifact_path": p.data / "fwd.py", "cache_path": p.data / "fwd.cache"}
    with precompile_build.capture(_double, engine="frozen", **paths) as f:
        f(torch.randn(3))
    source, cache = paths["artifact_path"].read_bytes(), paths["cache_path"].read_bytes()
    doc = p.manifest()
    doc["targets"]["fwd"]["variants"][0].update(
        code_hash=sha256_hex(source),
        files={"source": file_entry("fwd.py", source), "cache": file_entry("fwd.cache", cache)},
    )
    p.write_manifest(doc)
    with pytest.raises(
        LoadOptionError,
        match=rf"package '{p.name}', target 'fwd': load_packaged\(\.\.\., "
        r"cuda_graphs=True\): CUDA graphs replay the frozen kernels of CUDA inference "
        r"targets, and this target was captured on cpu\. Drop cuda_graphs=True \(pass "
        r"None or False\); or capture it on a CUDA device",
    ) as ei:
        load_packaged("fwd", package=p.name, cuda_graphs=True)
    assert isinstance(ei.value, PrecompileLoadError) and isinstance(ei.value, ValueError)
    fn = load_packaged("fwd", package=p.name, cuda_graphs=False)
    assert (
        fn.uses_kernels
        and not fn.cuda_graphs
        and torch.equal(fn(torch.ones(3)), torch.full((3,), 2.0))
    )
    with pytest.raises(LoadOptionError, match="use None, True or False"):
        load_packaged("fwd", package=p.name, cuda_graphs="yes")
