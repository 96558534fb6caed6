"""The frozen engine on CPU: pairs captured through the CLI from a fixture project,
loaded with load_packaged in fresh processes.

Serving compiles nothing: proved with counters in the loading process (subprocesses
started, compile entry points, modules imported), never with a timer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import precompile_build
from precompile_build.errors import CaptureError

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "packages" / "fcases"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The fcases wheel built with a real frontend (`python -m build --no-isolation`;
    its captures run through the backend) and installed into a site directory under
    another prefix: nothing of the build location is left to read."""
    build = tmp_path_factory.mktemp("build") / "fcases"
    shutil.copytree(FIXTURE, build)
    dist = build / "dist"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]),
               PRECOMPILE_BUILD_CACHE_DIR=str(build.parent / "capture-cache"))  # capture for real
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(dist), str(build)],
        check=True, env=env, capture_output=True,
    )
    wheel = next(dist.glob("fcases-*.whl"))
    assert "-none-any" not in wheel.name  # frozen native kernels: a platform tag
    site = tmp_path_factory.mktemp("elsewhere") / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    shutil.rmtree(build)
    return site


def run_fresh(site: Path, code: str, tmp_path: Path, **env_extra) -> dict:
    """Run ``code`` in a fresh interpreter with empty compiler caches and a new HOME;
    the code sets ``result`` (a JSON-able dict), which is returned."""
    counters = textwrap.dedent(
        """
        import json, subprocess, sys
        spawned = []
        _popen = subprocess.Popen.__init__
        def _count(self, *a, **k):
            spawned.append(str(a[0] if a else k.get("args"))[:200])
            return _popen(self, *a, **k)
        subprocess.Popen.__init__ = _count
        import torch
        import precompile_runtime
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
        env=env, capture_output=True, text=True, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):])


BN_CHECK = """
import fcases
step = precompile_runtime.load_packaged("bn_step", package="fcases")
torch.manual_seed(1)
x = torch.randn(8, 16)
ours, ref = fcases.bn_model(), fcases.bn_model()
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


def test_training_step_with_buffers_matches_eager_and_compiles_nothing(installed, tmp_path):
    r = run_fresh(installed, BN_CHECK, tmp_path)
    assert r["uses_kernels"] is True
    assert r["max_err"] < 1e-5
    assert r["batches"] == 4
    assert r["spawned"] == []  # no C++ compiler, no probe programs
    assert r["serving_modules"] == []  # no torch._inductor / torch._dynamo / triton import
    kernels = list((tmp_path / "kernels").rglob("*.so"))
    assert kernels, "the frozen .so kernels are unpacked into the per-user cache"


TIED_CHECK = """
import fcases
fwd = precompile_runtime.load_packaged("tied_forward", package="fcases")
ids = fcases.example_ids()
ours, ref = fcases.tied_model(), fcases.tied_model()
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
ck, ck_ref = fcases.tied_model(seed=5), fcases.tied_model(seed=5)
result["checkpoint_err"] = float((fwd(ck, ids)[0].logits - fcases.tied_forward(ck_ref, ids)[0].logits).abs().max())
"""


def test_tied_weights_frozen_param_structured_outputs(installed, tmp_path):
    r = run_fresh(installed, TIED_CHECK, tmp_path)
    assert r["types"] == ["Out", "Stats", "None"]
    assert r["logits_err"] < 1e-5 and r["loss_err"] < 1e-5 and r["checkpoint_err"] < 1e-5
    assert r["emb_grad_err"] < 1e-5  # the grads of both uses of the tied weight, summed
    assert r["tied_still"] and r["frozen_grad_none"]
    assert r["steps"] == 1
    assert r["spawned"] == [] and r["compiler_modules"] == []


BAD_CALLS = """
import fcases
step = precompile_runtime.load_packaged("bn_step", package="fcases")
m = fcases.bn_model()
x = torch.randn(8, 16)
cases = {
    "dtype": lambda: step(m, x.double(), 0.5),
    "shape": lambda: step(m, torch.randn(4, 16), 0.5),
    "stride": lambda: step(m, torch.randn(16, 8).t(), 0.5),
    "constant": lambda: step(m, x, 0.25),
    "structure": lambda: step(torch.nn.Sequential(torch.nn.Linear(16, 4)), x, 0.5),
    "not a module": lambda: step(x, x, 0.5),
    "eval mode": lambda: step(fcases.bn_model().eval(), x, 0.5),
    "keywords": lambda: step(model=m, x=x, scale=0.5),
}
for name, call in cases.items():
    try:
        call()
        result[name] = "no error"
    except precompile_runtime.CallError as e:
        result[name] = str(e)
"""


def test_calls_unlike_the_capture_are_refused(installed, tmp_path):
    r = run_fresh(installed, BAD_CALLS, tmp_path)
    assert "dtype torch.float64 (captured torch.float32)" in r["dtype"]
    assert "shape [4, 16] (captured [8, 16])" in r["shape"]
    assert ".contiguous()" in r["stride"]
    assert "specialised on 0.5, got 0.25" in r["constant"]
    assert "captured structure" in r["structure"]
    assert "argument 'model': expected an nn.Module" in r["not a module"]
    assert "argument 'x'" in r["dtype"] and "fixed at capture" in r["dtype"]
    assert "call model.train()" in r["eval mode"]  # else dropout/batch norm would run in the wrong mode
    assert "called with 0 positional argument(s) and keyword(s) ['model', 'scale', 'x']" in r["keywords"]


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
    assert r["max_err"] < 1e-5


# ---- capture-time errors: nothing written, a message that says what to change ----

def _paths(tmp_path):
    return dict(artifact_path=tmp_path / "t.py", cache_path=tmp_path / "t.cache")


MIXED = """
import fcases
fn = precompile_runtime.load_packaged("mixed", package="fcases")
torch.manual_seed(2)
x = torch.randn(4, 8)
(y, z), (wy, wz) = fn(*fcases.mixed_models(), x), fcases.mixed(*fcases.mixed_models(), x)
result["dtypes"] = [str(y.dtype), str(z.dtype)]
result["errs"] = [float((y.float() - wy.float()).abs().max()), float((z.float() - wz.float()).abs().max())]
"""


def test_bf16_model_and_autocast(installed, tmp_path):
    r = run_fresh(installed, MIXED, tmp_path)
    assert r["dtypes"] == ["torch.bfloat16", "torch.bfloat16"]  # autocast's output dtype kept
    assert max(r["errs"]) < 3e-2  # bf16 rounding: Inductor fuses where eager rounds per op
    assert r["spawned"] == [] and r["compiler_modules"] == []


def test_closed_over_tensor_is_refused(tmp_path):
    w = torch.randn(4, 4)

    def fn(x):
        return x @ w

    with pytest.raises(CaptureError, match="register_buffer"):
        with precompile_build.capture(fn, engine="eager", **_paths(tmp_path)) as f:
            f(torch.randn(2, 4))
    assert not list(tmp_path.iterdir())


def test_block_without_call_writes_nothing(tmp_path):
    with pytest.raises(CaptureError, match="made no call"):
        with precompile_build.capture(torch.relu, engine="eager", **_paths(tmp_path)):
            pass
    assert not list(tmp_path.iterdir())


def test_block_that_raised_writes_nothing(tmp_path, capsys):
    with pytest.raises(KeyError):
        with precompile_build.capture(torch.relu, engine="eager", **_paths(tmp_path)) as f:
            f(torch.randn(3))
            raise KeyError("user error")
    assert not list(tmp_path.iterdir())
    assert "nothing written" in capsys.readouterr().err


def test_unsupported_argument_type_is_named(tmp_path):
    with pytest.raises(CaptureError, match=r"args\[1\] is a object"):
        with precompile_build.capture(lambda x, o: x, engine="eager", **_paths(tmp_path)) as f:
            f(torch.randn(3), object())


def test_missing_paths_say_what_to_pass(monkeypatch):
    monkeypatch.delenv("PRECOMPILE_ARTIFACT_PATH", raising=False)
    monkeypatch.delenv("PRECOMPILE_CACHE_PATH", raising=False)
    with pytest.raises(CaptureError, match="artifact_path= and cache_path="):
        precompile_build.capture(torch.relu)


def test_eager_engine_pair_round_trip(tmp_path):
    """The eager engine: graph only; an envelope with no blobs, bound by code_hash."""
    from precompile_build.pairs import inspect_pair

    lin = torch.nn.Linear(3, 2)
    x = torch.randn(5, 3)
    with precompile_build.capture(lambda m, x: m(x).relu(), engine="eager", **_paths(tmp_path)) as f:
        want = f(lin, x)
    info = inspect_pair(tmp_path / "t.py", tmp_path / "t.cache")
    assert info.engine == "eager"
    ns: dict = {"__name__": "pair"}
    exec(compile((tmp_path / "t.py").read_bytes(), "t.py", "exec"), ns)
    got = ns["load"](None)(lin, x)
    torch.testing.assert_close(got, want)
