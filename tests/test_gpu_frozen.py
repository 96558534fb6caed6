"""The `frozen` engine on CUDA: Triton kernels frozen as cubins, served without Triton.

Each test captures a CUDA call with ``engine="frozen"``, then loads the pair in a
fresh subprocess whose Inductor and Triton cache directories are empty and whose
serving guard is on (``PRECOMPILE_NO_COMPILE=1``: ``triton.compiler.compile`` and
Inductor's compile raise). The child runs the artifact on every visible GPU (cuda:0,
and cuda:1 where there are two), compares with eager results computed here, and
reports every module of torch._inductor / torch._dynamo / triton that the load
executed (an import hook counts them; with none, ``triton.compiler.compile`` cannot have
run) and whether anything was written to the compile caches. A pair whose guards read
a user Triton kernel's module is served after that module is imported, as a server
that calls the library does: what that import brings (triton itself) is not the load's.
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
try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only torch
    triton = None

HAVE_CUDA = torch is not None and torch.cuda.is_available()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAVE_CUDA, reason="needs CUDA")]
needs_triton = pytest.mark.skipif(triton is None, reason="needs triton")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if triton is not None:

    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(
            out_ptr + offs,
            tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
            mask=mask,
        )

    @triton.autotune(
        configs=[
            triton.Config({"BLOCK": 128}, num_warps=4),
            triton.Config({"BLOCK": 512}, num_warps=8),
        ],
        key=["n"],
    )
    @triton.jit
    def axpy_kernel(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        x = tl.load(x_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, alpha * x + tl.load(y_ptr + offs, mask=mask), mask=mask)


def user_add(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(add_kernel)[(triton.cdiv(n, 256),)](x, y, out, n, BLOCK=256)
    return torch.sigmoid(out) * 2


def user_axpy(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(axpy_kernel)[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](
        x, y, out, n, 0.5
    )
    return out.relu()


def make_mlp():
    nn = torch.nn
    return nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.LayerNorm(64))


def forward(model, x):
    return model(x)


def train_step(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss


# The child: loads the pair like precompile_runtime's loader does (envelope, code_hash,
# blobs unpacked, source exec'd, load(kernel_dir)), with nothing of the compiler stack.
_CHILD = r'''
import importlib.abc, json, os, sys, tempfile
FORBIDDEN = ("triton.", "torch._inductor", "torch._dynamo")
loaded = []  # forbidden modules actually executed (not mere find_spec probes)

class _Counter(importlib.abc.MetaPathFinder):
    """Counts executions of forbidden modules; torch probes find_spec("triton")
    without importing it, which is not counted."""
    busy = set()  # names being looked up: other finders may re-enter the import system

    def find_spec(self, name, path=None, target=None):
        if (name != "triton" and not name.startswith(FORBIDDEN)) or name in self.busy:
            return None
        self.busy.add(name)
        try:
            return self._find(name, path, target)
        finally:
            self.busy.discard(name)

    def _find(self, name, path, target):
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    inner = spec.loader.exec_module
                    spec.loader.exec_module = lambda m, _inner=inner: (loaded.append(m.__name__), _inner(m))[1]
                if spec is not None:
                    return spec
        return None

spec = json.loads(sys.argv[1])
# the captured function's own module, imported as a server that calls its library does
# (its guards are checked there; it may import triton itself): what it loads is not the load's
import importlib
for name in spec.get("imports", ()):
    importlib.import_module(name)
before = set(sys.modules)
sys.meta_path.insert(0, _Counter())
import torch
import precompile_runtime  # PRECOMPILE_NO_COMPILE=1: the serving guard is on
from precompile_runtime import envelope

src = open(spec["source"], "rb").read()
env = envelope.loads(open(spec["cache"], "rb").read())
assert env.engine == "frozen" and env.code_hash == envelope.sha256_hex(src)
kdir = tempfile.mkdtemp()
for name, blob in env.blobs.items():
    path = os.path.join(kdir, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(blob)
ns = {"__name__": "pair"}
exec(compile(src, spec["source"], "exec"), ns)
art = ns["load"](kdir)
data = torch.load(spec["data"], weights_only=False)
report = {"uses_kernels": art.uses_kernels, "errors": {}}

def close(got, want, tol):
    return torch.allclose(got.float().cpu(), want.float().cpu(), atol=tol, rtol=tol)

def run_on(dev):
    errs = []
    with torch.cuda.device(torch.device(dev)):
        if spec["case"] in ("forward", "train"):
            # one example, or (dynamic dims) several sizes: (x, output, grads) each
            for x, want, grads in data.get("sizes") or [(data["x"], data["out"], data.get("grads"))]:
                model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64))
                model.load_state_dict(data["state"])
                model = model.to(dev, data["dtype"])
                x, at = x.to(dev), list(x.shape)
                for step in range(2):  # the second call reuses the loaded kernels
                    out = art(model, x)
                    if not close(out, want, data["tol"]):
                        errs.append(f"{at} step {step}: output differs, max err {(out.float().cpu() - want.float()).abs().max()}")
                if spec["case"] == "train":
                    for n, p in model.named_parameters():
                        if not close(p.grad / 2, grads[n], data["tol"]):  # two steps accumulated
                            errs.append(f"{at} grad {n} differs")
        elif spec["case"] == "calls":  # dynamic dims: several sizes served, others refused
            for call in data["calls"]:
                out = art(*[t.to(dev) for t in call["args"]])
                if not close(out, call["out"], data["tol"]):
                    errs.append(f"{list(call['args'][0].shape)}: output differs, max err "
                                f"{(out.float().cpu() - call['out'].float()).abs().max()}")
            for args in data["refuse"]:
                try:
                    art(*[t.to(dev) for t in args])
                    errs.append(f"{list(args[0].shape)}: served, should be refused")
                except precompile_runtime.CallError:
                    pass
        else:
            args = [t.to(dev) for t in data["args"]]
            out = art(*args)
            if not close(out, data["out"], data["tol"]):
                errs.append(f"output differs, max err {(out.float().cpu() - data['out'].float()).abs().max()}")
        torch.cuda.synchronize()
    return errs

for dev in spec["devices"]:
    try:
        report["errors"][dev] = run_on(dev)
    except Exception as e:  # reported per device; a CUDA fault ends the child anyway
        report["errors"][dev] = [f"{type(e).__name__}: {e}"]
    print("DEVICE", dev, report["errors"][dev], flush=True)

def files(d):
    return sorted(os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs)

report["forbidden_loaded"] = loaded
report["forbidden_modules"] = sorted(
    m for m in set(sys.modules) - before if m == "triton" or m.startswith(FORBIDDEN)
)
report["cache_files"] = files(os.environ["TORCHINDUCTOR_CACHE_DIR"]) + files(os.environ["TRITON_CACHE_DIR"])
print("REPORT " + json.dumps(report))
'''


def _capture(tmp_path, name, fn, *args):
    import precompile_build

    source, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    with precompile_build.capture(
        fn, artifact_path=source, cache_path=cache, engine="frozen", target=name
    ) as f:
        f(*args)
    text = source.read_text()
    meta = _metadata(text)
    kinds = [k["kind"] for k in meta["kernels"]]
    assert "triton" in kinds, f"{name}: no Triton kernel was frozen ({kinds})"
    for k in meta["kernels"]:
        if k["kind"] == "triton":
            assert (
                k["launcher"].startswith("def launcher(")
                and "runner(grid_0, grid_1, grid_2, stream" in k["launcher"]
            )
    assert "import triton" not in text
    return source, cache


def _metadata(text):
    import ast

    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") == "PRECOMPILE_METADATA"
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("no PRECOMPILE_METADATA")


def _serve(tmp_path, case, source, cache, data, imports=()):
    """Load and run the pair in a fresh process, after importing the modules named in
    ``imports`` (the captured function's, which its guards read); return its report."""
    data_path = tmp_path / f"{case}-data.pt"
    torch.save(data, data_path)
    devices = [f"cuda:{i}" for i in range(min(torch.cuda.device_count(), 2))]
    spec = {
        "source": str(source),
        "cache": str(cache),
        "data": str(data_path),
        "case": case,
        "devices": devices,
        "imports": list(imports),
    }
    env = dict(os.environ)
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        d = tmp_path / f"empty-{var.lower()}"
        d.mkdir(exist_ok=True)
        env[var] = str(d)
    env["PRECOMPILE_NO_COMPILE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO, os.path.join(REPO, "runtime"), os.path.dirname(__file__), env.get("PYTHONPATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT ")][-1]
    report = json.loads(line[len("REPORT ") :])
    print(case, json.dumps(report))
    assert report["uses_kernels"]
    assert report["forbidden_loaded"] == [], report["forbidden_loaded"]
    assert report["forbidden_modules"] == [], report["forbidden_modules"]
    assert report["cache_files"] == [], report["cache_files"]
    assert set(report["errors"]) == set(devices)
    for dev, errs in report["errors"].items():
        assert errs == [], f"{case} on {dev}: {errs}"
    return report


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_mlp(tmp_path, dtype):
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    model = make_mlp().cuda().to(dt)
    x = torch.randn(8, 32, device="cuda", dtype=dt)
    source, cache = _capture(tmp_path, f"mlp_{dtype}", forward, model, x)
    with torch.no_grad():
        want = model(x)
    state = {k: v.float().cpu() for k, v in model.state_dict().items()}
    tol = 1e-4 if dt == torch.float32 else 8e-2
    _serve(
        tmp_path,
        "forward",
        source,
        cache,
        {"state": state, "dtype": dt, "x": x.cpu(), "out": want.cpu(), "tol": tol},
    )


def test_train_step(tmp_path):
    torch.manual_seed(0)
    model = make_mlp().cuda()
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 32, device="cuda")
    source, cache = _capture(tmp_path, "train", train_step, model, x)
    ref = make_mlp().cuda()
    ref.load_state_dict(state)
    loss = train_step(ref, x)
    grads = {n: p.grad.cpu() for n, p in ref.named_parameters()}
    _serve(
        tmp_path,
        "train",
        source,
        cache,
        {
            "state": state,
            "dtype": torch.float32,
            "x": x.cpu(),
            "out": loss.detach().cpu(),
            "grads": grads,
            "tol": 1e-4,
        },
    )


@needs_triton
@pytest.mark.parametrize("user_kernel", [False, True], ids=["inductor", "user"])
def test_kernels_compile_in_inductors_worker_pool(tmp_path, monkeypatch, user_kernel):
    """As torch.compile does, the capture compiles Inductor's kernels in its worker
    pool once the pool answers (then this process calls no ``triton.compile``: the
    workers' compile results come back, and the launchers frozen are made here); a graph with a user-defined Triton
    kernel compiles in this process (the workers would not launch it statically).
    Either pair serves like eager."""
    import torch._inductor.config as config

    if not config.compile_threads or config.compile_threads <= 1:
        pytest.skip("Inductor compiles in-process on this host (compile_threads <= 1)")
    calls = []
    orig = triton.compile

    def counting(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    # the pool up first: a capture begun before its workers answer compiles in this
    # process (test_a_fresh_process_compiles_in_the_worker_pool: a trace long enough)
    from torch._inductor.async_compile import AsyncCompile

    from precompile_build.engines.triton_freeze import start_compile_workers

    start_compile_workers()
    AsyncCompile.wait_pool_ready(timeout=120)
    monkeypatch.setattr(triton, "compile", counting)
    torch.manual_seed(0)
    # sizes of this test only, and no FX graph cache: each kernel is compiled now
    x, y = torch.randn(2999, device="cuda"), torch.randn(2999, device="cuda")
    fn = user_add if user_kernel else (lambda a, b: torch.sigmoid(a * 3 + b) * 2)
    with config.patch({"fx_graph_cache": False}):
        source, cache = _capture(tmp_path, f"pool_{user_kernel}", fn, x, y)
    assert bool(calls) == user_kernel, len(calls)
    _serve(
        tmp_path,
        "user",
        source,
        cache,
        {"args": [x.cpu(), y.cpu()], "out": fn(x, y).cpu(), "tol": 1e-5},
        imports=[fn.__module__] if user_kernel else [],
    )


_FRESH_POOL_CHILD = textwrap.dedent("""
    import json, sys, time
    import torch, triton
    import precompile_build

    from torch._inductor.async_compile import AsyncCompile

    calls, woken = [], []
    orig = triton.compile
    triton.compile = lambda *a, **k: calls.append(1) or orig(*a, **k)

    def fn(a, b):
        woken.append(AsyncCompile._ready_future is not None)  # the workers asked to start
        time.sleep(3)  # a trace long enough for the workers to come up (they import torch)
        return torch.sigmoid(a * 3 + b) * 2, torch.tanh(a - b).sum(0)

    x, y = torch.randn(37, 997, device="cuda"), torch.randn(37, 997, device="cuda")
    with precompile_build.capture(fn, artifact_path=sys.argv[1] + ".py", cache_path=sys.argv[1] + ".cache",
                                  engine="frozen", target="fresh",
                                  options={"guards": "recorded"}) as f:  # (time.sleep: no one graph)
        f(x, y)
    print("CALLS " + json.dumps([len(calls), woken[0]]))
""")


@needs_triton
def test_a_fresh_process_compiles_in_the_worker_pool(tmp_path):
    """The first capture of a fresh process (a build's script) starts Inductor's
    compile workers (not only the pool's sidecar) before it traces, as torch.compile
    does: they are up when the kernels compile, so none compiles in the capturing
    process (Inductor compiles a kernel in-process, one at a time, while its pool has
    not answered)."""
    env = dict(
        os.environ,
        TORCHINDUCTOR_COMPILE_THREADS="2",
        TORCHINDUCTOR_FX_GRAPH_CACHE="0",
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO, os.path.join(REPO, "runtime"), env.get("PYTHONPATH", "")]
    )
    proc = subprocess.run(
        [sys.executable, "-c", _FRESH_POOL_CHILD, str(tmp_path / "fresh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"child failed:\n{proc.stdout}\n{proc.stderr}"
    calls, woken = json.loads(
        [ln for ln in proc.stdout.splitlines() if ln.startswith("CALLS ")][-1][6:]
    )
    assert woken, "the workers were not asked to start before the trace ran the function"
    assert calls == 0, (
        f"{calls} kernel(s) compiled in the capturing process, not in the worker pool"
    )


@needs_triton
@pytest.mark.parametrize("fn", [user_add, user_axpy], ids=["jit", "autotune"])
def test_user_triton_kernel(tmp_path, fn):
    torch.manual_seed(0)
    x, y = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
    source, cache = _capture(tmp_path, fn.__name__, fn, x, y)
    want = fn(x, y)
    if fn is user_axpy:  # the frozen launch is the config autotuning picked
        entry = [
            k
            for k in _metadata(source.read_text())["kernels"]
            if k["kind"] == "triton" and "axpy" in k["function"]
        ]
        assert len(entry) == 1 and "BLOCK" in entry[0]["config"], entry
    _serve(
        tmp_path,
        "user",
        source,
        cache,
        {"args": [x.cpu(), y.cpu()], "out": want.cpu(), "tol": 1e-5},
        imports=[fn.__module__],
    )


def attention(x, w):
    B, T, C = x.shape
    q = (x @ w).view(B, T, 2, C // 2).transpose(1, 2)
    y = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    return y.transpose(1, 2).reshape(B, T, C).relu()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dynamic_batch_and_sequence(tmp_path, dtype):
    from torch._dynamo import mark_dynamic

    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    x, w = (
        torch.randn(3, 40, 64, device="cuda", dtype=dt),
        torch.randn(64, 64, device="cuda", dtype=dt) / 8,
    )
    mark_dynamic(x, 0, min=2, max=16)
    mark_dynamic(x, 1, min=2, max=256)
    source, cache = _capture(tmp_path, f"attention_{dtype}", attention, x, w)
    assert sorted(_metadata(source.read_text())["dynamic"]["symbols"].values()) == [
        [2, 16],
        [2, 256],
    ]
    calls = []
    for B, T in [(2, 2), (3, 40), (16, 256), (5, 97)]:
        xi = torch.randn(B, T, 64, device="cuda", dtype=dt)
        calls.append({"args": [xi.cpu(), w.cpu()], "out": attention(xi, w).cpu()})
    refuse = [
        [torch.randn(17, 8, 64, dtype=dt), w.cpu()],
        [torch.randn(2, 257, 64, dtype=dt), w.cpu()],
        [torch.randn(1, 8, 64, dtype=dt), w.cpu()],
        [torch.randn(2, 8, 32, dtype=dt), w.cpu()],
    ]
    _serve(
        tmp_path,
        "calls",
        source,
        cache,
        {"calls": calls, "refuse": refuse, "tol": 1e-4 if dt == torch.float32 else 8e-2},
    )


def test_dynamic_batch_train_step(tmp_path):
    from torch._dynamo import mark_dynamic

    torch.manual_seed(0)
    model = make_mlp().cuda()
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 32, device="cuda")
    mark_dynamic(x, 0, min=2, max=4096)
    source, cache = _capture(tmp_path, "train_dyn", train_step, model, x)
    sizes = []
    for n in (2, 8, 1000, 4096):
        ref = make_mlp().cuda()
        ref.load_state_dict(state)
        xi = torch.randn(n, 32, device="cuda")
        loss = train_step(ref, xi)
        sizes.append(
            (xi.cpu(), loss.detach().cpu(), {k: p.grad.cpu() for k, p in ref.named_parameters()})
        )
    _serve(
        tmp_path,
        "train",
        source,
        cache,
        {"state": state, "dtype": torch.float32, "sizes": sizes, "tol": 1e-4},
    )


def random_ops(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) + torch.rand(x.shape, device=x.device)


def test_torch_random_ops_follow_torch_rng(tmp_path):
    """Dropout and torch.rand in a frozen CUDA pair draw from torch's CUDA generator as
    eager does: a fresh mask per call, eager's values under torch.manual_seed."""
    from precompile_runtime import envelope

    x = torch.randn(64, 256, device="cuda")
    source, cache = _capture(tmp_path, "random_ops", random_ops, x)
    env = envelope.loads(cache.read_bytes())
    kdir = tmp_path / "kernels"
    for name, blob in env.blobs.items():
        (kdir / name).parent.mkdir(parents=True, exist_ok=True)
        (kdir / name).write_bytes(blob)
    ns = {"__name__": "pair"}
    exec(compile(source.read_text(), str(source), "exec"), ns)
    served = ns["load"](str(kdir))
    assert served.uses_kernels
    torch.manual_seed(7)
    first, second = served(x), served(x)
    assert not torch.equal(first, second)  # a fresh mask and fresh uniforms per call
    torch.manual_seed(7)
    assert torch.equal(served(x), first)  # reproducible under torch.manual_seed
    torch.manual_seed(7)
    torch.testing.assert_close(first, random_ops(x))  # eager's values
    dropped = float(served(torch.ones_like(x)).lt(1).float().mean())  # kept: 2 + U[0, 1)
    assert 0.4 < dropped < 0.6, dropped


def gelu_of_product(x, w):
    return torch.nn.functional.gelu(x @ w)  # GELU writes the product's buffer in place


def test_autotuning_times_every_config_on_gpu_clones(tmp_path, monkeypatch, torch_config):
    """Inductor times the configs of a kernel that writes in place on clones of the
    written arguments, but where a clone would raise the allocator's peak it restores
    them from a CPU copy inside the timed region, deciding per config: on the H200 the
    first config was timed 5x slow that way and lost. During a capture every config is
    timed on GPU clones when they fit, whatever the peak."""
    from torch._inductor import config
    from torch._inductor.runtime import triton_heuristics as th

    # autotune now, not from a best config another test or process saved
    torch_config(config, autotune_local_cache=False)
    # no headroom under the peak: Inductor's own policy copies every written argument
    for mod in (torch.cuda, getattr(torch, "accelerator", None)):
        if mod is not None and hasattr(mod, "max_memory_allocated"):
            monkeypatch.setattr(
                mod, "max_memory_allocated", lambda *a, _m=mod: _m.memory_allocated(*a)
            )
    timed = []  # per timed call of an in-place kernel: (Inductor's policy applies, args restored from CPU)
    clone = th.CachingAutotuner.maybe_clone_args

    def spy(self, exclude, *args, **kwargs):
        if self.mutated_arg_names:
            timed.append((bool(getattr(self, "optimize_mem", False)), set(exclude)))
        return clone(self, exclude, *args, **kwargs)

    monkeypatch.setattr(th.CachingAutotuner, "maybe_clone_args", spy)
    x, w = torch.randn(2048, 256, device="cuda"), torch.randn(256, 2048, device="cuda")
    with torch.no_grad():  # an inference graph: the one where Inductor's policy applies
        _capture(tmp_path, "gelu_of_product", gelu_of_product, x, w)  # 16 MiB: two configs
    assert timed, "no config of an in-place kernel was timed"
    assert all(applies for applies, _ in timed), timed  # the case where Inductor would copy
    assert not any(cpu for _, cpu in timed), timed  # no config was timed off a CPU copy


def _tuning_spies(monkeypatch, torch_config, saved_configs=False):
    """(scripts, timed): a 1 per compile-time tuning script Inductor runs
    (``triton.autotune_at_compile_time``); per ``benchmark_all_configs`` call, whether
    the capture's compile had returned (the first run) or not (the compile).
    ``saved_configs``: Inductor's local autotune cache stays on (the caller gives it
    an empty cache directory), else it is off: tuned now, not from a saved best config."""
    from torch._inductor import config
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    from torch._inductor.runtime import triton_heuristics as th

    torch_config(config, fx_graph_cache=False)  # compiled now
    if not saved_configs:
        torch_config(config, autotune_local_cache=False)
    scripts, timed, compiled = [], [], []
    script = PythonWrapperCodegen.generate_and_run_autotune_block
    monkeypatch.setattr(
        PythonWrapperCodegen,
        "generate_and_run_autotune_block",
        lambda self: scripts.append(1) or script(self),
    )
    bench = th.CachingAutotuner.benchmark_all_configs
    monkeypatch.setattr(
        th.CachingAutotuner,
        "benchmark_all_configs",
        lambda self, *a, **k: timed.append(bool(compiled)) or bench(self, *a, **k),
    )
    standalone = torch._inductor.standalone_compile  # frozen.py looks it up when it compiles
    monkeypatch.setattr(
        torch._inductor,
        "standalone_compile",
        lambda *a, **k: (standalone(*a, **k), compiled.append(1))[0],
    )
    return scripts, timed


@needs_triton
def test_kernels_compile_once_and_autotune_in_the_first_run(tmp_path, monkeypatch, torch_config):
    """The capture's compile runs no compile-time tuning script (standalone_compile's
    ``triton.autotune_at_compile_time``, which waits for every kernel's compile and
    defines each a second time): the configs are timed in the capture's first run,
    as under torch.compile, and the pair serves like eager."""
    scripts, timed = _tuning_spies(monkeypatch, torch_config)
    x = torch.randn(
        513, 2049, device="cuda"
    )  # a reduction with several configs to time on the H200
    fn = lambda a: torch.softmax(a * 3, dim=-1) + a.sum(0)  # noqa: E731
    source, cache = _capture(tmp_path, "first_run_tuning", fn, x)
    assert scripts == [], "the compile ran a tuning script (autotune_at_compile_time)"
    assert timed and all(timed), timed  # configs were timed, and only after the compile
    _serve(
        tmp_path,
        "first_run_tuning",
        source,
        cache,
        {"args": [x.cpu()], "out": fn(x).cpu(), "tol": 1e-5},
    )


def _branches(a):
    return torch.cond(
        a.sum() > 0, lambda t: torch.softmax(t * 3, dim=-1), lambda t: t.cos() + 1, (a,)
    )


@needs_triton
def test_a_branch_the_first_run_does_not_take_is_tuned_at_compile_time(
    tmp_path, monkeypatch, torch_config
):
    """A graph that branches (torch.cond) keeps standalone_compile's compile-time
    tuning: the first run launches one branch, and a kernel it never launched would
    keep every config, which cannot be frozen; the tuning script's choice reaches the
    wrapper's kernels through Inductor's local autotune cache. Both branches serve."""
    from torch._inductor.utils import fresh_inductor_cache

    scripts, _ = _tuning_spies(monkeypatch, torch_config, saved_configs=True)
    x = torch.randn(513, 2049, device="cuda").abs()
    with fresh_inductor_cache(dir=str(tmp_path)):  # no best config saved by another test
        source, cache = _capture(tmp_path, "cond_tuning", _branches, x)
    assert scripts, "no compile-time tuning script ran for a graph that branches"
    for case, a in (("taken", x), ("other", -x)):
        _serve(
            tmp_path,
            f"cond_{case}",
            source,
            cache,
            {"args": [a.cpu()], "out": _branches(a).cpu(), "tol": 1e-5},
        )


def test_unfreezable_kernel_is_a_capture_error():
    """A launcher built without the static CUDA launcher is refused, naming the kernel."""
    from precompile_build.engines.triton_freeze import freeze_triton_kernel
    from precompile_build.errors import CaptureError

    class FakeLauncher:
        pass

    launcher = FakeLauncher()
    launcher._precompile_launcher_code = "def launcher(a, stream):\n    runner(1, 1, 1, stream, a)"
    launcher._precompile_compile_result = type("R", (), {"kernel": object()})()
    autotuner = type("A", (), {"launchers": [launcher]})()
    with pytest.raises(CaptureError, match=r"triton_poi_fused_0.*engine='torch' or engine='eager'"):
        freeze_triton_kernel("triton_poi_fused_0", autotuner, "t")


def test_template_is_self_contained():
    """The launcher template needs only names the source half defines."""
    from precompile_build.engines import codegen

    text = codegen._template("triton_launcher.py")  # what the source half copies
    assert "import" not in text.replace("# ", "")
    assert textwrap.dedent(text) == text
