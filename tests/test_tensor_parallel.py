"""Tensor-parallel targets without transformers: a `world-size = 2` MLP
(parallelize_module, up colwise / down rowwise) built both ways on the CPU, `real`
(two capture processes with gloo, each validated) and `fake` (rank 0 alone under the
fake process group: compile-only), each wheel served by `torchrun --nproc_per_node 2`
and refused before init_process_group and in a world of 1; the settings, the plan, the
checks of the ranks' pairs and, in a world of one process, what a capture refuses and
what a served call checks. tests/test_tp_llama.py serves a tiny transformers Llama.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from _build_helpers import PACKAGES, build, make_project, manifest_of
from _pairs import load_pair
from _tp_helpers import built_both_ways, check_refusals, check_world_of_one, torchrun, unpack

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from precompile_build.builder import ranks  # noqa: E402
from precompile_build.config.settings import TargetSettings, settings_from_table  # noqa: E402
from precompile_build.errors import CaptureError, ConfigError  # noqa: E402
from precompile_build.wheels.inspect_cmd import format_report, inspect_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ---- settings and the plan ---------------------------------------------------------
def _target(tmp_path, extra: str, distributed=None):
    (tmp_path / "pkg").mkdir(exist_ok=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "s.py").write_text("")
    import tomllib

    table = tomllib.loads(f'[targets.t]\nscript = "s.py"\n{extra}\n')
    cs = {"precompile.distributed": distributed} if distributed else None
    return settings_from_table(tmp_path, table, cs, environ={})


def test_world_size_and_mesh_are_read(tmp_path):
    s = _target(tmp_path, "world-size = 8")
    assert (s.targets["t"].world_size, s.targets["t"].mesh, s.distributed) == (8, (), "auto")
    s = _target(tmp_path, "mesh = { dp = 2, tp = 4 }", distributed="FAKE")
    assert (s.targets["t"].world_size, s.targets["t"].mesh, s.distributed) == (
        8,
        (("dp", 2), ("tp", 4)),
        "fake",
    )
    assert _target(tmp_path, "").targets["t"].world_size is None


@pytest.mark.parametrize(
    "extra, match",
    [
        (
            "world-size = 0",
            r"`tool.precompile.targets.t.world-size` must be a positive integer .*not 0",
        ),
        ("world-size = true", r"world-size` must be a positive integer"),
        (
            'mesh = { tp = "2" }',
            r"`tool.precompile.targets.t.mesh` must be a table of the DeviceMesh's dimension",
        ),
        ("mesh = [2, 4]", r"mesh` must be a table"),
        (
            "world-size = 4\nmesh = { dp = 2, tp = 4 }",
            r"world-size` = 4 but .*mesh` = dp=2 x tp=4 makes 8 ranks",
        ),
        (
            "world-size = 2\nworld_size = 2",
            r"unknown key `tool.precompile.targets.t.world_size`; did you mean "
            r"`tool.precompile.targets.t.world-size`",
        ),
    ],
)
def test_bad_world_settings_are_config_errors(tmp_path, extra, match):
    with pytest.raises(ConfigError, match=match):
        _target(tmp_path, extra)


def test_a_bad_distributed_override_is_named(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"config setting `precompile.distributed`: it must be one of 'auto', "
        r"'fake', 'real' .*not 'maybe'",
    ):
        _target(tmp_path, "world-size = 2", distributed="maybe")


def _t(n):
    return TargetSettings(name="t", script=Path("s.py"), script_rel="s.py", world_size=n)


def test_the_plan_runs_every_rank_where_there_is_a_device_per_rank():
    assert ranks.plan(_t(None), "cpu", "auto", 0) == (None, None)
    cpu, _ = ranks.plan(_t(8), "cpu", "auto", 0)
    assert (cpu.mode, cpu.processes) == ("real", 8)
    gpu, _ = ranks.plan(_t(8), "cuda", "auto", 8)
    assert gpu.mode == "real"
    few, _ = ranks.plan(_t(8), "cuda", "auto", 1)
    assert (few.mode, few.processes, few.why) == (
        "fake",
        1,
        "distributed = auto: 1 GPU(s) for 8 ranks",
    )
    fake, _ = ranks.plan(_t(2), "cpu", "fake", 0)
    assert (fake.mode, fake.processes) == ("fake", 1)
    none, why = ranks.plan(_t(8), "cuda", "real", 1)
    assert none is None and "each of the 8 ranks on its own GPU and this build host has 1" in why
    assert "-C precompile.distributed=fake" in why


def test_the_kept_pair_must_match_the_declared_world():
    world = ranks.WorldPlan(2, "real", (("tp", 2),))
    ok = {"collectives": {"world_size": 2, "mesh": {"shape": [2], "dim_names": ["tp"]}}}
    assert ranks.world_problem(ok, world) is None
    assert "has 4 rank(s) and the target declares world-size = 2" in ranks.world_problem(
        {"collectives": {"world_size": 4}}, world
    )
    assert (
        "sharded over a DeviceMesh of dp=2 and the target declares mesh = tp=2"
        in ranks.world_problem(
            {"collectives": {"world_size": 2, "mesh": {"shape": [2], "dim_names": ["dp"]}}}, world
        )
    )
    # a 2-D mesh whose tensor-parallel part shards the parameters
    world2 = ranks.WorldPlan(4, "real", (("dp", 2), ("tp", 2)))
    assert (
        ranks.world_problem(
            {"collectives": {"world_size": 4, "mesh": {"shape": [2], "dim_names": ["tp"]}}}, world2
        )
        is None
    )


def test_a_rank_whose_pair_differs_is_named():
    meta = {"param_names": ["m0.w"], "params": [{"shape": [4, 8]}], "validation": {"cases": [1]}}
    src = b"PRECOMPILE_METADATA = {}\ndef f():\n    return 1\n"
    other = dict(meta, validation={"cases": [2]})  # only the measured numbers differ
    assert ranks.rank_difference((src, meta), (src, other), 1) is None
    uneven = dict(meta, params=[{"shape": [5, 8]}])
    why = ranks.rank_difference((src, meta), (src, uneven), 1)
    assert (
        "rank 1's capture differs from rank 0's in `params` (m0.w: [4, 8] on rank 0, [5, 8] on rank 1)"
        in why
    )
    assert "divisible by the world size" in why
    why = ranks.rank_difference((src, meta), (src.replace(b"return 1", b"return 2"), meta), 1)
    assert "rank 1's captured code differs from rank 0's" in why and "dist.get_rank()" in why


def test_the_ranks_own_gpus_are_not_in_the_pair():
    """Each rank of a world on N GPUs captures on cuda:RANK: Inductor's device guards and
    streams run on the current device instead, and the comparison of the ranks' pairs
    reads a device ordinal as any other (the driver runs on the inputs' device)."""
    from precompile_build.engines.frozen import _device_independent

    code = "with torch.cuda._DeviceGuard(1):\n    torch.cuda.set_device(1)\n    stream1 = get_raw_stream(1)\n"
    assert _device_independent(code) == (
        "with torch.cuda._DeviceGuard(torch.cuda.current_device()):\n"
        "    torch.cuda.set_device(torch.cuda.current_device())\n"
        "    stream1 = get_raw_stream(torch.cuda.current_device())\n"
    )
    meta = {"params": []}
    src0 = b"PRECOMPILE_METADATA = {}\nx = f(device=device(type='cuda', index=0), to='cuda:0')\n"
    src1 = b"PRECOMPILE_METADATA = {}\nx = f(device=device(type='cuda', index=1), to='cuda:1')\n"
    assert ranks.rank_difference((src0, meta), (src1, meta), 1) is None
    assert ranks.rank_difference((src0, meta), (src1.replace(b"f(", b"g("), meta), 1) is not None


# ---- one process, a world of one: what a capture refuses, what a call checks -------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world_of_one():
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _tp_models():
    sys.path.insert(0, str(PACKAGES / "tpmodels"))
    try:
        import tpmodels
    finally:
        sys.path.pop(0)
    return tpmodels


def _capture(tmp_path, fn, *args, **kw):
    import precompile_build

    src, cache = tmp_path / "t.py", tmp_path / "t.cache"
    with (
        torch.no_grad(),
        precompile_build.capture(fn, artifact_path=src, cache_path=cache, target="t", **kw) as f,
    ):
        want = f(*args)
    return load_pair(src, cache), want


def test_a_sharded_model_is_served_as_captured_and_checked(tmp_path, world_of_one):
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from precompile_runtime import CallError

    tp = _tp_models()
    model, x = tp.build_mlp(world_of_one), tp.mlp_input()
    served, want = _capture(tmp_path, tp.mlp_call, model, x, engine="eager")
    meta = served.metadata
    assert meta["tracer"] == "make_fx"  # auto: torch.export refuses the DTensors made in the trace
    assert [d["index"] for d in meta["dtensors"]] == [0, 1, 2, 3]
    assert meta["dtensors"][0]["placements"] == ["Shard(dim=0)"] and meta["dtensors"][2][
        "placements"
    ] == ["Shard(dim=1)"]
    assert meta["collectives"]["mesh"] == {"shape": [1], "dim_names": ["tp"]}
    assert torch.equal(served(model, x), want)
    # the same weights, unsharded: refused (the shards' shapes would even match here)
    torch.manual_seed(0)
    plain = tp.MLP().eval()
    with pytest.raises(
        CallError,
        match=r"target 't': parameter/buffer model.up.weight was a DTensor at capture "
        r"\(Shard\(dim=0\) over a mesh \[1\] \(tp\)\) and is a plain tensor here; shard the model",
    ):
        served(plain, x)
    torch.manual_seed(0)
    other = parallelize_module(
        tp.MLP().eval(), world_of_one, {"up": RowwiseParallel(), "down": ColwiseParallel()}
    )
    with pytest.raises(
        CallError,
        match=r"model.up.weight is sharded Shard\(dim=1\) over a mesh \[1\] \(tp\); the "
        r"capture's was Shard\(dim=0\) over a mesh \[1\] \(tp\)",
    ):
        served(other, x)
    # and the other way: a pair captured unsharded refuses the sharded model
    (tmp_path / "plain").mkdir()
    unsharded, _ = _capture(tmp_path / "plain", tp.mlp_call, plain, x, engine="eager")
    with pytest.raises(
        CallError,
        match=r"parameter/buffer model.up.weight is a DTensor \(Shard\(dim=0\) over a mesh "
        r"\[1\] \(tp\)\), but was a plain tensor at capture; pass the model unsharded",
    ):
        unsharded(model, x)
    dist.destroy_process_group()
    with pytest.raises(
        CallError,
        match=r"is sharded for a world of 1 process\(es\); this process is in no "
        r"process group.*dist.init_process_group\(\) before loading it",
    ):
        load_pair(tmp_path / "t.py", tmp_path / "t.cache")


def test_what_a_tensor_parallel_capture_refuses(tmp_path, world_of_one):
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    import precompile_build

    tp = _tp_models()
    model, x = tp.build_mlp(world_of_one), tp.mlp_input()
    paths = {"artifact_path": tmp_path / "r.py", "cache_path": tmp_path / "r.cache", "target": "t"}
    with pytest.raises(
        CaptureError, match=r"argument 'x' is a DTensor; a captured call takes plain tensors"
    ):
        with torch.no_grad(), precompile_build.capture(tp.mlp_call, engine="eager", **paths) as f:
            f(model, DTensor.from_local(x, world_of_one, [Replicate()]))
    torch.manual_seed(0)
    lead = parallelize_module(
        tp.MLP().eval(), world_of_one, {"down": ColwiseParallel(use_local_output=False)}
    )
    with pytest.raises(
        CaptureError, match=r"the function returns a DTensor.*use_local_output=True"
    ):
        with torch.no_grad(), precompile_build.capture(tp.mlp_call, engine="eager", **paths) as f:
            f(lead, x)

    def step(m, x):
        m(x).sum().backward()

    with pytest.raises(
        CaptureError,
        match=r"runs a backward through the DTensor parameter m.up.weight; a "
        r"tensor-parallel capture serves inference",
    ):
        with precompile_build.capture(step, engine="eager", **paths) as f:
            f(model, x)
    with pytest.raises(
        CaptureError,
        match=r"DTensor parameters .* which tracer='export' cannot trace.*"
        r"tracer='auto' or 'make_fx'",
    ):
        with (
            torch.no_grad(),
            precompile_build.capture(tp.mlp_call, engine="eager", tracer="export", **paths) as f,
        ):
            f(model, x)
    assert not (tmp_path / "r.py").exists()


# ---- built both ways, served by torchrun ---------------------------------------------
@pytest.mark.usefixtures("build_env")
def test_an_mlp_built_both_ways_is_served_by_every_rank(tmp_path, monkeypatch):
    wheels = built_both_ways(tmp_path, monkeypatch, "mlp", "mlp")
    real = manifest_of(wheels["real"])["targets"]["mlp"]["variants"][0]
    assert real["distributed"] == {
        "world_size": 2,
        "mesh": {"shape": [2], "dim_names": ["tp"]},
        "mode": "real",
        "backend": "cpu:gloo",
        "ranks_captured": 2,
        "validated": True,
    }
    assert real["validation"]["cases"]
    fake = manifest_of(wheels["fake"])["targets"]["mlp"]["variants"][0]
    assert {
        k: fake["distributed"][k] for k in ("mode", "backend", "ranks_captured", "validated")
    } == {"mode": "fake", "backend": "fake", "ranks_captured": 1, "validated": False}
    assert "under the fake process-group backend" in fake["validation"]["skipped"]
    text = format_report(inspect_report(str(wheels["real"]), host=lambda d: {}))
    assert (
        "tensor-parallel: world size 2 (mesh tp=2): rank 0's pair serves every rank; captured on all 2 "
        "ranks (cpu:gloo), each validated" in text
    )
    text = format_report(inspect_report(str(wheels["fake"]), host=lambda d: {}))
    assert (
        "rank 0 captured alone under the fake process-group backend: compile-only, not validated at "
        "world size 2" in text
    )
    assert (
        "    not validated: captured as rank 0 of 2 alone under the fake process-group backend"
        in text
    )
    for mode, wheel in wheels.items():
        site = unpack(wheel, tmp_path / f"site-{mode}")
        results = torchrun(site, tmp_path / f"served-{mode}", ["mlp"])
        for r in results:
            assert r["mlp"]["kernels"] and r["mlp"]["max_diff"] <= 1e-5, (mode, r)
        check_refusals(results, ["mlp"])
    one = torchrun(site, tmp_path / "one", ["mlp"], nproc=1)[0]  # (the fake wheel's pair)
    check_world_of_one(one, ["mlp"])


@pytest.mark.usefixtures("build_env")
def test_a_failing_rank_ends_the_others_and_is_named(tmp_path, monkeypatch):
    """Rank 1 fails after init_process_group while rank 0 waits (forever, as it would for
    a collective rank 1 never joins): the build ends rank 0 and names rank 1's error."""
    root = make_project(tmp_path, name="tpmodels")
    (root / "captures" / "fails.py").write_text(
        "import os, torch.distributed as dist\n"
        "dist.init_process_group()\n"
        "if dist.get_rank() == 1:\n    raise RuntimeError('rank one gives up')\n"
        "import time\ntime.sleep(600)\n"
    )
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text() + '\n[tool.precompile.targets.fails]\nscript = "captures/fails.py"\n'
        'device = "cpu"\nworld-size = 2\ntimeout = 120\n'
    )
    with pytest.raises(
        CaptureError,
        match=r"Capture of target 'fails' failed: rank 1 exited with status 1: "
        r"RuntimeError: rank one gives up",
    ):
        build(root, monkeypatch, config_settings={"precompile.targets": "fails"})


@pytest.mark.usefixtures("build_env")
def test_a_2d_mesh_pair_serves_ranks_of_other_groups(tmp_path, monkeypatch):
    """`mesh = { dp = 2, tp = 2 }`: four capture processes; the MLP is sharded over the
    mesh's `tp` part, whose group is ranks [0, 1] on ranks 0 and 1 and [2, 3] on ranks 2
    and 3. The pair names its all-reduce by the mesh dimension, so rank 0's pair serves
    all four ranks (a name by ranks would send ranks 2 and 3 to rank 0's group)."""
    root = make_project(tmp_path, name="tpmodels")
    wheel = build(root, monkeypatch, config_settings={"precompile.targets": "mlp2d"})
    variant = manifest_of(wheel)["targets"]["mlp2d"]["variants"][0]
    assert variant["distributed"] == {
        "world_size": 4,
        "mesh": {"shape": [2], "dim_names": ["tp"]},
        "mode": "real",
        "backend": "cpu:gloo",
        "ranks_captured": 4,
        "validated": True,
    }
    results = torchrun(unpack(wheel, tmp_path / "site"), tmp_path / "served", ["mlp2d"], nproc=4)
    assert [r["mlp2d"]["tp_ranks"] for r in results] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    for r in results:
        assert r["mlp2d"]["max_diff"] == 0.0, r
        assert r["mlp2d"]["groups"]["groups"] == {} and r["mlp2d"]["groups"]["mesh_groups"] == {
            "precompile:mesh=tp": 0
        }


@pytest.mark.usefixtures("build_env")
def test_a_master_port_taken_before_rank_0_binds_it_is_chosen_again(tmp_path, monkeypatch):
    """The build picks a free MASTER_PORT; another process may take it before rank 0's
    TCPStore binds it (EADDRINUSE): the ranks are started once more on a new port."""
    root = make_project(tmp_path, name="tpmodels")
    (root / "captures" / "tiny.py").write_text(
        "import torch, torch.distributed as dist\nimport precompile_build\n"
        "dist.init_process_group()\ndist.barrier()\n"
        "with precompile_build.capture(lambda x: x * 2, engine='eager') as f:\n    f(torch.ones(2))\n"
    )
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text() + '\n[tool.precompile.targets.tiny]\nscript = "captures/tiny.py"\n'
        'device = "cpu"\nworld-size = 2\ntimeout = 120\n'
    )
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    ports = [taken.getsockname()[1]]
    real = ranks.free_port
    monkeypatch.setattr(ranks, "free_port", lambda: ports.pop(0) if ports else real())
    try:
        wheel = build(root, monkeypatch, config_settings={"precompile.targets": "tiny"})
    finally:
        taken.close()
    assert not ports  # the taken port was handed out, then another
    variant = manifest_of(wheel)["targets"]["tiny"]["variants"][0]
    assert variant["distributed"]["ranks_captured"] == 2
