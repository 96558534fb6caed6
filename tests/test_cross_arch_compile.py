"""`cuda-archs`, capture side: what the recording keeps while Inductor compiles, the
candidates it gives, and compile-only Triton for other GPUs in a GPU-less worker
(where triton is installed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from precompile_build.errors import CaptureError

HERE = Path(__file__).parent


# ---- real compile-only Triton (where triton is installed) ---------------------------

SIG = {
    "a": "*fp16",
    "b": "*fp16",
    "c": "*fp16",
    "M": "i32",
    "N": "i32",
    "K": "i32",
    "BM": "constexpr",
    "BN": "constexpr",
    "BK": "constexpr",
}


def _cand(
    fn, signature, constants, config, launcher="def launcher(stream):\n    pass\n", **options
):
    return {
        "module": str(HERE / "_cross_arch_kernels.py"),
        "fn_name": fn,
        "signature": signature,
        "constants": constants,
        "attrs": {},
        "options": {"num_warps": 4, "num_stages": 2, **options},
        "config": config,
        "launcher": launcher,
        "seconds": None,
    }


def _triton_entry(name, config):
    return {
        "name": name,
        "kind": "triton",
        "file": "cubin/native.cubin",
        "sha256": "0" * 64,
        "function": name,
        "num_warps": 4,
        "shared": 0,
        "arg_tys": "OOOiiiOO",
        "scratch": 2,
        "config": config,
        "launcher": "def launcher(stream):\n    pass\n",
    }


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
    out = subprocess.run(
        [tool, "--list-elf", str(path)], capture_output=True, text=True, timeout=60
    )
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
    big = _cand(
        "mm",
        SIG,
        {"BM": 128, "BN": 128, "BK": 256},
        "BK=256",
        launcher="def launcher(stream):\n    runner(1, 1, 1, stream)\n",
    )
    small = _cand("mm", SIG, {"BM": 128, "BN": 128, "BK": 64}, "BK=64")
    kernels, blobs = [_triton_entry("mm", "BK=256")], {}
    report = cross_arch.cross_compile(
        kernels, blobs, {"mm": [big, small]}, ("8.0", "8.6", "12.0"), "9.0", "t"
    )
    assert report["compiled_for"] == ["8.0", "8.6", "9.0", "12.0"] and report["left_out"] == {}
    # the PTX, which any later GPU without a cubin may JIT, is sized for 99 KiB too
    assert set(report["replaced"]) == {"8.6", "12.0", "8.0 (PTX)"}
    assert (
        "the compute_80 PTX (JIT-compiled on any later GPU without a cubin) may use 101376"
        in report["replaced"]["8.0 (PTX)"]["mm"]
    )
    assert (
        "needs 131072 bytes of shared memory per block, the sm_86 cubin (which also serves "
        "sm_87, sm_89) may use 101376"
    ) in report["replaced"]["8.6"]["mm"]
    assert "the sm_120 cubin may use 101376" in report["replaced"]["12.0"]["mm"]
    by_sm = {c["sm"]: c for c in kernels[0]["archs"]}
    assert set(by_sm) == {"sm_80", "compute_80", "sm_86", "sm_90a", "sm_120a"}
    assert by_sm["sm_80"]["config"] == "BK=256" and by_sm["sm_80"]["shared"] == 131072
    assert by_sm["sm_80"]["launcher"] == big["launcher"]
    assert (
        by_sm["sm_86"]["config"]
        == by_sm["sm_120a"]["config"]
        == by_sm["compute_80"]["config"]
        == "BK=64"
    )
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

    fp8 = _cand(
        "fp8_cast",
        {"x": "*fp32", "y": "*fp8e4nv", "n": "i32", "BLOCK": "constexpr"},
        {"BLOCK": 256},
        "BLOCK=256",
    )
    kernels = [_triton_entry("fp8_cast", "BLOCK=256")]
    report = cross_arch.cross_compile(kernels, {}, {"fp8_cast": [fp8]}, ("8.0", "8.9"), "9.0", "t")
    assert report["compiled_for"] == ["8.9", "9.0"]
    assert "fp8e4nv not supported in this architecture" in report["left_out"]["8.0"]
    assert {c["sm"] for c in kernels[0]["archs"]} == {"sm_89", "sm_90a"}


def test_recording_keeps_what_a_cross_compile_needs(monkeypatch):
    """The hooks around Inductor's compile (triton.compile's options, the static
    kernel's source, autotuning's timings) give the candidates in the order to try:
    the chosen config, then the others fastest first; they compile for sm_86."""
    triton = pytest.importorskip("triton")
    from torch._inductor.runtime import triton_heuristics as th
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from precompile_build.engines import cross_arch, triton_freeze
    from precompile_build.engines.cross_compile import jit_function

    fn = jit_function(str(HERE / "_cross_arch_kernels.py"), "mm")
    launchers = []

    class Tuner(th.CachingAutotuner):
        def __init__(self):  # the hooks read no other state
            pass

    # autotuning's timings: the recording wraps whatever benchmark_all_configs is
    monkeypatch.setattr(
        th.CachingAutotuner,
        "benchmark_all_configs",
        lambda self: {launchers[0]: 0.5, launchers[1]: 0.2, launchers[2]: 0.3},
    )
    tuner = Tuner()
    with cross_arch.recording():
        for bk in (64, 256, 128):
            binary = triton.compile(
                ASTSource(fn, SIG, {"BM": 64, "BN": 64, "BK": bk}),
                target=GPUTarget("cuda", 90, 32),
                options={"num_warps": 4, "num_stages": 2},
            )
            binary._cubin_path = None  # Inductor sets it where it wrote the cubin
            kernel = triton_freeze._static_kernel_class()(binary)

            def launcher():
                pass

            launcher.config = f"BK={bk}"
            setattr(launcher, triton_freeze._CODE, f"def launcher(stream):\n    pass  # {bk}\n")
            setattr(launcher, triton_freeze._RESULT, type("R", (), {"kernel": kernel})())
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


def test_worker_imports_inductor_kernel_modules_without_a_gpu():
    """The compile-only process sees no GPU (CUDA_VISIBLE_DEVICES=""): an Inductor
    kernel module, which probes for a GPU driver on import, still compiles there."""
    pytest.importorskip("triton")
    from precompile_build.engines import cross_arch

    module = str(HERE / "_inductor_like_kernel.py")
    cand = {
        "module": module,
        "fn_name": "triton_poi_fused_gelu_0",
        "signature": {
            "in_ptr0": "*fp32",
            "out_ptr0": "*fp32",
            "xnumel": "i32",
            "XBLOCK": "constexpr",
        },
        "constants": {"XBLOCK": 1024},
        "attrs": {(0,): [["tt.divisibility", 16]]},
        "options": {"num_warps": 4, "num_stages": 1, "debug": True, "sanitize_overflow": False},
        "config": "XBLOCK: 1024",
    }
    jobs = [
        {
            "arch": a,
            "cc": cross_arch.cc_int(a),
            "shared_limit": 99 * 1024,
            "want_ptx": a == "8.0",
            "candidates": [cand],
        }
        for a in ("8.0", "10.0")
    ]
    r80, r100 = cross_arch.compile_jobs(jobs, "t")
    assert (r80["sm"], r100["sm"]) == ("sm_80", "sm_100a") and r80["rejected"] == []
    assert (
        cross_arch.cubin_target(r80["cubin"]) == "sm_80"
        and cross_arch.cubin_target(r100["cubin"]) == "sm_100a"
    )
    assert ".target sm_80" in r80["ptx"] and r100["ptx"] is None


def test_candidate_from_inductor_compile_meta():
    """A kernel Inductor restored from its caches (no triton.compile seen): the
    compile call is rebuilt from the compile result's compile_meta."""
    pytest.importorskip("triton")
    from precompile_build.engines import cross_arch, triton_freeze
    from precompile_build.engines.cross_compile import jit_function

    fn = jit_function(str(HERE / "_cross_arch_kernels.py"), "mm")
    cm = {
        "signature": SIG,
        "constants": {"BM": 64, "BN": 64, "BK": 64},
        "configs": [{}],
        "num_warps": 8,
        "num_stages": 3,
        "debug": True,
        "launch_pdl": False,
        "disable_ftz": True,
    }

    def launcher():
        pass

    launcher.config = "BK=64"
    setattr(launcher, triton_freeze._CODE, "def launcher(stream):\n    pass\n")
    setattr(launcher, triton_freeze._RESULT, type("R", (), {"compile_meta": cm, "kernel": None})())
    tuner = type("T", (), {"fn": fn, "launchers": [launcher]})()
    (c,) = cross_arch.candidates(tuner)
    assert c["options"] == {
        "num_warps": 8,
        "num_stages": 3,
        "debug": True,
        "sanitize_overflow": False,
        "launch_pdl": False,
        "enable_reflect_ftz": False,
    }
    assert c["module"].endswith("_cross_arch_kernels.py") and c["constants"]["BK"] == 64
    (res,) = cross_arch.compile_jobs(
        [
            {
                "arch": "8.0",
                "cc": 80,
                "shared_limit": 99 * 1024,
                "want_ptx": False,
                "candidates": [c],
            }
        ],
        "t",
    )
    assert res["num_warps"] == 8 and cross_arch.cubin_arch(res["cubin"]) == 80


def test_candidates_start_from_the_chosen_config():
    """The chosen config comes first even when slower ones were timed faster (coordinate
    descent), configs that failed on the build GPU (inf) are left out, and a chosen
    config whose compile was not recorded gives no candidates at all."""
    from precompile_build.engines import cross_arch, triton_freeze

    def launcher(name, recorded=True):
        def fn():
            pass

        fn.config = name
        setattr(fn, triton_freeze._CODE, f"def launcher():\n    pass  # {name}\n")
        if recorded:
            cm = {
                "signature": {"x": "*fp32"},
                "constants": {},
                "configs": [{}],
                "num_warps": 4,
                "num_stages": 1,
            }
            setattr(
                fn, triton_freeze._RESULT, type("R", (), {"compile_meta": cm, "kernel": None})()
            )
        return fn

    jit = type("J", (), {"__name__": "k", "fn": test_candidates_start_from_the_chosen_config})()
    win, fast, broken, slow = (
        launcher("win"),
        launcher("fast"),
        launcher("broken"),
        launcher("slow"),
    )
    tuner = type("T", (), {"fn": jit, "launchers": [win]})()
    cross_arch._timings[tuner] = {fast: 0.1, win: 0.2, broken: float("inf"), slow: 0.3}
    assert [c["config"] for c in cross_arch.candidates(tuner)] == ["win", "fast", "slow"]
    tuner.launchers = [launcher("win", recorded=False)]
    assert cross_arch.candidates(tuner) == []


def test_cross_compile_without_triton_kernels_and_without_candidates():
    """Extern calls only (cuBLAS, ATen): nothing per architecture, every listed one
    served. A Triton kernel whose compile inputs were not recorded: CaptureError."""
    from precompile_build.engines import cross_arch

    report = cross_arch.cross_compile(
        [{"name": "k", "kind": "cpp"}], {}, {}, ("8.0", "12.0"), "9.0", "t"
    )
    assert report["compiled_for"] == ["8.0", "9.0", "12.0"]
    assert report["binaries"] == ["sm_120", "sm_80", "sm_90"] and report["left_out"] == {}
    with pytest.raises(
        CaptureError,
        match=r"target 't', Triton kernel 'mm': its compile inputs were "
        r"not recorded.*drop `cuda-archs`",
    ):
        cross_arch.cross_compile([_triton_entry("mm", "c")], {}, {"mm": []}, ("8.0",), "9.0", "t")


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

    with pytest.raises(
        CaptureError,
        match=r"(?s)target 't': the compile-only Triton process for "
        r"`cuda-archs` failed \(exit status 1\):\n.*(KeyError|Error)",
    ):
        cross_arch.compile_jobs([{"not": "a job"}], "t")


def test_recording_compiles_every_kernel_here_not_from_inductors_caches():
    """A second capture of the same call on one machine must see each kernel compiled
    and autotuned again (a kernel restored from Inductor's FX graph or autotuning cache
    brings neither its compile inputs nor the timings of the configurations it did not
    choose): the caches are off while recording, and back as they were after, also when
    the compile fails."""
    import torch._inductor.config as config

    from precompile_build.engines import cross_arch

    keys = [k for k in cross_arch._INDUCTOR_CACHES if hasattr(config, k)]
    assert "fx_graph_cache" in keys and "autotune_local_cache" in keys
    before = {k: getattr(config, k) for k in keys}
    with config.patch({"fx_graph_cache": True, "autotune_local_cache": True}):
        with cross_arch.recording():
            assert {k: getattr(config, k) for k in keys} == dict.fromkeys(keys, False)
        assert config.fx_graph_cache is True and config.autotune_local_cache is True
        with pytest.raises(RuntimeError, match="compile failed"), cross_arch.recording():
            raise RuntimeError("compile failed")
        assert config.fx_graph_cache is True and config.autotune_local_cache is True
    assert {k: getattr(config, k) for k in keys} == before
