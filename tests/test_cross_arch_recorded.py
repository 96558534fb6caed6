"""`cuda-archs` against what real tools and a real GPU host made: cubins of every ptxas
layout (tests/data/cubins), the manifest and `inspect` of the H200's multi-architecture
build (tests/data/h200_cuda_archs), read with a faked device capability; and the
serving templates that pick a kernel's binary, which must run on torch alone."""

from __future__ import annotations

import functools
import json
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from precompile_runtime import _arch_rules, arch_select

HERE = Path(__file__).parent
CUBINS = HERE / "data" / "cubins"
RECORDED = HERE / "data" / "h200_cuda_archs"
REPO = HERE.parent


# ---- the serving templates: no module but torch, one set of rules ---------------------


@pytest.mark.parametrize(
    "path",
    ["precompile_build/templates/triton_launcher.py", "runtime/precompile_runtime/_arch_rules.py"],
)
def test_serving_templates_use_no_module(path):
    """What the source half copies for frozen Triton kernels uses only names the source
    half defines (the same check as test_gpu_frozen's, on CPU too)."""
    from precompile_build.engines import codegen

    text = (REPO / path).read_text()
    if path.startswith("precompile_build/templates/"):  # what codegen copies: less the stand-ins
        text = codegen._template(Path(path).name)
    assert "import" not in text.replace("# ", "")
    assert textwrap.dedent(text) == text


def test_one_implementation_of_the_binary_rules():
    """arch_select's per-binary rules are _arch_rules' functions, and the source half
    carries that very file."""
    from precompile_build.engines import codegen

    assert arch_select.parse is _arch_rules._binary_parse
    assert arch_select.serves is _arch_rules._binary_serves
    assert Path(_arch_rules.__file__).read_text() in codegen.triton_launcher_code()
    assert codegen._template("triton_launcher.py") in codegen.triton_launcher_code()


@pytest.mark.parametrize(
    "name, parsed",
    [
        ("sm_86", (8, 6, False, False)),
        ("sm_100a", (10, 0, True, False)),
        ("compute_80", (8, 0, False, True)),
        ("sm_8", None),
        ("sm_1000", None),
        ("sm_9x", None),
        ("sm_٩٠", None),
        ("ptx_80", None),
        ("sm80", None),
        (None, None),
        (80, None),
    ],
)
def test_binary_names(name, parsed):
    assert arch_select.parse(name) == parsed


@functools.cache
def _serving_source():
    """The source half's kernel loader, binary rules and launcher (codegen's text)."""
    from precompile_build.engines import codegen

    return codegen._template("kernel_loader.py") + "\n\n" + codegen.triton_launcher_code()


def _namespace(monkeypatch, cc, runtime=True):
    """The source half's kernel loader, rules and launcher, executed as the pair does,
    on a device of capability ``cc``; ``runtime=False``: precompile-runtime is not
    installed (the source half runs on torch alone)."""
    import os

    import torch

    src = _serving_source()
    if not runtime:
        for name in [m for m in sys.modules if m.split(".")[0] == "precompile_runtime"]:
            monkeypatch.setitem(sys.modules, name, None)  # `from precompile_runtime...` raises
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)

    class CallError(ValueError):
        pass

    ns = {"torch": torch, "_os": os, "CallError": CallError, "_META": {"target": "t"}}
    exec(compile(src, "source half", "exec"), ns)
    return ns


def _kernel(names):
    archs = [
        {
            "sm": n,
            "binary": "ptx" if n.startswith("compute") else "cubin",
            "file": f"{'ptx' if n.startswith('compute') else 'cubin'}/{n}",
            "shared": 0,
        }
        for n in names
    ]
    return {"name": "k", "file": "cubin/sm_90a", "archs": archs}


@pytest.mark.parametrize("no_compile", ["", "1", "on"])
def test_the_source_half_alone_picks_and_guards(monkeypatch, no_compile):
    """Without precompile-runtime the source half still picks each kernel's binary,
    and refuses the PTX JIT while PRECOMPILE_NO_COMPILE is on."""
    monkeypatch.setenv("PRECOMPILE_NO_COMPILE", no_compile)
    ns = _namespace(monkeypatch, (12, 0), runtime=False)
    k = ns["_TritonKernel"]("/d/cubin/sm_90a", _kernel(["sm_80", "compute_80", "sm_90a"]))
    if not no_compile:
        assert k._choose(0)[1] == "/d/ptx/compute_80"
    else:
        with pytest.raises(
            ns["CallError"], match="only PTX .* refused under PRECOMPILE_NO_COMPILE=1"
        ):
            k._choose(0)
    ns = _namespace(monkeypatch, (8, 6), runtime=False)
    assert (
        ns["_TritonKernel"]("/d/cubin/sm_90a", _kernel(["sm_80", "compute_80"]))._choose(0)[1]
        == "/d/cubin/sm_80"
    )


def test_the_source_half_follows_the_runtime_guard(monkeypatch):
    """With precompile-runtime, no_compilation() (no environment variable) refuses the
    PTX JIT too."""
    import precompile_runtime

    monkeypatch.delenv("PRECOMPILE_NO_COMPILE", raising=False)
    ns = _namespace(monkeypatch, (12, 0))
    k = ns["_TritonKernel"]("/d/cubin/sm_90a", _kernel(["sm_80", "compute_80", "sm_90a"]))
    assert k._choose(0)[1] == "/d/ptx/compute_80"
    with precompile_runtime.no_compilation():
        with pytest.raises(ns["CallError"], match="refused under PRECOMPILE_NO_COMPILE=1"):
            k._choose(0)


# ---- cubins of every ptxas layout ----------------------------------------------------

CUBIN_FILES = sorted(p.name for p in CUBINS.glob("*.cubin"))


def test_every_layout_is_recorded():
    assert {n.split("-")[0] for n in CUBIN_FILES} == {"ptxas12.8", "ptxas12.9", "ptxas13.0"}
    assert {"ptxas12.8-sm_90a.cubin", "ptxas13.0-sm_90a.cubin", "ptxas13.0-sm_90.cubin"} <= set(
        CUBIN_FILES
    )


@pytest.mark.parametrize("name", CUBIN_FILES)
def test_cubin_target_reads_every_layout(name):
    """The SM and the 'a' of cubins from ptxas 12.8 (old ELF ABI), 12.9 (new ABI, 'a' in
    e_flags) and 13.0 (new ABI, 'a' in .nv.compat: cuobjdump 12.8 calls its sm_90a
    cubins sm_90, as the H200's native ones were)."""
    from precompile_build.engines.cross_arch import cubin_arch, cubin_target

    data = (CUBINS / name).read_bytes()
    want = name.split("-", 1)[1][: -len(".cubin")]
    assert cubin_target(data) == want
    assert cubin_arch(data) == int(want[3:].rstrip("a"))


def test_cubin_target_refuses_other_files():
    from precompile_build.engines.cross_arch import cubin_target

    data = bytearray((CUBINS / "ptxas13.0-sm_90a.cubin").read_bytes())
    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        cubin_target(b"\x7fELF\x01" + bytes(80))  # 32-bit
    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        cubin_target(b"hello")
    data[7] = 0  # a host ELF's EI_OSABI (System V)
    with pytest.raises(ValueError, match=r"not a CUDA ELF \(EI_OSABI 0x0\)"):
        cubin_target(bytes(data))
    data[7] = 0x41
    data[0x28:0x30] = (1 << 40).to_bytes(8, "little")  # section headers past the end
    with pytest.raises(ValueError, match="not a readable ELF file"):
        cubin_target(bytes(data))


@pytest.mark.parametrize(
    "filed, cubin",
    [
        ("sm_90a", "ptxas13.0-sm_90.cubin"),
        ("sm_90", "ptxas12.8-sm_90a.cubin"),
        ("sm_100a", "ptxas13.0-sm_120a.cubin"),
    ],
)
def test_a_cubin_is_never_filed_under_another_target(monkeypatch, filed, cubin):
    """A cross compile whose cubin is not for the target asked for (a plain sm_90 one
    for sm_90a, or another SM) is a capture error, not a mislabelled binary."""
    from precompile_build.engines import cross_arch
    from precompile_build.errors import CaptureError

    monkeypatch.setattr(cross_arch, "_triton_version", lambda: "3.6.0")  # CI has no triton

    entry = {"name": "k", "arg_tys": "OO", "scratch": 0}
    res = {"shared": 0, "num_warps": 4, "scratch": 0, "function": "k", "index": 0, "rejected": []}
    with pytest.raises(
        CaptureError,
        match=f"Triton compiled 'k' for sm_.* when asked for {filed}; report this \\(triton 3.6.0\\)",
    ):
        cross_arch._choice(
            entry,
            "9.0",
            filed,
            "cubin",
            (CUBINS / cubin).read_bytes(),
            res,
            {"config": "c", "launcher": "l"},
            {},
        )
    blobs = {}
    ok = cross_arch._choice(
        entry,
        "9.0",
        "sm_90a",
        "cubin",
        (CUBINS / "ptxas13.0-sm_90a.cubin").read_bytes(),
        res,
        {"config": "c", "launcher": "l"},
        blobs,
    )
    assert ok["sm"] == "sm_90a" and list(blobs) == [ok["file"]]


# ---- the H200's multi-architecture build, on other GPUs -------------------------------

MANIFEST = json.loads((RECORDED / "manifest.json").read_text())
H200 = MANIFEST["targets"]["forward"]["variants"][0]["fingerprint"]


def _host(cc, name="GPU"):
    """This software stack (the H200's) on a GPU of capability ``cc``."""
    return {**H200, "compute_capability": cc, "gpu_name": name}


def test_the_recorded_manifest():
    for target in ("forward", "triton_rmsnorm"):
        (v,) = MANIFEST["targets"][target]["variants"]
        assert v["fingerprint"]["cuda_binaries"] == "compute_80 sm_100a sm_120a sm_80 sm_90a"
        assert (v["compiled_for"], v["tuned_on"], v["validated_on"]) == (
            ["8.0", "9.0", "10.0", "12.0"],
            "9.0",
            ["9.0"],
        )


ARCH_LINES = (
    "target ",
    "  variant ",
    "    compiled for ",
    "    binaries: ",
    "    left out ",
    "    config replaced ",
    "    this host: ",
)


def test_inspect_on_the_h200_is_what_it_printed_there():
    """The targets, variants, architecture fields and host verdict, line for line as
    the H200 printed them (the other lines, capture figures, belong to other features)."""
    from precompile_build.wheels import inspect_cmd

    def arch_lines(text):
        return [line for line in text.splitlines() if line.startswith(ARCH_LINES)]

    text = inspect_cmd.format_report(inspect_cmd.inspect_report(str(RECORDED), host=lambda d: H200))
    want = arch_lines((RECORDED / "inspect_on_h200.txt").read_text())
    assert len(want) == 10 and arch_lines(text) == want


MISMATCH_75 = (
    "compute_capability: built for compute_80 sm_100a sm_120a sm_80 sm_90a (tuned on 9.0), "
    "none of which runs on this host's '7.5'"
)
HOSTS = [  # capability, the binary each kernel loads, how it serves (None: no match)
    ("8.0", "sm_80", arch_select.EXACT),
    ("8.6", "sm_80", arch_select.LOWER_MINOR),
    ("8.9", "sm_80", arch_select.LOWER_MINOR),
    ("9.0", "sm_90a", arch_select.EXACT),
    ("10.0", "sm_100a", arch_select.EXACT),
    ("10.3", "compute_80", arch_select.PTX),
    ("12.0", "sm_120a", arch_select.EXACT),
    ("7.5", None, None),
]


@pytest.mark.parametrize("cc, binary, kind", HOSTS)
def test_inspect_of_the_h200_build_on_other_gpus(cc, binary, kind):
    from precompile_build.wheels import inspect_cmd

    report = inspect_cmd.inspect_report(str(RECORDED), host=lambda d: _host(cc))
    text = inspect_cmd.format_report(report)
    for t in report["targets"].values():
        (v,) = t["variants"]
        assert v["matches_host"] == (kind is not None)
        assert v["mismatches"] == ([] if kind is not None else [MISMATCH_75])
    if kind is None:
        assert text.count(f"this host: does not match\n      - {MISMATCH_75}") == 2
    else:
        assert text.count("this host: matches") == 2


@pytest.mark.parametrize("cc, binary, kind", HOSTS)
def test_runtime_choice_for_the_h200_build(monkeypatch, cc, binary, kind):
    """The loader's choice of variant, its PTX check and each kernel's binary, with a
    faked device capability."""
    from precompile_runtime import fingerprint, loader
    from precompile_runtime.errors import HostMismatchError

    monkeypatch.delenv("PRECOMPILE_NO_COMPILE", raising=False)
    monkeypatch.delenv(arch_select.FORCE_PTX_ENV, raising=False)
    monkeypatch.setattr(fingerprint, "host_fingerprint", lambda device, index=None: _host(cc))
    variants = MANIFEST["targets"]["forward"]["variants"]
    chosen, reports = loader._select(variants)
    names = H200["cuda_binaries"].split()
    ns = _namespace(monkeypatch, tuple(int(x) for x in cc.split(".")))
    kernel = ns["_TritonKernel"]("/d/cubin/sm_90a", _kernel(names))
    if kind is None:
        assert chosen is None and reports == [[MISMATCH_75]]
        with pytest.raises(
            ns["CallError"], match=rf"no binary for cuda:0 \(compute capability {cc}\)"
        ):
            kernel._choose(0)
        return
    assert chosen is variants[0] and arch_select.variant_kind(chosen["fingerprint"], cc) == kind
    assert (
        kernel._choose(0)[0]["sm"]
        == binary
        == arch_select.best(names, tuple(int(x) for x in cc.split(".")))
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        arch_select.check_jit_at_load("forward", chosen, cc, strict=False)
    assert [w.category for w in seen] == (
        [arch_select.PtxJitWarning] if kind == arch_select.PTX else []
    )
    if kind == arch_select.PTX:
        with pytest.raises(
            HostMismatchError, match=rf"compute capability {cc}\) has no cubin.*strict mode"
        ):
            arch_select.check_jit_at_load("forward", chosen, cc, strict=True)
