"""The ``torch`` engine: pairs made and loaded by ``torch.compiler.precompile``.

Real tests need a torch with ``torch.compiler.precompile`` (torch 2.14.1 here) and are
skipped with a reason elsewhere. The newer capture/load-by-path generation is exercised
against its documented behaviour with a fake ``torch.compiler.precompile`` (these run
under any torch).
"""

from __future__ import annotations

import copy
import hashlib
import io
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from precompile_build.engines import torch_engine  # noqa: E402
from precompile_build.errors import CaptureError  # noqa: E402
from precompile_runtime import torch_pairs  # noqa: E402
from precompile_runtime.errors import IntegrityError, PrecompileLoadError  # noqa: E402

HAS_PRECOMPILE = callable(getattr(torch.compiler, "precompile", None))
pytestmark = pytest.mark.torch_engine
needs_precompile = pytest.mark.skipif(
    not HAS_PRECOMPILE,
    reason=f"torch {torch.__version__} has no torch.compiler.precompile (torch engine unavailable)",
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _field(info, name):
    return info[name] if isinstance(info, dict) else getattr(info, name)


class Tiny(nn.Module):
    """Linear + BatchNorm (eval: running stats are buffers) + a registered buffer."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        return torch.relu(self.bn(self.lin(x))) * self.scale


def _tiny(seed=0):
    torch.manual_seed(seed)
    m = Tiny().eval()
    # non-trivial running stats so the buffers matter
    m.bn.running_mean.uniform_(-0.5, 0.5)
    m.bn.running_var.uniform_(0.5, 2.0)
    return m


def _infer(model, x):
    return model(x)


# --------------------------------------------------------------------------- real torch


@pytest.fixture(scope="module")
def inference_pair():
    model = _tiny()
    x = torch.randn(4, 8)
    src, cache = torch_engine.capture_pair(
        _infer, (model, x), {}, target="forward", device="cpu", options={"backend": "inductor"}
    )
    return model, x, src, cache


@pytest.fixture(scope="module")
def eager_pair():
    model = nn.Linear(8, 8)
    x = torch.randn(3, 8)
    src, cache = torch_engine.capture_pair(
        lambda m, x: m(x) * 2,
        (model, x),
        {},
        target="double",
        device="cpu",
        options={"backend": "eager"},
    )
    return model, x, src, cache


@needs_precompile
def test_api_generation_is_detected_by_feature():
    assert torch_engine.api_generation() == torch_engine.API_CALLABLE
    assert torch_engine.available()


@needs_precompile
def test_inference_round_trip_matches_eager(inference_pair):
    model, x, src, cache = inference_pair
    info = torch_engine.inspect_torch_pair(src, cache)
    assert _field(info, "engine") == "torch"
    assert _field(info, "code_hash") == hashlib.sha256(src).hexdigest()
    assert _field(info, "device") == "cpu"
    fp = _field(info, "fingerprint")
    assert fp["torch"] == torch.__version__ and fp["device_type"] == "cpu"
    assert _field(info, "meta")["backend"] == "inductor" and _field(info, "meta")["has_artifact"]

    fn = torch_pairs.load_torch_pair(src, cache, fallback=False, where="pkg: target 'forward'")
    with torch.no_grad():
        torch.testing.assert_close(fn(model, x), model(x))
        # same architecture, other weights and buffers: the pair carries no weights
        other = _tiny(seed=1)
        x2 = torch.randn(4, 8)
        torch.testing.assert_close(fn(other, x2), other(x2))


@needs_precompile
def test_fallback_loads_without_cache_and_matches_eager(inference_pair):
    model, x, src, cache = inference_pair
    fn = torch_pairs.load_torch_pair(src, cache, fallback=True, where="pkg: target 'forward'")
    with torch.no_grad():
        torch.testing.assert_close(fn(model, x), model(x))
    # the fallback needs no readable cache at all: the source is self-contained
    fn2 = torch_pairs.load_torch_pair(src, b"garbage", fallback=True, where="pkg: target 'forward'")
    with torch.no_grad():
        torch.testing.assert_close(fn2(model, x), model(x))


@needs_precompile
def test_call_mismatch_is_a_call_error_with_torchs_error_as_cause(inference_pair):
    from precompile_runtime import CallError

    model, x, src, cache = inference_pair
    fn = torch_pairs.load_torch_pair(src, cache, fallback=False, where="pkg: target 'forward'")
    with (
        torch.no_grad(),
        pytest.raises(CallError, match=r"^pkg: target 'forward': the call does not match") as ei,
    ):
        fn(model, torch.randn(3, 8))
    assert type(ei.value.__cause__).__name__ == "PrecompileError"
    assert str(ei.value.__cause__) in str(ei.value)


@needs_precompile
def test_serving_guard_refuses_the_cpu_compile_at_load(inference_pair, tmp_path):
    """torch 2.14.1's CPU pairs run the C++ compiler inside load: with
    PRECOMPILE_NO_COMPILE=1 that is a ServingCompileError pointing at the frozen
    engine, and nothing is compiled (a fresh process, an empty Inductor cache)."""
    _, _, src, cache = inference_pair
    (tmp_path / "p.py").write_bytes(src)
    (tmp_path / "p.cache").write_bytes(cache)
    code = textwrap.dedent(f"""
        import pathlib
        from precompile_runtime import ServingCompileError, torch_pairs
        d = pathlib.Path({str(tmp_path)!r})
        try:
            torch_pairs.load_torch_pair((d / "p.py").read_bytes(), (d / "p.cache").read_bytes(),
                                        where="pkg: target 'forward'")
        except ServingCompileError as e:
            print("REFUSED", e)
        else:
            print("LOADED")
    """)
    ind = tmp_path / "inductor"
    env = dict(
        os.environ,
        PRECOMPILE_NO_COMPILE="yes",
        TORCHINDUCTOR_CACHE_DIR=str(ind),
        PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "runtime")]),
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert (
        "REFUSED pkg: target 'forward': torch.compiler.precompile.load tried to compile"
        in res.stdout
    )
    assert (
        "CPU pairs compile their C++ kernels at load" in res.stdout
        and "frozen engine" in res.stdout
    )
    assert not list(ind.rglob("*.so"))


@needs_precompile
def test_training_step_accumulates_grads_like_eager():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    model[0].bias.requires_grad_(False)  # frozen: must keep .grad None
    x, t = torch.randn(5, 8), torch.randn(5, 4)

    def step(m, x, t):
        torch.nn.functional.mse_loss(m(x), t).backward()

    src, cache = torch_engine.capture_pair(
        step, (copy.deepcopy(model), x, t), {}, target="train_step", device="cpu", options={}
    )
    fn = torch_pairs.load_torch_pair(src, cache, fallback=False, where="pkg: target 'train_step'")

    eager, served = copy.deepcopy(model), copy.deepcopy(model)
    for _ in range(2):  # two steps without zero_grad: grads accumulate
        step(eager, x, t)
        assert fn(served, x, t) is None  # fn's own result, not the grads
    for (name, pe), ps in zip(eager.named_parameters(), served.parameters()):
        if not pe.requires_grad:
            assert pe.grad is None and ps.grad is None, name
        else:
            torch.testing.assert_close(ps.grad, pe.grad, msg=name)
    assert served[0].bias.grad is None


@needs_precompile
def test_mark_unbacked_batch_dim_serves_several_sizes():
    from torch._dynamo.decorators import mark_unbacked

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    model.register_buffer("scale", torch.linspace(0.5, 1.5, 8))
    x = torch.randn(4, 8)
    mark_unbacked(x, 0)
    src, cache = torch_engine.capture_pair(
        _infer, (model, x), {}, target="dyn", device="cpu", options={"backend": "inductor"}
    )
    fn = torch_pairs.load_torch_pair(src, cache, fallback=False, where="pkg: target 'dyn'")
    with torch.no_grad():
        for n in (1, 3, 4, 17):
            xn = torch.randn(n, 8)
            torch.testing.assert_close(fn(model, xn), model(xn))
        with pytest.raises(Exception):  # noqa: B017 - a static dim still refuses another size (torch's guard error, whose type varies by version)
            fn(model, torch.randn(4, 9))


@needs_precompile
def test_a_guard_on_a_marked_dim_is_a_capture_error():
    # F.batch_norm guards on the batch size (numel == 0): an unbacked dim cannot be
    # guarded on, so torch refuses the capture instead of baking a wrong artifact.
    from torch._dynamo.decorators import mark_unbacked

    x = torch.randn(4, 8)
    mark_unbacked(x, 0)
    with pytest.raises(CaptureError, match=r"target 'bn_dyn'.*torch refused it"):
        torch_engine.capture_pair(
            _infer, (_tiny(), x), {}, target="bn_dyn", device="cpu", options={}
        )


@needs_precompile
def test_inspect_refuses_a_flipped_byte_and_a_swapped_source(inference_pair, eager_pair):
    _, _, src, cache = inference_pair
    # a byte of the compiled artifact inside the cache
    bad = bytearray(cache)
    bad[len(cache) // 2] ^= 0x01
    with pytest.raises(
        CaptureError, match="Failed to validate the torch pair: the cache is not torch"
    ):
        torch_engine.inspect_torch_pair(src, bytes(bad))
    with pytest.raises(IntegrityError, match="pkg: target 'forward'"):
        torch_pairs.load_torch_pair(src, bytes(bad), fallback=False, where="pkg: target 'forward'")
    # a byte of the source
    bad_src = bytearray(src)
    bad_src[len(src) // 2] ^= 0x01
    with pytest.raises(CaptureError, match="code_hash"):
        torch_engine.inspect_torch_pair(bytes(bad_src), cache)
    # the source of another capture
    other_src = eager_pair[2]
    with pytest.raises(CaptureError, match="code_hash"):
        torch_engine.inspect_torch_pair(other_src, cache)
    with pytest.raises(IntegrityError, match="code_hash check failed"):
        torch_pairs.load_torch_pair(other_src, cache, fallback=False, where="pkg: target 'forward'")
    with pytest.raises(IntegrityError):  # also in the fallback: a mixed-up pair runs nothing
        torch_pairs.load_torch_pair(other_src, cache, fallback=True, where="pkg: target 'forward'")
    # truncated / not torch's envelope
    with pytest.raises(CaptureError):
        torch_engine.inspect_torch_pair(src, cache[:100])
    with pytest.raises(CaptureError, match="zip magic"):
        torch_engine.inspect_torch_pair(src, b"PCBCACHE....")


@needs_precompile
def test_eager_backend_pair_round_trips(eager_pair):
    model, x, src, cache = eager_pair
    info = torch_engine.inspect_torch_pair(src, cache)
    assert _field(info, "meta")["backend"] == "eager" and not _field(info, "meta")["has_artifact"]
    fn = torch_pairs.load_torch_pair(src, cache, fallback=False, where="w")
    with torch.no_grad():
        torch.testing.assert_close(fn(model, x), model(x) * 2)


@needs_precompile
def test_closed_over_tensor_is_a_capture_error_naming_the_target():
    const = torch.randn(8)
    model = nn.Linear(8, 8)

    def fn(m, x):
        return m(x) + const  # closed over: torch refuses to bake it

    with pytest.raises(CaptureError) as ei:
        torch_engine.capture_pair(
            fn,
            (model, torch.randn(2, 8)),
            {},
            target="leaky",
            device="cpu",
            options={"backend": "eager"},
        )
    msg = str(ei.value)
    assert "'leaky'" in msg and "torch refused it" in msg
    assert "register" in msg or "explicit" in msg  # torch's own advice is kept
    assert type(ei.value.__cause__).__name__ == "PrecompileError"


@needs_precompile
def test_kwargs_are_refused_on_the_callable_api():
    with pytest.raises(CaptureError, match="positionally") as ei:
        torch_engine.capture_pair(
            lambda m, x, scale=1.0: m(x) * scale,
            (nn.Linear(8, 8), torch.randn(2, 8)),
            {"scale": 2.0},
            target="kw",
            device="cpu",
            options={},
        )
    assert "'kw'" in str(ei.value) and "scale" in str(ei.value)


@needs_precompile
def test_bad_options_and_device_mismatch(eager_pair):
    model, x, _, _ = eager_pair
    with pytest.raises(CaptureError, match="backend='tvm'"):
        torch_engine.capture_pair(
            lambda m, x: m(x), (model, x), {}, target="t", device="cpu", options={"backend": "tvm"}
        )
    with pytest.raises(CaptureError, match="unknown torch engine option"):
        torch_engine.capture_pair(
            lambda m, x: m(x),
            (model, x),
            {},
            target="t",
            device="cpu",
            options={"mode": "max-autotune"},
        )
    with pytest.raises(CaptureError, match="device is 'cuda'"):
        torch_engine.capture_pair(
            lambda m, x: m(x) * 2,
            (model, x),
            {},
            target="t",
            device="cuda",
            options={"backend": "eager"},
        )


@needs_precompile
def test_pair_written_by_a_script_with_torchs_api_validates(tmp_path):
    script = tmp_path / "capture_direct.py"
    script.write_text(
        textwrap.dedent("""
        import os, torch
        m = torch.nn.Linear(8, 8)
        code, cache = torch.compiler.precompile(lambda m, x: m(x), m, torch.randn(2, 8),
                                                backend="eager")
        with open(os.environ["PRECOMPILE_ARTIFACT_PATH"], "w", encoding="utf-8") as f:
            f.write(code)
        with open(os.environ["PRECOMPILE_CACHE_PATH"], "wb") as f:
            f.write(cache)
    """)
    )
    env = dict(
        os.environ,
        PRECOMPILE_ARTIFACT_PATH=str(tmp_path / "direct.py"),
        PRECOMPILE_CACHE_PATH=str(tmp_path / "direct.cache"),
        PRECOMPILE_TARGET="direct",
    )
    subprocess.run([sys.executable, str(script)], check=True, env=env, capture_output=True)
    src, cache = (tmp_path / "direct.py").read_bytes(), (tmp_path / "direct.cache").read_bytes()
    assert torch_engine.is_torch_cache(cache)
    info = torch_engine.inspect_torch_pair(src, cache)
    assert _field(info, "engine") == "torch" and _field(info, "device") == "cpu"
    fn = torch_pairs.load_torch_pair(src, cache, fallback=False, where="w")
    m = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(fn(m, x), m(x))


# --------------------------------------------------------------------------- newer API (fake)

_FAKE_SOURCE = """\
BACKEND = {backend!r}
TRACER = {tracer!r}
USER_INPUT_DEVICES = ['cpu']
PARAM_DEVICES = []
BUFFER_DEVICES = []


def forward(x, *, scale=1.0):
    return x * 2 * scale
"""


class _FakeTracer:
    def __init__(self, name):
        self.name = name


class _FakeCapture:
    """Documented shape: a context manager; each call inside the block runs and returns
    its result; the pair is written on clean exit; nothing when the block raised."""

    def __init__(self, api, fn, artifact_path, cache_path, backend, tracer):
        self.api, self.fn = api, fn
        self.paths = (artifact_path, cache_path)
        self.backend, self.tracer = backend, tracer
        self.calls = []

    def __enter__(self):
        return self

    def __call__(self, *args, **kwargs):
        if self.api.refuse:
            raise self.api.PrecompileError(self.api.refuse)
        self.calls.append((args, kwargs))
        return self.fn(*args, **kwargs)

    def __exit__(self, exc_type, exc, tb):
        self.api.captures.append(self)
        if exc_type is not None or not self.calls:
            return False
        code = _FAKE_SOURCE.format(backend=self.backend, tracer=self.tracer.name)
        buf = io.BytesIO()
        torch.save(
            {
                "format": "torch.compiler.precompile",
                "version": 2,
                "backend": self.backend,
                "tracer": self.tracer.name,
                "code_hash": hashlib.sha256(code.encode()).hexdigest(),
                "artifact": b"kernels",
            },
            buf,
        )
        with open(self.paths[0], "w", encoding="utf-8") as f:
            f.write(code)
        with open(self.paths[1], "wb") as f:
            f.write(buf.getvalue())
        return False


class _FakeNewerPrecompile:
    """``torch.compiler.precompile`` of the newer generation: ``capture`` + path ``load``."""

    class PrecompileError(RuntimeError):
        pass

    def __init__(self):
        self.captures, self.loads, self.refuse = [], [], None
        self.MakeFxTracer = lambda: _FakeTracer("make_fx")
        self.DynamoTracer = lambda: _FakeTracer("dynamo")

    def capture(self, fn, /, *, artifact_path, cache_path, tracer=None, backend="inductor"):
        return _FakeCapture(
            self, fn, artifact_path, cache_path, backend, tracer or self.MakeFxTracer()
        )

    def load(self, artifact_path, cache_path):
        with open(artifact_path, encoding="utf-8") as f:
            code = f.read()
        with open(cache_path, "rb") as f:
            blob = torch.load(io.BytesIO(f.read()), weights_only=True)
        if blob["code_hash"] != hashlib.sha256(code.encode()).hexdigest():
            raise self.PrecompileError("cache does not match python_code")
        self.loads.append(blob)
        ns = {}
        exec(code, ns)
        return ns["forward"]


@pytest.fixture
def fake_newer(monkeypatch):
    api = _FakeNewerPrecompile()
    monkeypatch.setattr(torch.compiler, "precompile", api, raising=False)
    return api


def test_newer_api_is_detected_and_capture_writes_through_temp_files(fake_newer):
    assert torch_engine.api_generation() == torch_engine.API_CAPTURE
    x = torch.ones(3)
    src, cache = torch_engine.capture_pair(
        lambda x, *, scale: x * 2 * scale,
        (x,),
        {"scale": 3.0},
        target="fwd",
        device="cpu",
        options={"backend": "eager", "tracer": "dynamo"},
    )
    (cap,) = fake_newer.captures
    assert cap.calls == [((x,), {"scale": 3.0})]  # kwargs reach the newer API as they are
    assert cap.tracer.name == "dynamo" and cap.backend == "eager"
    assert not os.path.exists(os.path.dirname(cap.paths[0]))  # temp dir removed
    info = torch_engine.inspect_torch_pair(src, cache)
    assert _field(info, "meta")["tracer"] == "dynamo" and _field(info, "meta")["version"] == 2

    fn = torch_pairs.load_torch_pair(src, cache, fallback=False, where="pkg: target 'fwd'")
    torch.testing.assert_close(fn(x, scale=3.0), x * 6)
    assert fake_newer.loads[-1]["artifact"] == b"kernels"


def test_newer_api_fallback_drops_the_artifact_of_make_fx_pairs(fake_newer):
    src, cache = torch_engine.capture_pair(
        lambda x: x * 2,
        (torch.ones(2),),
        {},
        target="fwd",
        device="cpu",
        options={"backend": "eager"},
    )
    fn = torch_pairs.load_torch_pair(src, cache, fallback=True, where="w")
    torch.testing.assert_close(fn(torch.ones(2)), torch.full((2,), 2.0))
    assert fake_newer.loads[-1]["artifact"] is None
    assert fake_newer.loads[-1]["code_hash"] == hashlib.sha256(src).hexdigest()


def test_newer_api_refusal_is_a_capture_error_naming_the_target(fake_newer):
    fake_newer.refuse = "fn closes over a tensor; register it as a buffer"
    with pytest.raises(CaptureError, match=r"'enc'.*torch refused it.*register it as a buffer"):
        torch_engine.capture_pair(
            lambda x: x, (torch.ones(2),), {}, target="enc", device="cpu", options={}
        )
    assert not os.path.exists(fake_newer.captures[-1].paths[0])


def test_newer_api_load_error_is_wrapped(fake_newer):
    src, cache = torch_engine.capture_pair(
        lambda x: x * 2, (torch.ones(2),), {}, target="fwd", device="cpu", options={}
    )

    def broken(*a):
        raise fake_newer.PrecompileError("cannot serve this artifact")

    fake_newer.load = broken
    with pytest.raises(
        PrecompileLoadError, match=r"^pkg: target 'fwd': torch.compiler.precompile.load failed"
    ):
        torch_pairs.load_torch_pair(src, cache, fallback=False, where="pkg: target 'fwd'")


def test_no_precompile_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.compiler, "precompile", None, raising=False)
    assert not torch_engine.available()
    with pytest.raises(CaptureError, match="has no torch.compiler.precompile"):
        torch_engine.capture_pair(
            lambda x: x, (torch.ones(1),), {}, target="t", device="cpu", options={}
        )
    with pytest.raises(PrecompileLoadError, match="no torch.compiler.precompile.load"):
        torch_pairs.load_torch_pair(b"BACKEND = 'eager'\n", b"x", fallback=True, where="w")


def test_runtime_module_does_not_import_torch():
    code = (
        "import sys; import precompile_runtime.torch_pairs; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "runtime")]))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


def test_newer_api_load_refuses_a_temp_folder_others_can_swap(fake_newer, tmp_path, monkeypatch):
    """Torch's path ``load`` reads the verified pair from a private temp folder; below
    a folder others can write without the sticky bit (TMPDIR there), they could swap it
    before torch reads it: refused with the fix, torch's load never called."""
    import tempfile

    src, cache = torch_engine.capture_pair(
        lambda x: x * 2, (torch.ones(2),), {}, target="fwd", device="cpu", options={}
    )
    open_tmp = tmp_path / "open-tmp"
    open_tmp.mkdir()
    open_tmp.chmod(0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(open_tmp))
    with pytest.raises(PrecompileLoadError) as ei:
        torch_pairs.load_torch_pair(src, cache, fallback=False, where="pkg: target 'fwd'")
    msg = str(ei.value)
    assert msg.startswith(
        "pkg: target 'fwd': cannot hand the verified pair to torch: the private temp directory"
    )
    assert "without the sticky bit" in msg and "set TMPDIR to a directory only you can write" in msg
    assert fake_newer.loads == [] and os.listdir(open_tmp) == []
    monkeypatch.setattr(tempfile, "tempdir", None)
    torch.testing.assert_close(
        torch_pairs.load_torch_pair(src, cache, fallback=False, where="w")(torch.ones(2)),
        torch.full((2,), 2.0),
    )
