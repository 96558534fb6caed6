"""`cuda-archs`: settings, compile-only Triton for other GPUs (where triton is
installed), the serving side's choice of binary with a faked device capability,
manifest and `inspect` fields, merge's preference for native builds."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from _build_helpers import make_project, target_toml

from precompile_build.config.settings import load_settings
from precompile_build.errors import CaptureError, ConfigError
from precompile_runtime import arch_select

HERE = Path(__file__).parent


# ---- settings -------------------------------------------------------------------


def _load(tmp_path, toml, cs=None, env=None):
    return load_settings(make_project(tmp_path, toml), cs, env or {})


def test_cuda_archs_precedence(tmp_path):
    toml = (
        '[tool.precompile]\ncuda-archs = ["9.0", "8.0", "8.0"]\n'
        + target_toml("a")
        + target_toml("b", extra='cuda-archs = ["8.6"]')
        + target_toml("c", extra='device = "cpu"')
    )
    s = _load(tmp_path, toml)
    got = {n: t.cuda_archs for n, t in s.targets.items()}
    # sorted by capability, duplicates dropped; the target's key wins; cpu targets get none
    assert got == {"a": ("8.0", "9.0"), "b": ("8.6",), "c": ()}
    s = load_settings(
        s.root, {"precompile.cuda-archs": "12.0,sm_100"}, {"PRECOMPILE_CUDA_ARCHS": "8.9"}
    )
    assert s.targets["a"].cuda_archs == s.targets["b"].cuda_archs == ("8.9",)  # env > -C > keys
    s = load_settings(s.root, {"precompile.cuda-archs": "12.0,sm_100"}, {})
    assert s.targets["b"].cuda_archs == ("10.0", "12.0") and s.targets["c"].cuda_archs == ()


@pytest.mark.parametrize(
    "toml, cs, env, match",
    [
        (
            '[tool.precompile]\ncuda-archs = ["8.5"]\n',
            None,
            None,
            r"`tool.precompile.cuda-archs` has '8.5' .*use some of 7.5, 8.0",
        ),
        (
            '[tool.precompile]\ncuda-archs = "8.0"\n',
            None,
            None,
            r"`tool.precompile.cuda-archs` must be an array of compute capabilities",
        ),
        (
            "[tool.precompile]\ncuda-archs = [8.0]\n",
            None,
            None,
            r"`tool.precompile.cuda-archs` must be an array of strings such as \"8.0\", not 8.0 \(a number\)",
        ),
        ("", None, None, r"`tool.precompile.targets.double.cuda-archs` has '90'"),
        (
            "",
            {"precompile.cuda-archs": "8.0,nine"},
            None,
            r"config setting `precompile.cuda-archs`: it has 'nine'",
        ),
        (
            "",
            None,
            {"PRECOMPILE_CUDA_ARCHS": "9.1"},
            r"environment variable PRECOMPILE_CUDA_ARCHS: it has '9.1' \(did you mean '9.0'\?\)",
        ),
    ],
)
def test_cuda_archs_bad_values_name_the_key(tmp_path, toml, cs, env, match):
    extra = 'cuda-archs = ["90"]' if not toml and not cs and not env else ""
    with pytest.raises(ConfigError, match=match):
        _load(tmp_path, toml + target_toml(extra=extra), cs, env)


def test_cuda_archs_on_a_cpu_target_is_an_error(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"`tool.precompile.targets.double.cuda-archs` compiles "
        r"CUDA kernels .* `tool.precompile.targets.double.device` is \"cpu\"",
    ):
        _load(tmp_path, target_toml(extra='device = "cpu"\ncuda-archs = ["8.0"]'))


def test_cuda_archs_reach_the_script_and_the_cache_key(tmp_path):
    from precompile_build.builder import capture_cache
    from precompile_build.builder.script import script_env

    s = _load(tmp_path, target_toml(extra='cuda-archs = ["8.0", "12.0"]'))
    t = s.targets["double"]
    env = script_env(s, t, "cuda", tmp_path / "a.py", tmp_path / "a.cache", "0")
    assert env["PRECOMPILE_CUDA_ARCHS"] == "8.0,12.0"
    assert "PRECOMPILE_CUDA_ARCHS" not in script_env(
        s, t, "cpu", tmp_path / "a.py", tmp_path / "a.cache", None
    )
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


@pytest.mark.parametrize(
    "host, names, want",
    [
        ((8, 6), ["sm_80", "sm_90a", "compute_80"], "sm_80"),  # lower minor, same major
        ((8, 6), ["sm_80", "sm_86", "compute_80"], "sm_86"),  # exact wins
        ((8, 9), ["sm_86", "sm_80"], "sm_86"),  # the highest lower minor
        ((9, 0), ["sm_80", "compute_80", "sm_100a"], "compute_80"),  # other major: PTX only
        ((10, 3), ["sm_100a", "compute_80"], "compute_80"),  # sm_100a runs on 10.0 only
        ((10, 0), ["sm_100a", "compute_80"], "sm_100a"),
        ((7, 5), ["sm_80", "compute_80"], None),  # older GPU: nothing
        ((12, 0), ["sm_90a", "sm_100a"], None),
    ],
)
def test_binary_choice(host, names, want):
    assert arch_select.best(names, host) == want


def test_force_ptx_switch(monkeypatch):
    monkeypatch.setenv(arch_select.FORCE_PTX_ENV, "1")
    assert arch_select.best(["sm_90a", "compute_80"], (9, 0)) == "compute_80"
    assert arch_select.best(["sm_90a"], (9, 0)) == "sm_90a"


def _fp(cc, binaries=None, **kw):
    fp = {
        "torch": "2.11.0+cu130",
        "cuda": "13.0",
        "hip": None,
        "triton": "3.6.0",
        "python": "3.12",
        "platform": "linux-x86_64",
        "device_type": "cuda",
        "compute_capability": cc,
        "gpu_name": "GPU",
    }
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
        "host's '12.0'"
    ]
    assert mismatches(_fp("9.0"), _fp("8.6")) == [
        "compute_capability: built for '9.0', this host has '8.6'"
    ]  # single-arch: exact


@pytest.mark.parametrize(
    "host, want", [("8.0", "v1"), ("8.6", "v0"), ("9.0", "v0"), ("12.0", "v0")]
)
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


@pytest.mark.parametrize(
    "strict, no_compile, outcome",
    [
        (False, False, "warn"),
        (True, False, "strict mode"),
        (False, True, "PRECOMPILE_NO_COMPILE=1"),
    ],
)
def test_ptx_only_is_a_compile_at_load(monkeypatch, strict, no_compile, outcome):
    from precompile_runtime.errors import HostMismatchError

    if no_compile:
        monkeypatch.setenv("PRECOMPILE_NO_COMPILE", "1")
    else:
        monkeypatch.delenv("PRECOMPILE_NO_COMPILE", raising=False)
    v = _variant(0, _fp("9.0", "compute_80 sm_80 sm_90a"))
    arch_select.check_jit_at_load("ctx", v, "8.6", strict)  # a cubin: nothing to say
    if outcome == "warn":
        with pytest.warns(
            arch_select.PtxJitWarning,
            match=r"ctx: this GPU \(compute capability 12.0\)"
            r" has no cubin.*Add \"12.0\" to `cuda-archs`",
        ):
            arch_select.check_jit_at_load("ctx", v, "12.0", strict)
    else:
        with pytest.raises(
            HostMismatchError, match=f"JIT-compile its PTX.*Refused under {outcome}"
        ):
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
    src = codegen._template("kernel_loader.py") + "\n\n" + codegen.triton_launcher_code()
    exec(compile(src, "source half", "exec"), ns)
    return ns


def _entry():
    def c(sm, binary):
        return {"sm": sm, "binary": binary, "file": f"{binary}/{sm}.{binary}", "shared": 0}

    return {
        "name": "k",
        "file": "cubin/sm_90a.cubin",
        "archs": [c("sm_80", "cubin"), c("compute_80", "ptx"), c("sm_90a", "cubin")],
    }


@pytest.mark.parametrize(
    "cc, file",
    [
        ((9, 0), "cubin/sm_90a.cubin"),
        ((8, 9), "cubin/sm_80.cubin"),
        ((12, 0), "ptx/compute_80.ptx"),
    ],
)
def test_kernel_binary_per_device(monkeypatch, cc, file):
    monkeypatch.delenv("PRECOMPILE_NO_COMPILE", raising=False)
    ns = _kernel_namespace(monkeypatch, cc)
    k = ns["_TritonKernel"]("/d/cubin/sm_90a.cubin", _entry())
    chosen, path = k._choose(0)
    assert path == "/d/" + file and chosen["file"] == file


def test_kernel_without_a_binary_for_the_device(monkeypatch):
    from precompile_runtime.errors import CallError

    ns = _kernel_namespace(monkeypatch, (7, 5))
    with pytest.raises(
        CallError,
        match=r"'k' has no binary for cuda:0 \(compute capability 7.5\); it "
        r"has sm_80, compute_80, sm_90a: add \"7.5\" to `cuda-archs`",
    ):
        ns["_TritonKernel"]("/d/cubin/sm_90a.cubin", _entry())._choose(0)
    monkeypatch.setenv("PRECOMPILE_NO_COMPILE", "1")
    ns = _kernel_namespace(monkeypatch, (12, 0))
    with pytest.raises(CallError, match="only PTX .* refused under PRECOMPILE_NO_COMPILE=1"):
        ns["_TritonKernel"]("/d/cubin/sm_90a.cubin", _entry())._choose(0)


# ---- manifest, inspect, merge ----------------------------------------------------

REPORT = {
    "tuned_on": "9.0",
    "validated_on": ["9.0"],
    "compiled_for": ["8.0", "9.0", "12.0"],
    "binaries": ["compute_80", "sm_120a", "sm_80", "sm_90a"],
    "left_out": {
        "8.6": "kernel triton_mm: config A: needs 131072 bytes of shared memory "
        "per block, sm_86 has 101376"
    },
    "replaced": {"12.0": {"triton_mm": "BK=256 does not fit sm_120a; using BK=64"}},
}


def _result(tmp_path, name, fp, meta):
    from precompile_build.builder.pairs import PairInfo
    from precompile_build.builder.runner import CaptureResult

    d = tmp_path / f"pairs-{fp['compute_capability']}"
    d.mkdir(exist_ok=True)
    src, cache = d / f"{name}.py", d / f"{name}.cache"
    src.write_bytes(b"# source " + fp["compute_capability"].encode())
    cache.write_bytes(b"cache")
    info = PairInfo("frozen", hashlib.sha256(src.read_bytes()).hexdigest(), fp, "cuda", meta)
    return CaptureResult(
        name,
        "ok",
        True,
        "cuda",
        seconds=1.0,
        source_path=src,
        cache_path=cache,
        info=info,
        device_index=0,
    )


def test_manifest_and_inspect_of_a_multi_arch_variant(tmp_path, monkeypatch):
    from precompile_build.wheels import inspect_cmd, manifest

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    files = manifest.assemble(
        "pkg",
        [
            _result(
                tmp_path,
                "forward",
                _fp("9.0", " ".join(REPORT["binaries"])),
                {"cuda_archs": REPORT},
            )
        ],
    )
    doc = json.loads(files["manifest.json"])
    v = doc["targets"]["forward"]["variants"][0]
    assert (v["compiled_for"], v["tuned_on"], v["validated_on"]) == (
        ["8.0", "9.0", "12.0"],
        "9.0",
        ["9.0"],
    )
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
    from precompile_build.builder import arch_report
    from precompile_build.wheels import manifest

    files = manifest.assemble("pkg", [_result(tmp_path, "f", _fp("8.0"), {})])
    v = json.loads(files["manifest.json"])["targets"]["f"]["variants"][0]
    assert (v["compiled_for"], v["tuned_on"], v["validated_on"]) == (["8.0"], "8.0", ["8.0"])
    assert arch_report.variant_fields({"device_type": "cpu"}, {}, "frozen") == {}
    assert arch_report.variant_fields(_fp("9.0"), {}, "torch") == {}  # torch's own kernels
    assert arch_report.build_line({}) == ""
    assert arch_report.build_line({"cuda_archs": REPORT}) == (
        "; compiled for sm 8.0 9.0 12.0 (tuned and validated on 9.0; left out 8.6: "
        + REPORT["left_out"]["8.6"]
        + "; config replaced for 12.0: triton_mm)"
    )


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


def test_merge_marks_native_builds_and_the_runtime_prefers_them(tmp_path, monkeypatch):
    """An H200 wheel cross-compiled for 8.0/9.0/12.0 merged with an A100 wheel built
    natively on 8.0: the merged manifest says the A100's variant serves 8.0, and the
    loader picks it on an sm_80 host (the H200's cross-compiled sm_80 on sm_86)."""
    from precompile_build.wheels import inspect_cmd, manifest
    from precompile_build.wheels.merge import _merge_manifests
    from precompile_runtime import fingerprint, loader

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    parts = []
    for fp, meta in (
        (_fp("9.0", " ".join(REPORT["binaries"])), {"cuda_archs": REPORT}),
        (_fp("8.0"), {}),
    ):
        files = manifest.assemble("pkg", [_result(tmp_path, "forward", fp, meta)])
        parts.append({"doc": json.loads(files["manifest.json"]), "files": files})
    doc, files = _merge_manifests(parts, ["h200.whl", "a100.whl"])
    cross, native = doc["targets"]["forward"]["variants"]
    assert cross["native_elsewhere"] == {"8.0": native["id"]} and "native_elsewhere" not in native
    assert len({v["files"]["source"]["path"] for v in (cross, native)}) == 2  # both pairs kept
    for host, want in (("8.0", native), ("8.6", cross), ("9.0", cross)):
        monkeypatch.setattr(
            fingerprint, "host_fingerprint", lambda device, index=None, h=host: _fp(h)
        )
        assert loader._select([cross, native])[0]["id"] == want["id"]
    out = tmp_path / "merged"
    out.mkdir()
    for n, data in files.items():
        (out / n).write_bytes(data)
    text = inspect_cmd.format_report(
        inspect_cmd.inspect_report(str(out), host=lambda d: _fp("8.0"))
    )
    assert f"8.0: variant {native['id']} was built natively on it and is preferred there" in text


@pytest.mark.parametrize(
    "cc, picked", [((8, 6), "cross"), ((9, 0), "cross"), ((8, 0), "native"), ((7, 5), None)]
)
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
    variants = [
        {"id": "cross", "engine": "frozen", "device": "cuda", "fingerprint": cross},
        {"id": "native", "engine": "frozen", "device": "cuda", "fingerprint": native},
    ]
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
    assert (
        meta["cuda_archs"]["compiled_for"] == ["8.0", "9.0"]
        and fp["cuda_binaries"] == "sm_80 sm_90"
    )


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("compiled_for", "8.0", "`compiled_for` must be a list of compute capabilities"),
        ("validated_on", [9.0], "`validated_on` must be a list of compute capabilities"),
        ("left_out", ["8.6"], "`left_out` must be an object"),
    ],
)
def test_manifest_reader_checks_the_arch_fields(tmp_path, field, value, match):
    from precompile_build.wheels import manifest as manifest_build
    from precompile_runtime import manifest
    from precompile_runtime.errors import ManifestError

    files = manifest_build.assemble("pkg", [_result(tmp_path, "f", _fp("8.0"), {})])
    doc = json.loads(files["manifest.json"])
    manifest.parse(files["manifest.json"], where="m")  # as written: valid
    doc["targets"]["f"]["variants"][0][field] = value
    with pytest.raises(ManifestError, match=match):
        manifest.parse(json.dumps(doc).encode(), where="m")
