"""`cuda-archs`: settings, compile-only Triton for other GPUs (where triton is
installed), the serving side's choice of binary with a faked device capability,
manifest and `inspect` fields, merge's preference for native builds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from _build_helpers import make_project, target_toml

from precompile_build.errors import CaptureError, ConfigError
from precompile_build.settings import load_settings
from precompile_runtime import arch_select

HERE = Path(__file__).parent


# ---- settings -------------------------------------------------------------------

def _load(tmp_path, toml, cs=None, env=None):
    return load_settings(make_project(tmp_path, toml), cs, env or {})


def test_cuda_archs_precedence(tmp_path):
    toml = ('[tool.precompile]\ncuda-archs = ["9.0", "8.0", "8.0"]\n'
            + target_toml("a") + target_toml("b", extra='cuda-archs = ["8.6"]')
            + target_toml("c", extra='device = "cpu"'))
    s = _load(tmp_path, toml)
    got = {n: t.cuda_archs for n, t in s.targets.items()}
    # sorted by capability, duplicates dropped; the target's key wins; cpu targets get none
    assert got == {"a": ("8.0", "9.0"), "b": ("8.6",), "c": ()}
    s = load_settings(s.root, {"precompile.cuda-archs": "12.0,sm_100"},
                      {"PRECOMPILE_CUDA_ARCHS": "8.9"})
    assert s.targets["a"].cuda_archs == s.targets["b"].cuda_archs == ("8.9",)  # env > -C > keys
    s = load_settings(s.root, {"precompile.cuda-archs": "12.0,sm_100"}, {})
    assert s.targets["b"].cuda_archs == ("10.0", "12.0") and s.targets["c"].cuda_archs == ()


@pytest.mark.parametrize("toml, cs, env, match", [
    ('[tool.precompile]\ncuda-archs = ["8.5"]\n', None, None,
     r"`tool.precompile.cuda-archs` has '8.5' .*use some of 7.5, 8.0"),
    ('[tool.precompile]\ncuda-archs = "8.0"\n', None, None,
     r"`tool.precompile.cuda-archs` must be an array of compute capabilities"),
    ('[tool.precompile]\ncuda-archs = [8.0]\n', None, None,
     r"`tool.precompile.cuda-archs` must be an array of strings such as \"8.0\", not 8.0 \(a number\)"),
    ("", None, None, r"`tool.precompile.targets.double.cuda-archs` has '90'"),
    ("", {"precompile.cuda-archs": "8.0,nine"}, None,
     r"config setting `precompile.cuda-archs`: it has 'nine'"),
    ("", None, {"PRECOMPILE_CUDA_ARCHS": "9.1"},
     r"environment variable PRECOMPILE_CUDA_ARCHS: it has '9.1' \(did you mean '9.0'\?\)"),
])
def test_cuda_archs_bad_values_name_the_key(tmp_path, toml, cs, env, match):
    extra = 'cuda-archs = ["90"]' if not toml and not cs and not env else ""
    with pytest.raises(ConfigError, match=match):
        _load(tmp_path, toml + target_toml(extra=extra), cs, env)


def test_cuda_archs_on_a_cpu_target_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"`tool.precompile.targets.double.cuda-archs` compiles "
                                          r"CUDA kernels .* `tool.precompile.targets.double.device` is \"cpu\""):
        _load(tmp_path, target_toml(extra='device = "cpu"\ncuda-archs = ["8.0"]'))


def test_cuda_archs_reach_the_script_and_the_cache_key(tmp_path):
    from precompile_build import capture_cache
    from precompile_build.script import script_env

    s = _load(tmp_path, target_toml(extra='cuda-archs = ["8.0", "12.0"]'))
    t = s.targets["double"]
    env = script_env(s, t, "cuda", tmp_path / "a.py", tmp_path / "a.cache", "0")
    assert env["PRECOMPILE_CUDA_ARCHS"] == "8.0,12.0"
    assert "PRECOMPILE_CUDA_ARCHS" not in script_env(s, t, "cpu", tmp_path / "a.py", tmp_path / "a.cache", None)
    fp = {"torch": "x"}
    key = capture_cache.key_components(s, t, "cuda", fp, "0" * 64)
    assert key["target"]["cuda_archs"] == ["8.0", "12.0"]


def test_capture_option_parsing():
    from precompile_build.engines import cross_arch

    assert cross_arch.requested({"cuda_archs": "9.0, 8.0"}, "t") == ("8.0", "9.0")
    assert cross_arch.requested({"cuda_archs": ["12.0"]}, "t") == ("12.0",)
    assert cross_arch.requested({}, "t") == ()
    with pytest.raises(CaptureError, match=r"target 't': .*cuda_archs.*'7.0'"):
        cross_arch.requested({"cuda_archs": "7.0"}, "t")


# ---- selection rules (faked device capability) -----------------------------------

@pytest.mark.parametrize("host, names, want", [
    ((8, 6), ["sm_80", "sm_90a", "compute_80"], "sm_80"),          # lower minor, same major
    ((8, 6), ["sm_80", "sm_86", "compute_80"], "sm_86"),           # exact wins
    ((8, 9), ["sm_86", "sm_80"], "sm_86"),                         # the highest lower minor
    ((9, 0), ["sm_80", "compute_80", "sm_100a"], "compute_80"),    # other major: PTX only
    ((10, 3), ["sm_100a", "compute_80"], "compute_80"),            # sm_100a runs on 10.0 only
    ((10, 0), ["sm_100a", "compute_80"], "sm_100a"),
    ((7, 5), ["sm_80", "compute_80"], None),                       # older GPU: nothing
    ((12, 0), ["sm_90a", "sm_100a"], None),
])
def test_binary_choice(host, names, want):
    assert arch_select.best(names, host) == want


def test_force_ptx_switch(monkeypatch):
    monkeypatch.setenv(arch_select.FORCE_PTX_ENV, "1")
    assert arch_select.best(["sm_90a", "compute_80"], (9, 0)) == "compute_80"
    assert arch_select.best(["sm_90a"], (9, 0)) == "sm_90a"


def _fp(cc, binaries=None, **kw):
    fp = {"torch": "2.11.0+cu130", "cuda": "13.0", "hip": None, "triton": "3.6.0",
          "python": "3.12", "platform": "linux-x86_64", "device_type": "cuda",
          "compute_capability": cc, "gpu_name": "GPU"}
    if binaries:
        fp["cuda_binaries"] = binaries
    return {**fp, **kw}


def _variant(i, fp):
    return {"id": f"v{i}", "engine": "frozen", "device": "cuda", "fingerprint": fp}


def test_mismatches_use_the_binary_rules():
    from precompile_runtime.fingerprint import mismatches

    cross = _fp("9.0", "compute_80 sm_80 sm_90a")
    assert mismatches(cross, _fp("8.6")) == []
    assert mismatches(cross, _fp("12.0")) == []  # through PTX
    assert mismatches(_fp("9.0", "sm_80 sm_90a"), _fp("12.0")) == [
        "compute_capability: built for sm_80 sm_90a (tuned on 9.0), none of which runs on this "
        "host's '12.0'"]
    assert mismatches(_fp("9.0"), _fp("8.6")) == [
        "compute_capability: built for '9.0', this host has '8.6'"]  # single-arch: exact


@pytest.mark.parametrize("host, want", [("8.0", "v1"), ("8.6", "v0"), ("9.0", "v0"), ("12.0", "v0")])
def test_loader_prefers_the_native_build(monkeypatch, host, want):
    """merge of an H200 wheel (sm_80/90/120 cubins, tuned on 9.0) with an A100 wheel
    (native sm_80): the A100's variant serves the A100; an sm_86 host gets the H200's
    sm_80 cubins, sized for sm_86's shared memory (a single-architecture variant's
    configs are sized for its own GPU only and keep matching it exactly)."""
    from precompile_runtime import fingerprint, loader

    monkeypatch.setattr(fingerprint, "host_fingerprint", lambda device, index=None: _fp(host))
    variants = [_variant(0, _fp("9.0", "compute_80 sm_120a sm_80 sm_90a")), _variant(1, _fp("8.0"))]
    chosen, _ = loader._select(variants)
    assert chosen["id"] == want


@pytest.mark.parametrize("strict, no_compile, outcome", [
    (False, False, "warn"), (True, False, "strict mode"), (False, True, "PRECOMPILE_NO_COMPILE=1")])
def test_ptx_only_is_a_compile_at_load(monkeypatch, strict, no_compile, outcome):
    from precompile_runtime.errors import HostMismatchError

    if no_compile:
        monkeypatch.setenv("PRECOMPILE_NO_COMPILE", "1")
    else:
        monkeypatch.delenv("PRECOMPILE_NO_COMPILE", raising=False)
    v = _variant(0, _fp("9.0", "compute_80 sm_80 sm_90a"))
    arch_select.check_jit_at_load("ctx", v, "8.6", strict)  # a cubin: nothing to say
    if outcome == "warn":
        with pytest.warns(arch_select.PtxJitWarning, match=r"ctx: this GPU \(compute capability 12.0\)"
                                                           r" has no cubin.*Add \"12.0\" to `cuda-archs`"):
            arch_select.check_jit_at_load("ctx", v, "12.0", strict)
    else:
        with pytest.raises(HostMismatchError, match=f"JIT-compile its PTX.*Refused under {outcome}"):
            arch_select.check_jit_at_load("ctx", v, "12.0", strict)


def _kernel_namespace(monkeypatch, cc):
    """The serving templates (kernel loader, binary rules, launcher), as a pair's
    source runs them, on a device of capability ``cc``."""
    import os

    import torch

    from precompile_build.engines import codegen
    from precompile_runtime.errors import CallError

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    ns = {"torch": torch, "_os": os, "CallError": CallError, "_META": {"target": "t"}}
    src = codegen._template("_kernel_loader.py") + "\n\n" + codegen.triton_launcher_code()
    exec(compile(src, "source half", "exec"), ns)
    return ns


def _entry():
    def c(sm, binary):
        return {"sm": sm, "binary": binary, "file": f"{binary}/{sm}.{binary}", "shared": 0}
    return {"name": "k", "file": "cubin/sm_90a.cubin",
            "archs": [c("sm_80", "cubin"), c("compute_80", "ptx"), c("sm_90a", "cubin")]}


@pytest.mark.parametrize("cc, file", [((9, 0), "cubin/sm_90a.cubin"), ((8, 9), "cubin/sm_80.cubin"),
                                      ((12, 0), "ptx/compute_80.ptx")])
def test_kernel_binary_per_device(monkeypatch, cc, file):
    monkeypatch.delenv("PRECOMPILE_NO_COMPILE", raising=False)
    ns = _kernel_namespace(monkeypatch, cc)
    k = ns["_TritonKernel"]("/d/cubin/sm_90a.cubin", _entry())
    chosen, path = k._choose(0)
    assert path == "/d/" + file and chosen["file"] == file


def test_kernel_without_a_binary_for_the_device(monkeypatch):
    from precompile_runtime.errors import CallError

    ns = _kernel_namespace(monkeypatch, (7, 5))
    with pytest.raises(CallError, match=r"'k' has no binary for cuda:0 \(compute capability 7.5\); it "
                                        r"has sm_80, compute_80, sm_90a: add \"7.5\" to `cuda-archs`"):
        ns["_TritonKernel"]("/d/cubin/sm_90a.cubin", _entry())._choose(0)
    monkeypatch.setenv("PRECOMPILE_NO_COMPILE", "1")
    ns = _kernel_namespace(monkeypatch, (12, 0))
    with pytest.raises(CallError, match="only PTX .* refused under PRECOMPILE_NO_COMPILE=1"):
        ns["_TritonKernel"]("/d/cubin/sm_90a.cubin", _entry())._choose(0)


# ---- manifest, inspect, merge ----------------------------------------------------

REPORT = {"tuned_on": "9.0", "validated_on": ["9.0"], "compiled_for": ["8.0", "9.0", "12.0"],
          "binaries": ["compute_80", "sm_120a", "sm_80", "sm_90a"],
          "left_out": {"8.6": "kernel triton_mm: config A: needs 131072 bytes of shared memory "
                              "per block, sm_86 has 101376"},
          "replaced": {"12.0": {"triton_mm": "BK=256 does not fit sm_120a; using BK=64"}}}


def _result(tmp_path, name, fp, meta):
    from precompile_build.pairs import PairInfo
    from precompile_build.runner import CaptureResult

    d = tmp_path / f"pairs-{fp['compute_capability']}"
    d.mkdir(exist_ok=True)
    src, cache = d / f"{name}.py", d / f"{name}.cache"
    src.write_bytes(b"# source " + fp["compute_capability"].encode())
    cache.write_bytes(b"cache")
    info = PairInfo("frozen", hashlib.sha256(src.read_bytes()).hexdigest(), fp, "cuda", meta)
    return CaptureResult(name, "ok", True, "cuda", seconds=1.0, source_path=src, cache_path=cache,
                         info=info, device_index=0)


def test_manifest_and_inspect_of_a_multi_arch_variant(tmp_path, monkeypatch):
    from precompile_build import inspect_cmd, manifest_build

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    files = manifest_build.assemble("pkg", [
        _result(tmp_path, "forward", _fp("9.0", " ".join(REPORT["binaries"])), {"cuda_archs": REPORT})])
    doc = json.loads(files["manifest.json"])
    v = doc["targets"]["forward"]["variants"][0]
    assert (v["compiled_for"], v["tuned_on"], v["validated_on"]) == (["8.0", "9.0", "12.0"], "9.0", ["9.0"])
    assert v["left_out"] == REPORT["left_out"] and v["replaced"] == REPORT["replaced"]
    out = tmp_path / "pre"
    out.mkdir()
    for n, data in files.items():
        (out / n).write_bytes(data)
    report = inspect_cmd.inspect_report(str(out), host=lambda d: _fp("8.6"))
    rv = report["targets"]["forward"]["variants"][0]
    assert rv["matches_host"] and rv["compiled_for"] == ["8.0", "9.0", "12.0"]
    text = inspect_cmd.format_report(report)
    assert "compiled for sm 8.0 9.0 12.0; tuned on 9.0; validated (run) on 9.0" in text
    assert "binaries: compute_80 sm_120a sm_80 sm_90a" in text
    assert "left out 8.6: kernel triton_mm: config A: needs 131072 bytes" in text
    assert "config replaced for 12.0, kernel triton_mm: BK=256 does not fit" in text


def test_single_arch_cuda_variant_records_its_gpu(tmp_path):
    from precompile_build import arch_report, manifest_build

    files = manifest_build.assemble("pkg", [_result(tmp_path, "f", _fp("8.0"), {})])
    v = json.loads(files["manifest.json"])["targets"]["f"]["variants"][0]
    assert (v["compiled_for"], v["tuned_on"], v["validated_on"]) == (["8.0"], "8.0", ["8.0"])
    assert arch_report.variant_fields({"device_type": "cpu"}, {}, "frozen") == {}
    assert arch_report.variant_fields(_fp("9.0"), {}, "torch") == {}  # torch's own kernels
    assert arch_report.build_line({}) == ""
    assert arch_report.build_line({"cuda_archs": REPORT}) == (
        "; compiled for sm 8.0 9.0 12.0 (tuned and validated on 9.0; left out 8.6: "
        + REPORT["left_out"]["8.6"] + "; config replaced for 12.0: triton_mm)")


# ---- real compile-only Triton (where triton is installed) ---------------------------

SIG = {"a": "*fp16", "b": "*fp16", "c": "*fp16", "M": "i32", "N": "i32", "K": "i32",
       "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"}


def _cand(fn, signature, constants, config, launcher="def launcher(stream):\n    pass\n", **options):
    return {"module": str(HERE / "_cross_arch_kernels.py"), "fn_name": fn, "signature": signature,
            "constants": constants, "attrs": {}, "options": {"num_warps": 4, "num_stages": 2, **options},
            "config": config, "launcher": launcher, "seconds": None}


def _triton_entry(name, config):
    return {"name": name, "kind": "triton", "file": "cubin/native.cubin", "sha256": "0" * 64,
            "function": name, "num_warps": 4, "shared": 0, "arg_tys": "OOOiiiOO", "scratch": 2,
            "config": config, "launcher": "def launcher(stream):\n    pass\n"}


def _cuobjdump_arch(cubin: bytes, tmp_path) -> str | None:
    """The SM ``cuobjdump --list-elf`` (shipped in the triton wheel) names for a cubin
    (it appends it to the file name: ``k.sm_80.cubin``); None without cuobjdump."""
    import os
    import re
    import subprocess

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    if not os.path.exists(tool):
        return None
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    out = subprocess.run([tool, "--list-elf", str(path)], capture_output=True, text=True, timeout=60)
    found = re.findall(r"ELF file\s+1: k\.(sm_\d+a?)\.cubin", out.stdout)
    assert len(found) == 1, out.stdout + out.stderr
    return found[0]


def test_cross_compile_replaces_a_config_too_big_for_sm86(monkeypatch, tmp_path):
    """Compile-only Triton on this (GPU-less) host: a matmul config needing 128 KiB of
    shared memory fits sm_80 (163 KiB) but not sm_86 or sm_120 (99 KiB), where the
    build GPU's next best candidate replaces it; sm_80 also gets PTX; every cubin's
    ELF header names the SM it is filed under. A kernel whose type sm_80 lacks
    (float8e4nv) leaves 8.0 out, with the reason."""
    pytest.importorskip("triton")
    from precompile_build.engines import cross_arch

    monkeypatch.delenv(cross_arch.TEST_CROSS_NATIVE_ENV, raising=False)
    big = _cand("mm", SIG, {"BM": 128, "BN": 128, "BK": 256}, "BK=256",
                launcher="def launcher(stream):\n    runner(1, 1, 1, stream)\n")
    small = _cand("mm", SIG, {"BM": 128, "BN": 128, "BK": 64}, "BK=64")
    kernels, blobs = [_triton_entry("mm", "BK=256")], {}
    report = cross_arch.cross_compile(kernels, blobs, {"mm": [big, small]},
                                      ("8.0", "8.6", "12.0"), "9.0", "t")
    assert report["compiled_for"] == ["8.0", "8.6", "9.0", "12.0"] and report["left_out"] == {}
    # the PTX, which any later GPU without a cubin may JIT, is sized for 99 KiB too
    assert set(report["replaced"]) == {"8.6", "12.0", "8.0 (PTX)"}
    assert "the compute_80 PTX (JIT-compiled on any later GPU without a cubin) may use 101376" in \
        report["replaced"]["8.0 (PTX)"]["mm"]
    assert ("needs 131072 bytes of shared memory per block, the sm_86 cubin (which also serves "
            "sm_87, sm_89) may use 101376") in report["replaced"]["8.6"]["mm"]
    assert "the sm_120 cubin may use 101376" in report["replaced"]["12.0"]["mm"]
    by_sm = {c["sm"]: c for c in kernels[0]["archs"]}
    assert set(by_sm) == {"sm_80", "compute_80", "sm_86", "sm_90a", "sm_120a"}
    assert by_sm["sm_80"]["config"] == "BK=256" and by_sm["sm_80"]["shared"] == 131072
    assert by_sm["sm_80"]["launcher"] == big["launcher"]
    assert by_sm["sm_86"]["config"] == by_sm["sm_120a"]["config"] == by_sm["compute_80"]["config"] == "BK=64"
    assert by_sm["sm_90a"]["origin"] == "native" and by_sm["sm_90a"]["file"] == "cubin/native.cubin"
    for c in kernels[0]["archs"]:
        if c["origin"] == "cross":
            data = blobs[c["file"]]
            assert hashlib.sha256(data).hexdigest() == c["sha256"]
            if c["binary"] == "cubin":
                assert cross_arch.cubin_target(data) == c["sm"]
                assert _cuobjdump_arch(data, tmp_path) in (c["sm"], None)
            else:
                assert b".target sm_80" in data
    assert report["binaries"] == ["compute_80", "sm_120a", "sm_80", "sm_86", "sm_90a"]

    fp8 = _cand("fp8_cast", {"x": "*fp32", "y": "*fp8e4nv", "n": "i32", "BLOCK": "constexpr"},
                {"BLOCK": 256}, "BLOCK=256")
    kernels = [_triton_entry("fp8_cast", "BLOCK=256")]
    report = cross_arch.cross_compile(kernels, {}, {"fp8_cast": [fp8]}, ("8.0", "8.9"), "9.0", "t")
    assert report["compiled_for"] == ["8.9", "9.0"]
    assert "fp8e4nv not supported in this architecture" in report["left_out"]["8.0"]
    assert {c["sm"] for c in kernels[0]["archs"]} == {"sm_89", "sm_90a"}


def test_cubin_arch_refuses_other_files():
    from precompile_build.engines import cross_arch

    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        cross_arch.cubin_arch(b"hello")


def test_shared_limit_covers_the_minors_a_cubin_serves():
    from precompile_build.engines.cross_arch import shared_limit

    assert shared_limit("8.0", ("8.0", "9.0")) == (99 * 1024, ["8.0", "8.6", "8.7", "8.9"])
    assert shared_limit("8.0", ("8.0", "8.6")) == (163 * 1024, ["8.0"])
    assert shared_limit("8.6", ("8.0", "8.6")) == (99 * 1024, ["8.6", "8.7", "8.9"])
    assert shared_limit("9.0", ("9.0",)) == (227 * 1024, ["9.0"])  # sm_90a: that GPU only
    assert shared_limit("12.0", ("12.0",)) == (99 * 1024, ["12.0"])


def test_recording_keeps_what_a_cross_compile_needs(monkeypatch):
    """The hooks around Inductor's compile (triton.compile's options, the static
    kernel's source, autotuning's timings) give the candidates in the order to try:
    the chosen config, then the others fastest first; they compile for sm_86."""
    triton = pytest.importorskip("triton")
    from torch._inductor.runtime import triton_heuristics as th
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from precompile_build.engines import _triton_freeze, cross_arch
    from precompile_build.engines._cross_compile import jit_function

    fn = jit_function(str(HERE / "_cross_arch_kernels.py"), "mm")
    launchers = []

    class Tuner(th.CachingAutotuner):
        def __init__(self):  # the hooks read no other state
            pass
    # autotuning's timings: the recording wraps whatever benchmark_all_configs is
    monkeypatch.setattr(th.CachingAutotuner, "benchmark_all_configs", lambda self: {
        launchers[0]: 0.5, launchers[1]: 0.2, launchers[2]: 0.3})
    tuner = Tuner()
    with cross_arch.recording():
        for bk in (64, 256, 128):
            binary = triton.compile(ASTSource(fn, SIG, {"BM": 64, "BN": 64, "BK": bk}),
                                    target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 2})
            binary._cubin_path = None  # Inductor sets it where it wrote the cubin
            kernel = _triton_freeze._static_kernel_class()(binary)

            def launcher():
                pass
            launcher.config = f"BK={bk}"
            setattr(launcher, _triton_freeze._CODE, f"def launcher(stream):\n    pass  # {bk}\n")
            setattr(launcher, _triton_freeze._RESULT, type("R", (), {"kernel": kernel})())
            launchers.append(launcher)
        tuner.benchmark_all_configs()
    import pickle

    pickle.dumps(kernel)  # what is kept is kept aside: Inductor still pickles its static kernels
    assert not [a for a in vars(kernel) if a.startswith("_precompile")]
    tuner.launchers = [launchers[0]]
    got = cross_arch.candidates(tuner)
    assert [c["config"] for c in got] == ["BK=64", "BK=256", "BK=128"]
    assert [c["seconds"] for c in got] == [0.5, 0.2, 0.3]
    assert got[0]["options"] == {"num_warps": 4, "num_stages": 2} and got[0]["fn_name"] == "mm"
    assert got[1]["launcher"].endswith("# 256\n")
    kernels = [_triton_entry("mm", "BK=64")]
    report = cross_arch.cross_compile(kernels, {}, {"mm": got}, ("8.6",), "9.0", "t")
    assert report["compiled_for"] == ["8.6", "9.0"] and not report["replaced"]
    assert not hasattr(triton.compile, "__wrapped__") and triton.compile.__name__ == "compile"


def test_merge_marks_native_builds_and_the_runtime_prefers_them(tmp_path, monkeypatch):
    """An H200 wheel cross-compiled for 8.0/9.0/12.0 merged with an A100 wheel built
    natively on 8.0: the merged manifest says the A100's variant serves 8.0, and the
    loader picks it on an sm_80 host (the H200's cross-compiled sm_80 on sm_86)."""
    from precompile_build import inspect_cmd, manifest_build
    from precompile_build.merge import _merge_manifests
    from precompile_runtime import fingerprint, loader

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    parts = []
    for fp, meta in ((_fp("9.0", " ".join(REPORT["binaries"])), {"cuda_archs": REPORT}), (_fp("8.0"), {})):
        files = manifest_build.assemble("pkg", [_result(tmp_path, "forward", fp, meta)])
        parts.append({"doc": json.loads(files["manifest.json"]), "files": files})
    doc, files = _merge_manifests(parts, ["h200.whl", "a100.whl"])
    cross, native = doc["targets"]["forward"]["variants"]
    assert cross["native_elsewhere"] == {"8.0": native["id"]} and "native_elsewhere" not in native
    assert len({v["files"]["source"]["path"] for v in (cross, native)}) == 2  # both pairs kept
    for host, want in (("8.0", native), ("8.6", cross), ("9.0", cross)):
        monkeypatch.setattr(fingerprint, "host_fingerprint", lambda device, index=None, h=host: _fp(h))
        assert loader._select([cross, native])[0]["id"] == want["id"]
    out = tmp_path / "merged"
    out.mkdir()
    for n, data in files.items():
        (out / n).write_bytes(data)
    text = inspect_cmd.format_report(inspect_cmd.inspect_report(str(out), host=lambda d: _fp("8.0")))
    assert f"8.0: variant {native['id']} was built natively on it and is preferred there" in text


def test_worker_imports_inductor_kernel_modules_without_a_gpu():
    """The compile-only process sees no GPU (CUDA_VISIBLE_DEVICES=""): an Inductor
    kernel module, which probes for a GPU driver on import, still compiles there."""
    pytest.importorskip("triton")
    from precompile_build.engines import cross_arch

    module = str(HERE / "_inductor_like_kernel.py")
    cand = {"module": module, "fn_name": "triton_poi_fused_gelu_0",
            "signature": {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"},
            "constants": {"XBLOCK": 1024}, "attrs": {(0,): [["tt.divisibility", 16]]},
            "options": {"num_warps": 4, "num_stages": 1, "debug": True, "sanitize_overflow": False},
            "config": "XBLOCK: 1024"}
    jobs = [{"arch": a, "cc": cross_arch.cc_int(a), "shared_limit": 99 * 1024, "want_ptx": a == "8.0",
             "candidates": [cand]} for a in ("8.0", "10.0")]
    r80, r100 = cross_arch.compile_jobs(jobs, "t")
    assert (r80["sm"], r100["sm"]) == ("sm_80", "sm_100a") and r80["rejected"] == []
    assert cross_arch.cubin_target(r80["cubin"]) == "sm_80" and cross_arch.cubin_target(r100["cubin"]) == "sm_100a"
    assert ".target sm_80" in r80["ptx"] and r100["ptx"] is None


def test_candidate_from_inductor_compile_meta():
    """A kernel Inductor restored from its caches (no triton.compile seen): the
    compile call is rebuilt from the compile result's compile_meta."""
    pytest.importorskip("triton")
    from precompile_build.engines import _triton_freeze, cross_arch
    from precompile_build.engines._cross_compile import jit_function

    fn = jit_function(str(HERE / "_cross_arch_kernels.py"), "mm")
    cm = {"signature": SIG, "constants": {"BM": 64, "BN": 64, "BK": 64}, "configs": [{}],
          "num_warps": 8, "num_stages": 3, "debug": True, "launch_pdl": False, "disable_ftz": True}

    def launcher():
        pass
    launcher.config = "BK=64"
    setattr(launcher, _triton_freeze._CODE, "def launcher(stream):\n    pass\n")
    setattr(launcher, _triton_freeze._RESULT, type("R", (), {"compile_meta": cm, "kernel": None})())
    tuner = type("T", (), {"fn": fn, "launchers": [launcher]})()
    (c,) = cross_arch.candidates(tuner)
    assert c["options"] == {"num_warps": 8, "num_stages": 3, "debug": True, "sanitize_overflow": False,
                            "launch_pdl": False, "enable_reflect_ftz": False}
    assert c["module"].endswith("_cross_arch_kernels.py") and c["constants"]["BK"] == 64
    (res,) = cross_arch.compile_jobs([{"arch": "8.0", "cc": 80, "shared_limit": 99 * 1024,
                                       "want_ptx": False, "candidates": [c]}], "t")
    assert res["num_warps"] == 8 and cross_arch.cubin_arch(res["cubin"]) == 80


def test_candidates_start_from_the_chosen_config():
    """The chosen config comes first even when slower ones were timed faster (coordinate
    descent), configs that failed on the build GPU (inf) are left out, and a chosen
    config whose compile was not recorded gives no candidates at all."""
    from precompile_build.engines import _triton_freeze, cross_arch

    def launcher(name, recorded=True):
        def fn():
            pass
        fn.config = name
        setattr(fn, _triton_freeze._CODE, f"def launcher():\n    pass  # {name}\n")
        if recorded:
            cm = {"signature": {"x": "*fp32"}, "constants": {}, "configs": [{}], "num_warps": 4, "num_stages": 1}
            setattr(fn, _triton_freeze._RESULT, type("R", (), {"compile_meta": cm, "kernel": None})())
        return fn

    jit = type("J", (), {"__name__": "k", "fn": test_candidates_start_from_the_chosen_config})()
    win, fast, broken, slow = launcher("win"), launcher("fast"), launcher("broken"), launcher("slow")
    tuner = type("T", (), {"fn": jit, "launchers": [win]})()
    cross_arch._timings[tuner] = {fast: 0.1, win: 0.2, broken: float("inf"), slow: 0.3}
    assert [c["config"] for c in cross_arch.candidates(tuner)] == ["win", "fast", "slow"]
    tuner.launchers = [launcher("win", recorded=False)]
    assert cross_arch.candidates(tuner) == []


def test_cross_compile_without_triton_kernels_and_without_candidates():
    """Extern calls only (cuBLAS, ATen): nothing per architecture, every listed one
    served. A Triton kernel whose compile inputs were not recorded: CaptureError."""
    from precompile_build.engines import cross_arch

    report = cross_arch.cross_compile([{"name": "k", "kind": "cpp"}], {}, {}, ("8.0", "12.0"), "9.0", "t")
    assert report["compiled_for"] == ["8.0", "9.0", "12.0"]
    assert report["binaries"] == ["sm_120", "sm_80", "sm_90"] and report["left_out"] == {}
    with pytest.raises(CaptureError, match=r"target 't', Triton kernel 'mm': its compile inputs were "
                                           r"not recorded.*drop `cuda-archs`"):
        cross_arch.cross_compile([_triton_entry("mm", "c")], {}, {"mm": []}, ("8.0",), "9.0", "t")


@pytest.mark.parametrize("cc, picked", [((8, 6), "cross"), ((9, 0), "cross"), ((8, 0), "native"),
                                        ((7, 5), None)])
def test_selection_with_a_faked_gpu(monkeypatch, cc, picked):
    """host_fingerprint reads the (faked) device capability; the loader's choice
    follows: the A100-built variant on sm_80, the H200's cross-compiled one on sm_86
    and sm_90, nothing on sm_75."""
    import torch

    from precompile_runtime import fingerprint, loader

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=None: cc)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "GPU")
    host = fingerprint.host_fingerprint("cuda")
    assert host["compute_capability"] == f"{cc[0]}.{cc[1]}"
    cross = {**host, "compute_capability": "9.0", "cuda_binaries": "compute_80 sm_80 sm_90a"}
    native = {**host, "compute_capability": "8.0"}
    variants = [{"id": "cross", "engine": "frozen", "device": "cuda", "fingerprint": cross},
                {"id": "native", "engine": "frozen", "device": "cuda", "fingerprint": native}]
    chosen, reports = loader._select(variants)
    assert (chosen or {}).get("id") == picked
    if picked is None:
        assert "none of which runs on this host's '7.5'" in reports[0][0]


def test_add_archs_is_the_frozen_engines_step():
    from precompile_build.engines import cross_arch

    meta, fp = {"kernels": [{"name": "k", "kind": "cpp"}]}, {"compute_capability": "9.0"}
    cross_arch.add_archs(meta, fp, object(), {}, {}, "t")  # no cuda-archs: nothing
    assert "cuda_archs" not in meta and "cuda_binaries" not in fp
    cross_arch.add_archs(meta, fp, object(), {}, {"cuda_archs": "8.0"}, "t")
    assert meta["cuda_archs"]["compiled_for"] == ["8.0", "9.0"] and fp["cuda_binaries"] == "sm_80 sm_90"


@pytest.mark.parametrize("field, value, match", [
    ("compiled_for", "8.0", "`compiled_for` must be a list of compute capabilities"),
    ("validated_on", [9.0], "`validated_on` must be a list of compute capabilities"),
    ("left_out", ["8.6"], "`left_out` must be an object")])
def test_manifest_reader_checks_the_arch_fields(tmp_path, field, value, match):
    from precompile_build import manifest_build
    from precompile_runtime import manifest
    from precompile_runtime.errors import ManifestError

    files = manifest_build.assemble("pkg", [_result(tmp_path, "f", _fp("8.0"), {})])
    doc = json.loads(files["manifest.json"])
    manifest.parse(files["manifest.json"], where="m")  # as written: valid
    doc["targets"]["f"]["variants"][0][field] = value
    with pytest.raises(ManifestError, match=match):
        manifest.parse(json.dumps(doc).encode(), where="m")


def test_build_gpu_below_9_gets_its_ptx_from_the_worker(monkeypatch):
    """Built on an sm_80 GPU with cuda-archs 8.0 and 9.0: the native sm_80 cubin stays,
    the worker adds sm_80's PTX and the sm_90a cubin."""
    pytest.importorskip("triton")
    from precompile_build.engines import cross_arch

    monkeypatch.delenv(cross_arch.TEST_CROSS_NATIVE_ENV, raising=False)
    kernels, blobs = [_triton_entry("mm", "BK=64")], {}
    small = _cand("mm", SIG, {"BM": 64, "BN": 64, "BK": 64}, "BK=64")
    report = cross_arch.cross_compile(kernels, blobs, {"mm": [small]}, ("8.0", "9.0"), "8.0", "t")
    got = {(c["sm"], c["origin"]) for c in kernels[0]["archs"]}
    assert got == {("sm_80", "native"), ("compute_80", "cross"), ("sm_90a", "cross")}
    assert report["compiled_for"] == ["8.0", "9.0"] and report["left_out"] == {}
    assert sorted(n.split("/")[0] for n in blobs) == ["cubin", "ptx"]


def test_a_failing_worker_is_a_capture_error_with_its_output():
    from precompile_build.engines import cross_arch

    with pytest.raises(CaptureError, match=r"(?s)target 't': the compile-only Triton process for "
                                           r"`cuda-archs` failed \(exit status 1\):\n.*(KeyError|Error)"):
        cross_arch.compile_jobs([{"not": "a job"}], "t")
