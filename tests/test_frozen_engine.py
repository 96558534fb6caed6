"""The frozen engine on CPU: pairs captured through the CLI from a fixture project,
loaded with load_packaged in fresh processes.

Serving compiles nothing: proved with counters in the loading process (subprocesses
started, compile entry points, modules imported), never with a timer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import precompile_build
from precompile_build.errors import CaptureError

torch = pytest.importorskip("torch")

from _pairs import capture_and_load, load_pair_at, marked, pair_paths  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "packages" / "fcases"
# The fixture's targets use device = "auto": captured and checked on CUDA where this
# host has it (the GPU host), else on the CPU (CI). Inductor's fused GPU reductions
# sum in another order than eager's: a looser bound there.
TOL = 1e-4 if torch.cuda.is_available() else 1e-5


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fcases wheel built with a real frontend (`python -m build --no-isolation`;
    its captures run through the backend) and installed into a site directory under
    another prefix: nothing of the build location is left to read."""
    build = tmp_path_factory.mktemp("build") / "fcases"
    shutil.copytree(FIXTURE, build)
    dist = build / "dist"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]),
        PRECOMPILE_BUILD_CACHE_DIR=str(build.parent / "capture-cache"),
    )  # capture for real
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--wheel",
            "--outdir",
            str(dist),
            str(build),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wheel = next(dist.glob("fcases-*.whl"))
    assert "-none-any" not in wheel.name  # frozen native kernels: a platform tag
    site = tmp_path_factory.mktemp("elsewhere") / "site-packages"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    shutil.rmtree(build)
    return site


def run_fresh(site: Path, code: str, tmp_path: Path, **env_extra) -> dict:
    """Run ``code`` in a fresh interpreter with empty compiler caches and a new HOME;
    the code sets ``result`` (a JSON-able dict), which is returned."""
    counters = textwrap.dedent(
        """
        import json, subprocess, sys
        import torch  # (a CUDA build of torch runs ldconfig while importing: not counted)
        spawned = []
        _popen = subprocess.Popen.__init__
        def _count(self, *a, **k):
            spawned.append(str(a[0] if a else k.get("args"))[:200])
            return _popen(self, *a, **k)
        subprocess.Popen.__init__ = _count
        import precompile_runtime
        DEV = "cuda" if torch.cuda.is_available() else "cpu"
        """
    )
    tail = textwrap.dedent(
        """
        result["spawned"] = spawned
        result["compiler_modules"] = sorted(m for m in sys.modules
            if m.startswith(("torch._inductor", "torch._dynamo", "triton")))
        print("RESULT" + json.dumps(result))
        """
    )
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "runtime")]),
        HOME=str(tmp_path / "home"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        PRECOMPILE_CACHE_DIR=str(tmp_path / "kernels"),
        PRECOMPILE_NO_COMPILE="1",
        PRECOMPILE_STRICT="1",
        **env_extra,
    )
    proc = subprocess.run(
        [sys.executable, "-c", counters + "result = {}\n" + textwrap.dedent(code) + tail],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT") :])


BN_CHECK = """
import fcases
step = precompile_runtime.load_packaged("bn_step", package="fcases")
torch.manual_seed(1)
x = torch.randn(8, 16).to(DEV)
ours, ref = fcases.bn_model(device=DEV), fcases.bn_model(device=DEV)
errs = []
for i in range(4):  # grads accumulate and statistics move, step after step
    got = step(ours, x, 0.5)
    want = fcases.bn_step(ref, x, 0.5)
    errs.append(float((got["loss"] - want["loss"]).abs()))
    errs.append(float((got["head"] - want["head"]).abs().max()))
    assert got["scale"] == 0.5
    for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
        errs.append(float((p.grad - q.grad).abs().max()))
    for (n, b), (_, c) in zip(ours.named_buffers(), ref.named_buffers()):
        errs.append(float((b.double() - c.double()).abs().max()))
    if i == 1:  # two serving calls made; torch.optim itself imports torch._dynamo
        result["serving_modules"] = sorted(m for m in sys.modules
            if m.startswith(("torch._inductor", "torch._dynamo", "triton")))
        opt_ours = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    if i >= 1:  # after the first step (grads accumulated once more): an optimizer step
        opt_ours.step(); opt_ref.step(); opt_ours.zero_grad(); opt_ref.zero_grad()
for (n, p), (_, q) in zip(ours.named_parameters(), ref.named_parameters()):
    errs.append(float((p - q).abs().max()))  # the weights the optimizer moved track eager
result["max_err"] = max(errs)
result["uses_kernels"] = step.uses_kernels
result["batches"] = int(ours[1].num_batches_tracked)
"""


@pytest.mark.slow  # the installed fixture builds with python -m build and pip
def test_training_step_with_buffers_matches_eager_and_compiles_nothing(installed, tmp_path):
    r = run_fresh(installed, BN_CHECK, tmp_path)
    assert r["uses_kernels"] is True
    assert r["max_err"] < TOL
    assert r["batches"] == 4
    assert r["spawned"] == []  # no C++ compiler, no probe programs
    assert r["serving_modules"] == []  # no torch._inductor / torch._dynamo / triton import
    # unpacked into the process's own folder of the per-user cache, removed at its exit
    assert (tmp_path / "kernels").is_dir() and not list((tmp_path / "kernels").iterdir())


TIED_CHECK = """
import fcases
fwd = precompile_runtime.load_packaged("tied_forward", package="fcases")
ids = fcases.example_ids(DEV)
ours, ref = fcases.tied_model(device=DEV), fcases.tied_model(device=DEV)
(out, stats) = fwd(ours, ids)
(want, wstats) = fcases.tied_forward(ref, ids)
result["types"] = [type(out).__name__, type(stats).__name__, repr(out.extra)]
result["logits_err"] = float((out.logits - want.logits).abs().max())
result["loss_err"] = float((stats.loss - wstats.loss).abs())
result["emb_grad_err"] = float((ours.emb.weight.grad - ref.emb.weight.grad).abs().max())
result["tied_still"] = ours.head.weight is ours.emb.weight
result["frozen_grad_none"] = ours.proj.bias.grad is None
result["steps"] = int(ours.steps)
# a checkpoint: same structure, other weights -> the checkpoint's results
ck, ck_ref = fcases.tied_model(seed=5, device=DEV), fcases.tied_model(seed=5, device=DEV)
result["checkpoint_err"] = float((fwd(ck, ids)[0].logits - fcases.tied_forward(ck_ref, ids)[0].logits).abs().max())
"""


@pytest.mark.slow  # the installed fixture builds with python -m build and pip
def test_tied_weights_frozen_param_structured_outputs(installed, tmp_path):
    r = run_fresh(installed, TIED_CHECK, tmp_path)
    assert r["types"] == ["Out", "Stats", "None"]
    assert r["logits_err"] < TOL and r["loss_err"] < TOL and r["checkpoint_err"] < TOL
    assert r["emb_grad_err"] < TOL  # the grads of both uses of the tied weight, summed
    assert r["tied_still"] and r["frozen_grad_none"]
    assert r["steps"] == 1
    assert r["spawned"] == [] and r["compiler_modules"] == []


# child code: each call in `refused` must raise CallError; its message (or "no error")
# goes into result[name]
_COLLECT_REFUSALS = """
for name, call in refused.items():
    try:
        call()
        result[name] = "no error"
    except precompile_runtime.CallError as e:
        result[name] = str(e)
"""

BAD_CALLS = (
    """
import fcases
step = precompile_runtime.load_packaged("bn_step", package="fcases")
m = fcases.bn_model(device=DEV)
x = torch.randn(8, 16).to(DEV)
refused = {
    "dtype": lambda: step(m, x.double(), 0.5),
    "shape": lambda: step(m, torch.randn(4, 16).to(DEV), 0.5),
    "stride": lambda: step(m, torch.randn(16, 8).to(DEV).t(), 0.5),
    "constant": lambda: step(m, x, 0.25),
    "structure": lambda: step(torch.nn.Sequential(torch.nn.Linear(16, 4)).to(DEV), x, 0.5),
    "not a module": lambda: step(x, x, 0.5),
    "eval mode": lambda: step(fcases.bn_model(device=DEV).eval(), x, 0.5),
    "keywords": lambda: step(model=m, x=x, scale=0.5),
}
"""
    + _COLLECT_REFUSALS
)


@pytest.mark.slow  # the installed fixture builds with python -m build and pip
def test_calls_unlike_the_capture_are_refused(installed, tmp_path):
    r = run_fresh(installed, BAD_CALLS, tmp_path)
    assert "dtype torch.float64 (captured torch.float32)" in r["dtype"]
    assert "shape [4, 16] (captured [8, 16])" in r["shape"]
    assert ".contiguous()" in r["stride"]
    assert "specialised on 0.5, got 0.25" in r["constant"]
    assert "captured structure" in r["structure"]
    assert "argument 'model': expected an nn.Module" in r["not a module"]
    assert "argument 'x'" in r["dtype"] and "fixed at capture" in r["dtype"]
    assert (
        "call model.train()" in r["eval mode"]
    )  # else dropout/batch norm would run in the wrong mode
    assert (
        "called with 0 positional argument(s) and keyword(s) ['model', 'scale', 'x']"
        in r["keywords"]
    )


@pytest.mark.slow  # the installed fixture builds with python -m build and pip
def test_fallback_without_kernels_gives_the_same_result(installed, tmp_path):
    """The source half runs on its own: load(None) runs the captured graph."""
    code = BN_CHECK.replace(
        'step = precompile_runtime.load_packaged("bn_step", package="fcases")',
        "import importlib.resources as r\n"
        "src = (r.files('fcases') / '_precompiled' / 'bn_step.py').read_bytes()\n"
        "ns = {'__name__': 'pair'}\n"
        "exec(compile(src, 'bn_step.py', 'exec'), ns)\n"
        "step = ns['load'](None)",
    )
    r = run_fresh(installed, code, tmp_path)
    assert r["uses_kernels"] is False
    assert r["max_err"] < TOL


# ---- capture-time errors: nothing written, a message that says what to change ----


@pytest.mark.slow  # the installed fixture builds with python -m build and pip
def test_manifest_and_inspect_carry_the_validation_numbers(installed):
    # every target's variant records how its kernels were judged at capture
    from precompile_build.wheels.inspect_cmd import format_report, inspect_report

    doc = json.loads((installed / "fcases" / "_precompiled" / "manifest.json").read_text())
    assert sorted(doc["targets"]) == ["bn_step", "dyn_step", "mixed", "tied_forward"]
    for name, t in doc["targets"].items():
        (v,) = t["variants"]
        val = v["validation"]
        assert val["reference"] == "float64", name
        for case in val["cases"]:
            w = case["worst"]
            assert case["values"] >= 1 and w["value"], name
            assert (
                w["accepted_by"] == "elementwise"
                or 0 <= w["frozen_error"] <= (w["multiple"] * w["eager_error"] + w["floor"]) * 1.01
            ), name
            assert w["multiple"] in (2.0, 3.0), name
        assert val["eager_call"]["outcome"] == "ok", name
    cases = doc["targets"]["dyn_step"]["variants"][0]["validation"]["cases"]
    assert cases[0]["case"] == "the example inputs" and len(cases) > 1  # the other sizes too
    step = doc["targets"]["bn_step"]["variants"][0]["validation"]["cases"][0]
    assert step["values"] > 3  # outputs, gradients and the buffers it updates
    text = format_report(inspect_report(str(installed / "fcases")))
    assert text.count("validated against a float64 reference") == 4
    assert re.search(
        r"the example inputs: worst .*: frozen error [0-9.e-]+, eager [0-9.e-]+, "
        r"allowed [23] x eager",
        text,
    )
    assert text.count("vs the eager call: ok") == 4


MIXED = """
import fcases
fn = precompile_runtime.load_packaged("mixed", package="fcases")
torch.manual_seed(2)
x = torch.randn(4, 8).to(DEV)
got, want = fn(*fcases.mixed_models(device=DEV), x), fcases.mixed(*fcases.mixed_models(device=DEV), x)
result["dtypes"] = [str(t.dtype) for t in got]
result["errs"] = [float((g.float() - w.float()).abs().max()) for g, w in zip(got, want)]
"""


@pytest.mark.slow  # the installed fixture builds with python -m build and pip
def test_bf16_fp16_models_and_autocast(installed, tmp_path):
    r = run_fresh(installed, MIXED, tmp_path)
    assert r["dtypes"] == [
        "torch.bfloat16",
        "torch.float16",
        "torch.bfloat16",
    ]  # autocast's output dtype kept
    assert max(r["errs"]) < 3e-2  # bf16/fp16 rounding: Inductor fuses where eager rounds per op
    assert r["spawned"] == [] and r["compiler_modules"] == []


DYN_CHECK = (
    """
import fcases
step = precompile_runtime.load_packaged("dyn_step", package="fcases")
sizes = [(2, 2), (3, 5), (8, 16), (5, 11)]  # the range ends, the example, another size
served = {}
for B, T in sizes:
    ids, targets = fcases.attn_batch(B, T, seed=B * T, device=DEV)
    model = fcases.attn_model(device=DEV)
    for _ in range(2):  # grads accumulate over two calls
        out = step(model, ids, targets)
    served[(B, T)] = (model, out)
m = fcases.attn_model(device=DEV)
ids, targets = fcases.attn_batch(4, 6, device=DEV)
refused = {
    "batch below": lambda: step(m, *fcases.attn_batch(1, 6, device=DEV)),
    "batch above": lambda: step(m, *fcases.attn_batch(9, 6, device=DEV)),
    "seq above": lambda: step(m, *fcases.attn_batch(4, 17, device=DEV)),
    "guard": lambda: step(m, ids, targets[:, :5]),
    "stride": lambda: step(m, ids.t().contiguous().t(), targets),
    "dtype": lambda: step(m, ids.int(), targets),
    "rank": lambda: step(m, ids[0], targets),
}
"""
    + _COLLECT_REFUSALS
    + """
# what serving did, before the eager references run (eager attention may probe libraries)
result["serving_spawned"] = list(spawned)
result["serving_modules"] = sorted(m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo", "triton")))
errs = {}
for (B, T), (ours, (logits, loss)) in served.items():
    ids, targets = fcases.attn_batch(B, T, seed=B * T, device=DEV)
    ref = fcases.attn_model(device=DEV)
    for _ in range(2):
        wlogits, wloss = fcases.attn_step(ref, ids, targets)
    e = [float((logits - wlogits).abs().max()), float((loss - wloss).abs())]
    e += [float((p.grad - q.grad).abs().max()) for p, q in zip(ours.parameters(), ref.parameters())]
    errs[f"{B}x{T}"] = [list(logits.shape), max(e)]
result["errs"] = errs
"""
)


@pytest.mark.slow  # the installed fixture builds with python -m build and pip
def test_dynamic_batch_and_sequence_serve_their_range_and_refuse_the_rest(installed, tmp_path):
    r = run_fresh(installed, DYN_CHECK, tmp_path)
    for size, (shape, err) in r["errs"].items():
        b, t = map(int, size.split("x"))
        assert shape == [b, t, 32], size
        assert err < TOL, size
    assert "argument 'ids' dim 0: size 1 is outside the range [2, 8]" in r["batch below"]
    assert "argument 'ids' dim 0: size 9 is outside the range [2, 8]" in r["batch above"]
    assert "argument 'ids' dim 1: size 17 is outside the range [2, 16]" in r["seq above"]
    assert "the captured code relies on" in r["guard"]  # cross_entropy: B*T of both equal
    assert "the captured layout at these sizes is [6, 1]" in r["stride"]
    assert "dtype torch.int32 (captured torch.int64)" in r["dtype"]
    assert "Only the dims marked dynamic" in r["rank"]
    assert r["serving_spawned"] == [] and r["serving_modules"] == []


def test_call_errors_name_what_differs(tmp_path):
    """A shape error shows dynamic dims as ranges (no internal symbol); a submodule of
    another class is named as such (the guards); a structure error shows the first
    parameter names that differ, captured vs given."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    x = marked(2, 4, 8, lo=2, hi=64, dims=(1,))
    with precompile_build.capture(lambda m, x: m(x), engine="eager", **pair_paths(tmp_path)) as f:
        f(model, x)
    from precompile_runtime import CallError

    fn = load_pair_at(tmp_path)
    with pytest.raises(CallError) as ei:
        fn(model, torch.randn(3, 5, 8))
    assert "shape [3, 5, 8] (captured [2, 2..64, 8])" in str(ei.value)
    assert "'s" not in str(ei.value)
    reordered = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8), torch.nn.ReLU())
    with pytest.raises(
        CallError,
        match=r"m\[1\] was a torch\.nn\.modules\.activation\.ReLU at capture, "
        r"now a torch\.nn\.modules\.linear\.Linear",
    ):
        fn(reordered, torch.randn(2, 4, 8))
    no_bias = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8, bias=False)
    )
    with pytest.raises(
        CallError,
        match=re.escape(
            "has 3 parameters/buffers, the capture lifted 4; they first differ at #3: captured "
            "['m.2.bias'], given nothing more"
        ),
    ):
        fn(no_bias, torch.randn(2, 4, 8))


def test_a_python_number_result_says_return_the_tensor(tmp_path):
    with pytest.raises(
        CaptureError,
        match=r"the result is a Python number computed while tracing "
        r"\(Sym\w+: from \.item\(\).*cannot be a result.*return the tensor instead",
    ):
        with precompile_build.capture(
            lambda x: (x * 2).sum().item(), engine="eager", **pair_paths(tmp_path)
        ) as f:
            f(torch.randn(4, 8))
    assert not list(tmp_path.iterdir())


def test_closed_over_tensor_is_refused(tmp_path):
    w = torch.randn(4, 4)

    def fn(x):
        return x @ w

    with pytest.raises(CaptureError, match="register_buffer"):
        with precompile_build.capture(fn, engine="eager", **pair_paths(tmp_path)) as f:
            f(torch.randn(2, 4))
    assert not list(tmp_path.iterdir())


def test_block_without_call_writes_nothing(tmp_path):
    with pytest.raises(CaptureError, match="made no call"):
        with precompile_build.capture(torch.relu, engine="eager", **pair_paths(tmp_path)):
            pass
    assert not list(tmp_path.iterdir())


def test_block_that_raised_writes_nothing(tmp_path, capsys):
    with pytest.raises(KeyError):
        with precompile_build.capture(torch.relu, engine="eager", **pair_paths(tmp_path)) as f:
            f(torch.randn(3))
            raise KeyError("user error")
    assert not list(tmp_path.iterdir())
    assert "nothing written" in capsys.readouterr().err


def test_unsupported_argument_type_is_named(tmp_path):
    with pytest.raises(CaptureError, match=r"argument 'o' is a object"):
        with precompile_build.capture(lambda x, o: x, engine="eager", **pair_paths(tmp_path)) as f:
            f(torch.randn(3), object())


def test_missing_paths_say_what_to_pass(monkeypatch):
    monkeypatch.delenv("PRECOMPILE_ARTIFACT_PATH", raising=False)
    monkeypatch.delenv("PRECOMPILE_CACHE_PATH", raising=False)
    with pytest.raises(CaptureError, match="artifact_path= and cache_path=") as e:
        precompile_build.capture(torch.relu)
    # a script run by hand (python capture/x.py) is told how to run it instead
    assert "`python -m build`" in str(e.value), str(e.value)
    assert "`python -m precompile_build capture [--targets NAME]`" in str(e.value), str(e.value)


def test_eager_engine_pair_round_trip(tmp_path):
    """The eager engine: graph only; an envelope with no blobs, bound by code_hash."""
    from precompile_build.builder.pairs import inspect_pair

    lin = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3)
    with precompile_build.capture(
        lambda m, x: m(x).relu(), engine="eager", **pair_paths(tmp_path)
    ) as f:
        want = f(lin, x)
    info = inspect_pair(tmp_path / "t.py", tmp_path / "t.cache")
    assert info.engine == "eager"
    ns: dict = {"__name__": "pair"}
    exec(compile((tmp_path / "t.py").read_bytes(), "t.py", "exec"), ns)
    got = ns["load"](None)(lin, x)
    torch.testing.assert_close(got, want)


def test_an_input_the_function_writes_to_may_not_share_memory_with_another(tmp_path):
    def ema(avg, x):
        avg.mul_(0.5).add_(x)
        return avg * 1.0

    fn = capture_and_load(tmp_path / "pair", ema, torch.ones(4, 3), torch.ones(4, 3))
    from precompile_runtime import CallError

    t = torch.ones(4, 3)
    with pytest.raises(
        CallError,
        match=r"argument 'avg' shares memory with argument 'x', and the captured "
        r"function writes to it; pass separate tensors",
    ):
        fn(t, t)
    torch.testing.assert_close(fn(torch.ones(4, 3), torch.ones(4, 3)), torch.full((4, 3), 1.5))
    avg = torch.ones(4, 3)  # after passing calls (the verdict is kept), a view of it as x is caught
    for _ in range(2):
        fn(avg, torch.ones(4, 3))
    with pytest.raises(CallError, match=r"argument 'avg' shares memory with argument 'x'"):
        fn(avg, avg[:])
    # inputs only read may share memory (ids and targets cut from one buffer)
    fn = capture_and_load(tmp_path / "read", lambda a, b: a + b, torch.ones(4, 3), torch.ones(4, 3))
    buf = torch.arange(24.0)
    a, b = buf[:12].view(4, 3), buf[12:].view(4, 3)
    torch.testing.assert_close(fn(a, b), a + b)


def test_one_path_for_both_halves_is_refused(tmp_path):
    with pytest.raises(CaptureError, match=r"artifact_path and cache_path are both .*two files"):
        precompile_build.capture(
            lambda x: x, artifact_path=tmp_path / "t", cache_path=tmp_path / "t"
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"artifact_path": 123}, r"artifact_path=123 must be a file path"),
        (
            {"cache_path": "."},
            r"cache_path='.' must be a file path \(str or os.PathLike\), not a directory",
        ),
        ({"options": "abc"}, r"options must be a dict, e.g. \{'inductor': \{...\}\}, not str"),
    ],
)
def test_capture_arguments_of_the_wrong_kind_say_which(tmp_path, kwargs, message):
    args = dict(pair_paths(tmp_path), **kwargs)
    with pytest.raises(TypeError, match=message):
        precompile_build.capture(lambda x: x, **args)


def test_an_argument_that_contains_itself_is_refused(tmp_path):
    loop = [torch.randn(2)]
    loop.append(loop)
    with pytest.raises(CaptureError, match="an argument contains itself"):
        with precompile_build.capture(lambda x: x[0], engine="eager", **pair_paths(tmp_path)) as f:
            f(loop)
    assert not list(tmp_path.iterdir())
    shared = [torch.randn(2)]  # the same list twice is fine
    with precompile_build.capture(
        lambda a, b: a[0] + b[0], engine="eager", **pair_paths(tmp_path)
    ) as f:
        f(shared, shared)
    assert (tmp_path / "t.py").exists()


def _random_ops(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand(x.shape)


def test_torch_random_ops_are_served_with_torch_rng(tmp_path):
    """Dropout and torch.rand in a frozen pair draw from torch's generator, as eager
    does: a fresh mask per call, and eager's values under torch.manual_seed."""
    x = torch.randn(4, 64)
    with warnings.catch_warnings():
        warnings.simplefilter(
            "error", precompile_build.PythonStateWarning
        )  # torch's RNG: no warning
        served = capture_and_load(tmp_path / "p", _random_ops, x)
    assert served.uses_kernels
    torch.manual_seed(7)
    first, second = served(x), served(x)
    assert not torch.equal(first, second)  # a fresh mask and fresh uniforms per call
    torch.manual_seed(7)
    torch.testing.assert_close(served(x), first, rtol=0, atol=0)  # reproducible
    torch.manual_seed(7)
    torch.testing.assert_close(first, _random_ops(x))  # the same values as eager
    torch.manual_seed(3)
    with precompile_build.capture(_random_ops, engine="frozen", **pair_paths(tmp_path / "p")) as f:
        during = f(x)  # the capture's own draws are not taken from the caller's RNG
    torch.manual_seed(3)
    torch.testing.assert_close(during, _random_ops(x))
    dropped = float(served(torch.ones(4, 64)).lt(1).float().mean())  # kept: 2 + U[0, 1)
    assert 0.2 < dropped < 0.8, dropped


@pytest.mark.parametrize("rng", ["random", "numpy.random"])
def test_python_random_in_the_function_is_refused_or_frozen_with_a_warning(tmp_path, rng):
    """Python's random module (and numpy's) runs once, at capture: the value it drew is
    a constant of the pair. torch.compile cannot trace the draw in one graph, so the
    capture refuses, naming the line; with ``guards="recorded"`` it captures and says
    that the value is frozen."""
    if rng == "random":
        import random

        draw = random.random
    else:
        draw = pytest.importorskip("numpy").random.rand

    def fn(x):
        return x * float(draw())

    x = torch.ones(3)
    with pytest.raises(
        CaptureError,
        match=r"(cannot trace this function in one graph.*line \d+, in fn|"
        rf"the function drew from {rng} while it was captured).*"
        r"options=\{\"guards\": \"recorded\"\}",
    ):
        with precompile_build.capture(fn, engine="frozen", **pair_paths(tmp_path / "refused")) as f:
            f(x)
    assert not (tmp_path / "refused").exists()
    with pytest.warns(
        precompile_build.PythonStateWarning,
        match=rf"target 't': the function drew from {rng} while it was captured; "
        r"Python code runs once, at capture, and never when the pair is served",
    ) as rec:
        with precompile_build.capture(
            fn, engine="frozen", options={"guards": "recorded"}, **pair_paths(tmp_path)
        ) as f:  # (here: the warning names
            f(x)  # the with-block's line, in this file)
    served = load_pair_at(tmp_path)
    assert [
        w.filename for w in rec if isinstance(w.message, precompile_build.PythonStateWarning)
    ] == [__file__]
    a, b = served(x), served(x)
    assert torch.equal(a, b)  # frozen: what the warning says
    if rng == "random":
        with warnings.catch_warnings():  # a function without Python randomness: no warning
            warnings.simplefilter("error", precompile_build.PythonStateWarning)
            capture_and_load(tmp_path / "q", lambda x: x * 2, x)


def _scaled_softmax(x):
    return torch.softmax(x * 3, dim=-1) + 1


def _branches(x):
    return torch.cond(
        x.sum() > 0, lambda t: torch.softmax(t * 3, dim=-1), lambda t: t.cos() + 1, (x,)
    )


@pytest.mark.parametrize(
    "fn, device, user, tuned_at_compile",
    [
        (_scaled_softmax, "cpu", None, True),  # left as standalone_compile sets it
        (_scaled_softmax, "cuda", None, False),  # autotuned in the first run
        (_branches, "cuda", None, True),  # a branch the first run does not launch
        (_scaled_softmax, "cpu", False, False),
        (_scaled_softmax, "cuda", True, True),
        (_branches, "cuda", False, False),
    ],
    ids=["cpu", "cuda", "cuda_cond", "user_off", "user_on", "user_off_cond"],
)
def test_cuda_kernels_autotune_in_the_first_run_not_at_compile_time(
    tmp_path, monkeypatch, torch_config, fn, device, user, tuned_at_compile
):
    """standalone_compile turns on Inductor's ``triton.autotune_at_compile_time`` (the
    code generation waits for every kernel, then defines them again to tune them). A
    CUDA capture compiles with it off, as torch.compile does (its first run
    autotunes), but for graphs that branch (torch.cond: a branch the first run
    never launches would keep every config); the user's value in options['inductor']
    wins; CPU captures are left alone. Here a CPU capture stands in for a CUDA one (the
    device the decision is given), so the setting is seen where Inductor generates
    code; each pair serves."""
    from torch._inductor import config
    from torch._inductor.graph import GraphLowering

    from precompile_build.engines import frozen

    torch_config(config, fx_graph_cache=False)  # the code is generated now
    torch_config(torch._functorch.config, enable_autograd_cache=False)
    decide = frozen._standalone_options
    monkeypatch.setattr(frozen, "_standalone_options", lambda gm, _device, u: decide(gm, device, u))
    seen = []
    codegen = GraphLowering.codegen

    def spy(self, *args, **kwargs):
        seen.append(config.triton.autotune_at_compile_time)
        return codegen(self, *args, **kwargs)

    monkeypatch.setattr(GraphLowering, "codegen", spy)
    options = None if user is None else {"inductor": {"triton.autotune_at_compile_time": user}}
    x = torch.randn(8, 33)
    with precompile_build.capture(
        fn, engine="frozen", options=options, **pair_paths(tmp_path)
    ) as f:
        f(x)
    assert seen and set(seen) == {tuned_at_compile}, seen
    served = load_pair_at(tmp_path)
    torch.testing.assert_close(served(x), fn(x))
    if fn is _branches:
        torch.testing.assert_close(served(-x.abs()), fn(-x.abs()))  # the other branch


def test_graphs_that_branch_are_found_at_any_depth():
    """What keeps the compile-time tuning on: a cond or while_loop in the graph or in
    one of its subgraphs; a graph without them does not."""
    from torch._higher_order_ops.while_loop import while_loop

    from precompile_build.engines.frozen import _branches

    def count_up(x):
        return while_loop(lambda i, t: i < 3, lambda i, t: (i + 1, t * 2), (torch.tensor(0), x))

    def nested(x):
        return torch.cond(x.sum() > 0, lambda t: count_up(t)[1], lambda t: t - 1, (x,))

    x = torch.randn(4)
    graphs = {
        name: torch.export.export(_Wrap(fn), (x,)).graph_module
        for name, fn in (("plain", _scaled_softmax), ("while", count_up), ("nested", nested))
    }
    assert {name: _branches(gm) for name, gm in graphs.items()} == {
        "plain": False,
        "while": True,
        "nested": True,
    }
    # a graph whose own nodes do not branch, calling one that does (the cond's branch with the while_loop)
    root = torch.nn.Module()
    root.sub = next(m for m in graphs["nested"].children() if _branches(m))
    graph = torch.fx.Graph()
    graph.output(graph.call_module("sub", (graph.placeholder("x"),)))
    assert _branches(torch.fx.GraphModule(root, graph))


def test_a_kernel_the_example_never_launched_is_refused_saying_why():
    """An autotuner still holding every config after the example run (a branch the
    example did not take, tuned nowhere) is a CaptureError that names the kernel, the
    likely cause and what to capture with instead."""
    from precompile_build.engines.triton_freeze import freeze_triton_kernel

    autotuner = type("A", (), {"launchers": [object(), object()]})()
    with pytest.raises(
        CaptureError,
        match=r"triton_poi_fused_cos_0.*2 launchers after the example run.*"
        r"torch.cond or while_loop branch.*engine='torch' or engine='eager'",
    ):
        freeze_triton_kernel("triton_poi_fused_cos_0", autotuner, "t")


def test_the_compile_workers_start_on_a_torch_without_maybe_warm_pool(monkeypatch):
    """Where torch has no ``maybe_warm_pool``, the capture starts the pool's sidecar and
    then wakes its workers itself (what maybe_warm_pool does)."""
    from torch._inductor import async_compile

    from precompile_build.engines.triton_freeze import start_compile_workers

    calls = []
    monkeypatch.delattr(async_compile, "maybe_warm_pool", raising=False)
    monkeypatch.setattr(
        async_compile.AsyncCompile, "warm_pool", classmethod(lambda cls: calls.append("warm_pool"))
    )
    monkeypatch.setattr(
        async_compile.AsyncCompile,
        "wakeup",
        classmethod(lambda cls: calls.append("wakeup")),
        raising=False,
    )
    start_compile_workers()
    assert calls == ["warm_pool", "wakeup"]


class _Wrap(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)
