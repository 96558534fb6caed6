"""Every source half codegen can assemble (engine x device x Triton kernels x CUDA
graphs) compiles, defines each name it reads and none twice (ruff's F821/F811 on the
file as written), and carries metadata of the shape PairMetadata says."""

from __future__ import annotations

import ast
import copy
import itertools
import subprocess
import sys

import pytest
import torch
from typeguard import check_type

from precompile_build.capturing.tracing import trace_call
from precompile_build.engines import codegen
from precompile_runtime.pair_format import PairMetadata

CPP = {"name": "k0", "kind": "cpp", "file": "cpp/k0.so", "sha256": "0" * 64}
TRITON = {
    "name": "k1",
    "kind": "triton",
    "file": "cubin/k1.cubin",
    "sha256": "1" * 64,
    "function": "triton_poi_0",
    "num_warps": 4,
    "shared": 0,
    "arg_tys": "OOi",
    "scratch": 0,
    "config": "XBLOCK: 128",
    "launcher": "runner(1, 1, 1, stream, *args)",
}
# an Inductor-like wrapper body: binds its kernels, defines call(args)
WRAPPER = "k0 = _kernels['k0']\n\n\ndef call(args):\n    return (k0(*args),)\n"
# the frozen engine's kernels are C++ on the CPU, Triton on CUDA; eager pairs have none,
# and graphs replay frozen CUDA kernels only: the combinations the engines write, and
# the Triton/graphs ones codegen could be asked for on the CPU too
COMBINATIONS = [("eager", d, False, False) for d in ("cpu", "cuda")] + [
    ("frozen", d, t, g)
    for d, t, g in itertools.product(("cpu", "cuda"), (False, True), (False, True))
]


@pytest.fixture(scope="module")
def traced():
    """A real trace's calling convention and graph (make_fx: no compile, no export)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return trace_call(
        lambda m, x: m(x).relu() + torch.ones(2),
        (model, torch.randn(4, 3)),
        {},
        target="fwd",
        tracer="make_fx",
    )


def _render(traced, engine, device, triton, graphs) -> tuple[str, PairMetadata]:
    call = copy.deepcopy(traced.metadata)
    call["device"] = device
    kernels = [] if engine == "eager" else [dict(CPP)] + ([dict(TRITON)] if triton else [])
    meta = codegen.pair_metadata(call, engine, kernels)  # type: ignore[arg-type]
    if graphs:
        meta["cuda_graphs"] = True
    return codegen.render(
        meta, codegen.graph_source(traced.graph_module), None if engine == "eager" else WRAPPER
    ), meta


def _literal(text: str):
    node = next(
        n
        for n in ast.parse(text).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "PRECOMPILE_METADATA"
    )
    return ast.literal_eval(node.value)


@pytest.mark.parametrize("engine, device, triton, graphs", COMBINATIONS)
def test_every_source_half_lints_clean_and_carries_its_metadata(
    traced, tmp_path, engine, device, triton, graphs
):
    text, meta = _render(traced, engine, device, triton, graphs)
    path = tmp_path / f"{engine}_{device}.py"
    path.write_text(text, encoding="utf-8")
    compile(text, str(path), "exec")
    lint = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--no-cache",
            "--select",
            "F821,F811",
            "--output-format",
            "concise",
            str(path),
        ],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    written = _literal(text)
    assert written == meta
    check_type(written, PairMetadata)  # every key of the right type, none unknown
    assert ("_TritonKernel" in text) == (engine == "frozen")
    assert ("class _CudaGraphs" in text) == (engine == "frozen" and device == "cuda")


def test_the_metadata_check_refuses_what_the_format_does_not_have(traced):
    """The check above can fail: an unknown key, a wrong engine name, a missing key."""
    from typeguard import TypeCheckError

    _, meta = _render(traced, "eager", "cpu", False, False)
    for bad in (
        {**meta, "inputs_v2": {}},
        {**meta, "engine": "torch"},
        {k: v for k, v in meta.items() if k != "ambient"},
    ):
        with pytest.raises(TypeCheckError):
            check_type(bad, PairMetadata)


def test_the_eager_pair_runs_what_it_carries(traced):
    """An eager source half, as rendered, loads and computes the captured graph."""
    text, _ = _render(traced, "eager", "cpu", False, False)
    ns: dict = {"__name__": "pair"}
    exec(compile(text, "pair.py", "exec"), ns)
    model, x = torch.nn.Linear(3, 2), torch.randn(4, 3)
    torch.testing.assert_close(ns["load"](None)(model, x), model(x).relu() + torch.ones(2))
