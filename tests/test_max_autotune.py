"""max-autotune on the frozen engine, on CPU: the target's `mode` key, the
extern kernels Inductor's autotuning picks bound as plain torch calls, the C++ GEMM
templates compiled into the pair's kernels, and a fastest choice that cannot be frozen
replaced by the best-timed one that can, said in the build line.

Served pairs are loaded in a fresh process under ``PRECOMPILE_NO_COMPILE=1`` and
compared with eager; "no compiler at load" is the list of torch._inductor /
torch._dynamo / triton modules that process imported (none), never a timing. CPU
max-autotune compiles are slow: the shapes are tiny and Inductor's choices are cut
to one or two (``test_configs.autotune_choice_name_regex``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _build_helpers import make_project

from precompile_build.config.settings import settings_from_table
from precompile_build.errors import ConfigError

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]

# The functions captured here and by the fixture capture script (both exec this text).
MODELS = """
import torch

def linear_relu(m, x):
    # a 2-D bias of stride 0: Inductor's addmm choices include `bias_addmm` (kernel/mm.py)
    return torch.relu(torch.addmm(m.bias.expand(x.shape[0], -1), x, m.weight.t()))

def bmm_scaled(x, y):
    # fp32 batched matmul: the choices are aten's bmm and the C++ BMM template
    return torch.bmm(x, y) * 2

def example(name):
    torch.manual_seed(0)
    if name == "linear_relu":
        return linear_relu, (torch.nn.Linear(32, 16).requires_grad_(False), torch.randn(8, 32))
    return bmm_scaled, (torch.randn(2, 8, 16), torch.randn(2, 16, 8))
"""

# The serving process: loads the pair as the runtime does once its checks passed (blobs
# unpacked, source exec'd, load(kernel_dir)), with the serving guard on.
SERVE = """
import json, os, sys, tempfile
import torch
import precompile_runtime  # the serving guard: PRECOMPILE_NO_COMPILE=1
from precompile_runtime.envelope import loads
spec = json.loads(sys.argv[1])
env = loads(open(spec["cache"], "rb").read())
kdir = tempfile.mkdtemp()
for name, blob in env.blobs.items():
    os.makedirs(os.path.dirname(os.path.join(kdir, name)), exist_ok=True)
    open(os.path.join(kdir, name), "wb").write(blob)
ns = {"__name__": "pair"}
exec(compile(open(spec["source"]).read(), spec["source"], "exec"), ns)
fn = ns["load"](kdir)
models = {}
exec(spec["models"], models)
eager, args = models["example"](spec["name"])
with torch.no_grad():
    got = [fn(*args) for _ in range(2)]  # the second call reuses the loaded kernels
    want = eager(*args)
print("RESULT" + json.dumps({
    "uses_kernels": fn.uses_kernels,
    "max_err": max(float((g - want).abs().max()) for g in got),
    "compiler_modules": sorted(m for m in sys.modules if m.startswith(("torch._inductor", "torch._dynamo", "triton"))),
}))
"""


def serve(source: Path, cache: Path, name: str, tmp_path: Path) -> dict:
    """Load the pair in a fresh process (empty compiler caches, serving guard on) and
    call it on ``name``'s example; its report."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "runtime")]),
        PRECOMPILE_NO_COMPILE="1",
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "serve-inductor"),
    )
    spec = {"source": str(source), "cache": str(cache), "models": MODELS, "name": name}
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(
        next(ln for ln in proc.stdout.splitlines()[::-1] if ln.startswith("RESULT"))[6:]
    )


def metadata(source: Path) -> dict:
    for node in ast.parse(source.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") == "PRECOMPILE_METADATA"
        ):
            return ast.literal_eval(node.value)
    raise AssertionError("no PRECOMPILE_METADATA")


# ---- the `mode` key: parsed, refused where invalid, passed to the capture ----------


def _settings(tmp_path, table, cs=None, environ=None):
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "cap.py").write_text("")
    return settings_from_table(tmp_path, {"package": "pkg", **table}, cs, environ or {})


def test_mode_key_is_resolved_like_cuda_archs(tmp_path):
    from precompile_build.builder.capture_cache import key_components
    from precompile_build.builder.script import script_env

    targets = {
        "a": {"script": "cap.py", "mode": "max-autotune"},
        "b": {"script": "cap.py"},
        "c": {"script": "cap.py", "mode": "default"},
    }
    s = _settings(tmp_path, {"targets": targets})
    assert [s.targets[n].mode for n in "abc"] == ["max-autotune", "default", "default"]
    s = _settings(tmp_path, {"mode": "max-autotune", "targets": targets})  # the project's default
    assert [s.targets[n].mode for n in "abc"] == ["max-autotune", "max-autotune", "default"]
    for cs, environ in (
        ({"precompile.mode": "default"}, None),
        ({"precompile.mode": "max-autotune"}, {"PRECOMPILE_MODE": "default"}),
    ):  # the override wins; the environment over -C
        s = _settings(tmp_path, {"targets": targets}, cs, environ)
        assert {t.mode for t in s.targets.values()} == {"default"}
    s = _settings(tmp_path, {"targets": targets}, {"precompile.mode": " max-autotune "})
    assert {t.mode for t in s.targets.values()} == {"max-autotune"}
    env = script_env(s, s.targets["a"], "cpu", tmp_path / "a.py", tmp_path / "a.cache", None)
    assert env["PRECOMPILE_MODE"] == "max-autotune"
    s = _settings(tmp_path, {"targets": targets})
    os.environ["PRECOMPILE_MODE"] = "max-autotune"  # a stale value of the build's own environment
    try:
        env = script_env(s, s.targets["b"], "cpu", tmp_path / "b.py", tmp_path / "b.cache", None)
    finally:
        del os.environ["PRECOMPILE_MODE"]
    assert "PRECOMPILE_MODE" not in env  # a default target's script gets none
    keys = [key_components(s, s.targets[n], "cpu", {}, "x")["target"]["mode"] for n in "ab"]
    assert keys == ["max-autotune", "default"]  # another mode is another capture


@pytest.mark.parametrize(
    "table, cs, environ, where",
    [
        (
            {"targets": {"a": {"script": "cap.py", "mode": "max_autotune"}}},
            None,
            None,
            r"`tool.precompile.targets.a.mode` must be one of 'default', 'max-autotune', not 'max_autotune' "
            r"\(did you mean 'max-autotune'\?\)",
        ),
        (
            {"mode": "reduce-overhead", "targets": {"a": {"script": "cap.py"}}},
            None,
            None,
            r"`tool.precompile.mode` must be one of 'default', 'max-autotune', not 'reduce-overhead'",
        ),
        (
            {"targets": {"a": {"script": "cap.py", "mode": True}}},
            None,
            None,
            r"`tool.precompile.targets.a.mode` must be one of 'default', 'max-autotune', not True",
        ),
        (
            {"targets": {"a": {"script": "cap.py"}}},
            {"precompile.mode": "fast"},
            None,
            r"Failed to read config setting `precompile.mode`: it must be one of 'default', 'max-autotune', not 'fast'",
        ),
        (
            {"targets": {"a": {"script": "cap.py"}}},
            None,
            {"PRECOMPILE_MODE": "max-autotun"},
            r"environment variable PRECOMPILE_MODE: it must be one of .* \(did you mean 'max-autotune'\?\)",
        ),
    ],
)
def test_an_invalid_mode_is_refused_naming_the_key(tmp_path, table, cs, environ, where):
    with pytest.raises(ConfigError, match=where):
        _settings(tmp_path, table, cs, environ)


def test_capture_options_mode(monkeypatch):
    from precompile_build.config.capture_options import CaptureOptions
    from precompile_build.errors import CaptureError

    with pytest.raises(
        ValueError,
        match=r"options\['mode'\] = 'max-autotune-no-cudagraphs' .*: use "
        r"'default' or 'max-autotune'; did you mean 'max-autotune'\?",
    ):
        CaptureOptions.parse(target="t", options={"mode": "max-autotune-no-cudagraphs"})
    monkeypatch.delenv("PRECOMPILE_ENGINE", raising=False)
    monkeypatch.setenv("PRECOMPILE_MODE", "max-autotune")  # the target's key, from the build
    assert CaptureOptions.parse(target="t").for_call("cpu") == (
        "frozen",
        {"mode": "max-autotune", "tracer": "auto"},
    )
    # the call's own mode wins over the target's; "default" is no option at all
    assert CaptureOptions.parse(target="t", options={"mode": "default"}).for_call("cpu") == (
        "frozen",
        {"tracer": "auto"},
    )
    with pytest.raises(
        CaptureError,
        match=r"options 'mode' apply to the frozen engine only.*the target's "
        r"`mode` \(PRECOMPILE_MODE\)",
    ):
        CaptureOptions.parse(target="t", engine="torch").for_call("cpu")
    with pytest.raises(
        CaptureError,
        match=r"options 'mode' apply to the frozen engine's kernels, but this "
        r"capture uses engine 'eager'",
    ):
        CaptureOptions.parse(target="t", engine="eager").for_call("cpu")
    monkeypatch.setenv("PRECOMPILE_MODE", "turbo")
    with pytest.raises(
        ValueError, match=r"options\['mode'\] = 'turbo' \(or the target's `mode`, PRECOMPILE_MODE\)"
    ):
        CaptureOptions.parse(target="t").for_call("cpu")
    monkeypatch.setenv("PRECOMPILE_MODE", "default")
    assert CaptureOptions.parse(target="t").for_call("cpu") == ("frozen", {"tracer": "auto"})


def test_the_mode_reaches_inductor_and_the_breakdown(tmp_path, monkeypatch):
    """`mode = "max-autotune"` (PRECOMPILE_MODE, as the build sets it) is Inductor's
    max_autotune during the compile, and the seconds of its autotuning (one timed
    selection here) are recorded for the build's breakdown."""
    import precompile_build
    from precompile_build.process import stats as capture_stats

    seen = []
    real = torch._inductor.standalone_compile

    def spy(*args, **kwargs):
        cfg = torch._inductor.config
        seen.append((cfg.max_autotune, cfg.coordinate_descent_tuning))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch._inductor, "standalone_compile", spy)
    monkeypatch.setenv("PRECOMPILE_MODE", "max-autotune")
    monkeypatch.setenv(capture_stats.STATS_ENV, str(tmp_path / "stats.json"))
    monkeypatch.setenv(
        "TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor")
    )  # autotuned here, not cached
    exec_ns: dict = {}
    exec(MODELS, exec_ns)
    fn, args = exec_ns["example"]("linear_relu")
    with precompile_build.capture(
        fn,
        artifact_path=tmp_path / "t.py",
        cache_path=tmp_path / "t.cache",
        options={"inductor": {"test_configs.autotune_choice_name_regex": "^(bias_)?addmm$"}},
    ) as f:
        f(*args)
    assert seen == [(True, True)]
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert 0 < stats["autotune_s"] <= stats["compile_s"] + stats["first_run_s"]
    _, breakdown = capture_stats.read(tmp_path / "stats.json", None)
    text = capture_stats.describe_breakdown(breakdown)
    assert f"(autotuning {breakdown['autotune']:.1f} s of compile and first run)" in text


def test_a_benchmark_graph_compiled_during_autotuning_is_not_the_pair(tmp_path, monkeypatch):
    """Max-autotune's subgraph choices load benchmark modules of their own into
    PyCodeCache while the graph is lowered (an 8B Llama on the H200, torch 2.11: 6
    modules, and the capture failed); the pair is the graph's wrapper, loaded last,
    served equal to eager."""
    from torch._inductor.codecache import PyCodeCache

    import precompile_build

    real = torch._inductor.standalone_compile

    def with_benchmark_graphs(*args, **kwargs):
        for i in range(2):  # as codegen/subgraph.py's compile_to_module() leaves them
            PyCodeCache.load(f"def call(args):\n    raise AssertionError('benchmark graph {i}')\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(torch._inductor, "standalone_compile", with_benchmark_graphs)
    ns: dict = {}
    exec(MODELS, ns)
    fn, args = ns["example"]("linear_relu")
    src, cache = tmp_path / "t.py", tmp_path / "t.cache"
    with precompile_build.capture(fn, artifact_path=src, cache_path=cache, engine="frozen") as f:
        f(*args)
    assert "benchmark graph" not in src.read_text()
    r = serve(src, cache, "linear_relu", tmp_path)
    assert r["uses_kernels"] and r["compiler_modules"] == []
    assert r["max_err"] < 1e-5


def test_no_new_compiled_graph_names_the_fallback_and_the_fallback_serves(tmp_path, monkeypatch):
    """Where Inductor loads no new wrapper (here its modules are taken out of
    PyCodeCache as it returns), the capture says what to do, nothing is written, and
    with `fallback = "eager"` the target is captured with the eager engine instead."""
    from torch._inductor.codecache import PyCodeCache

    import precompile_build
    from precompile_build.errors import CompilerFailed

    real = torch._inductor.standalone_compile

    def losing_its_wrapper(*args, **kwargs):
        before = list(PyCodeCache.modules)
        out = real(*args, **kwargs)
        PyCodeCache.modules[:] = [m for m in PyCodeCache.modules if m in before]
        return out

    monkeypatch.setattr(torch._inductor, "standalone_compile", losing_its_wrapper)
    ns: dict = {}
    exec(MODELS, ns)
    fn, args = ns["example"]("linear_relu")
    src, cache = tmp_path / "t.py", tmp_path / "t.cache"
    with pytest.raises(
        CompilerFailed,
        match=r"loaded no new compiled graph.*set `fallback = \"eager\"` in its "
        r"\[tool\.precompile\.targets\.t\] table",
    ):
        with precompile_build.capture(
            fn, artifact_path=src, cache_path=cache, engine="frozen", target="t"
        ) as f:
            f(*args)
    assert not src.exists() and not cache.exists()
    with precompile_build.capture(
        fn, artifact_path=src, cache_path=cache, engine="frozen", target="t", fallback="eager"
    ) as f:
        f(*args)
    assert metadata(src)["engine"] == "eager"


# ---- an extern choice bound as a plain torch call ----------------------------------


def test_an_extern_choice_is_a_plain_torch_call_served_without_the_compiler(tmp_path):
    """Inductor's `bias_addmm` (a Python function of torch/_inductor/kernel/mm.py) is
    copied into the source half; served equal to eager with no compiler module."""
    import precompile_build

    ns: dict = {}
    exec(MODELS, ns)
    fn, args = ns["example"]("linear_relu")
    src, cache = tmp_path / "t.py", tmp_path / "t.cache"
    with precompile_build.capture(
        fn,
        artifact_path=src,
        cache_path=cache,
        engine="frozen",
        options={
            "mode": "max-autotune",  # bias_addmm, the only choice left
            "inductor": {"test_configs.autotune_choice_name_regex": "bias_addmm"},
        },
    ) as f:
        f(*args)
    text = src.read_text()
    assert "extern_kernels.bias_addmm(" in text and "def _extern_bias_addmm(" in text
    assert "bias_addmm = staticmethod(_extern_bias_addmm)" in text
    wrapper = text[text.index("def _make_call(") : text.index("    return call\n")]
    assert "torch._inductor" not in wrapper and "select_algorithm" not in wrapper
    r = serve(src, cache, "linear_relu", tmp_path)
    assert r["uses_kernels"] and r["compiler_modules"] == []
    assert r["max_err"] < 1e-5


def test_extern_bindings_and_what_cannot_be_bound():
    from torch._inductor.kernel import mm  # noqa: F401 - registers mm's extern kernels
    from torch._inductor.select_algorithm import extern_kernels

    from precompile_build.engines import extern_calls

    assert extern_calls.bind("mm", extern_kernels.mm).expr == "torch.mm"
    assert (
        extern_calls.bind("mm_dtype", torch.mm).expr == "torch.mm"
    )  # another name, the same function
    assert (
        extern_calls.bind("_mm_plus_mm", torch.ops.inductor._mm_plus_mm).expr
        == "torch.ops.inductor._mm_plus_mm"
    )
    assert (
        extern_calls.bind("addmm_out", torch.ops.aten.addmm.out).expr == "torch.ops.aten.addmm.out"
    )
    code = extern_calls.bind("bias_addmm", extern_kernels.bias_addmm).code
    copied: dict = {"torch": torch}
    exec(code, copied)  # runs on torch alone
    bias, a, b = torch.randn(1, 3).expand(4, 3), torch.randn(4, 5), torch.randn(5, 3)
    torch.testing.assert_close(copied["_extern_bias_addmm"](bias, a, b), torch.addmm(bias, a, b))
    from torch._inductor.kernel import conv  # noqa: F401 - registers conv's: conv1x1_via_mm, call_aten_dw...

    exec(extern_calls.bind("conv1x1_via_mm", extern_kernels.conv1x1_via_mm).code, copied)
    x, w = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last), torch.randn(5, 4, 1, 1)
    out = torch.empty(2, 5, 3, 3).to(memory_format=torch.channels_last)
    copied["_extern_conv1x1_via_mm"](x, w, out=out)  # the wrapper reads `out`
    torch.testing.assert_close(out, torch.nn.functional.conv2d(x, w))

    scale = 2.0

    def reads_a_module_global(x, *, out):
        return torch.mul(x, SCALE, out=out)

    def reads_an_unknown_name(x, *, out):
        return torch.mul(x, UNDEFINED, out=out)  # noqa: F821 - the point of the case

    def a_closure(x, *, out):
        return torch.mul(x, scale, out=out)

    def default_not_literal(x, *, out, alpha=torch.float32):
        return x

    cases = {
        reads_a_module_global: "reads 'SCALE' of its module",
        reads_an_unknown_name: "reads 'UNDEFINED', which is neither a module global nor a builtin",
        a_closure: "is a closure",
        default_not_literal: "has a default that is not a literal",
        print: "is neither a torch function nor a Python function over torch",
    }
    for impl, why in cases.items():
        assert why in (extern_calls.problem("k", impl) or ""), impl
    with pytest.raises(
        Exception, match="cannot bind without the compiler stack .*reads 'SCALE' of its module"
    ):
        import ast as _ast

        extern_kernels.precompile_test_kernel = reads_a_module_global
        try:
            extern_calls.namespace(
                _ast.parse("extern_kernels.precompile_test_kernel(x, out=y)"), "t"
            )
        finally:
            del extern_kernels.precompile_test_kernel


SCALE = (
    2.0  # a module global of this test file: not torch, so a function reading it cannot be copied
)


# ---- a choice that cannot be frozen: the best-timed one that can, in the build line ----

CAPTURE_SCRIPT = '''
"""Forces the fallback: aten's bmm is timed fastest and declared unfreezable."""
import torch
import precompile_build
from precompile_build.engines import autotune
from torch._inductor.select_algorithm import AlgorithmSelectorCache

models = {}
exec(open("capture/models.py").read(), models)
real = AlgorithmSelectorCache.do_autotuning

def do_autotuning(self, *args, **kwargs):  # aten's bmm measured fastest, whatever the timer says
    timings = real(self, *args, **kwargs)
    return {c: (1e-6 if c.name == "bmm" else t) for c, t in timings.items()}

AlgorithmSelectorCache.do_autotuning = do_autotuning
real_problem = autotune.choice_problem
autotune.choice_problem = lambda c: "forced by the test" if c.name == "bmm" else real_problem(c)
fn, args = models["example"]("bmm_scaled")
with precompile_build.capture(fn) as f:
    f(*args)
'''


def test_an_unfreezable_fastest_choice_gives_way_to_the_best_timed_one_that_can(
    tmp_path, monkeypatch, capfd, build_env
):
    """The build goes on with the C++ BMM template (compiled into the pair's kernels);
    the build line says what was replaced, the breakdown the autotuning seconds; served
    equal to eager with no compiler module."""
    from precompile_build.builder import runner
    from precompile_build.config.settings import load_settings

    root = make_project(
        tmp_path,
        '[tool.precompile.targets.bmm]\nscript = "capture/bmm.py"\n'
        'device = "cpu"\nmode = "max-autotune"\ntimeout = 600\n',
    )
    (root / "capture" / "bmm.py").write_text(CAPTURE_SCRIPT)
    (root / "capture" / "models.py").write_text(MODELS)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    (r,) = runner.run_captures(load_settings(root, {"precompile.cache": "off"}), tmp_path / "work")
    assert r.status == "ok", r.reason
    err = capfd.readouterr().err
    line = next(ln for ln in err.splitlines() if "precompile: bmm: max-autotune: " in ln)
    assert re.search(
        r"max-autotune: bmm: bmm\b.* \(1e-06 ms\) cannot be frozen \(forced by the test\); "
        r"froze cpp_\w+.* \([0-9.e-]+ ms, [0-9.]+x its time\)",
        line,
    ), line
    assert "autotuning" in next(ln for ln in err.splitlines() if "precompile: bmm: ok on cpu" in ln)
    assert (
        0
        < r.capture_breakdown["autotune"]
        <= r.capture_breakdown["compile"] + r.capture_breakdown["first_run"]
    )
    text = r.source_path.read_text()
    assert "extern_kernels" not in text  # the template, not aten's bmm
    kernels = metadata(r.source_path)["kernels"]
    assert {k["kind"] for k in kernels} == {"cpp"} and any("bmm" in k["name"] for k in kernels)
    served = serve(r.source_path, r.cache_path, "bmm_scaled", tmp_path)
    assert served["uses_kernels"] and served["compiler_modules"] == []
    assert served["max_err"] < 1e-4
