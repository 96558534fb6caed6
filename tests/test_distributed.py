"""torch.distributed inside a captured function, in one spawn of
two processes on loopback (gloo on CPU; NCCL on a host with two GPUs):

- functional collectives on the world group are captured and served (frozen engine);
- a subgroup is resolved by its ranks at serve time, not by the registry name the
  capturing process gave it (the serving world creates its groups in another order);
- the world size is recorded and checked per call (CallError);
- c10d `dist.all_reduce(t)` and DistributedDataParallel are refused at capture with
  what to do instead.

GPU variant (run by the lead on the 2-GPU host):
    PYTHONPATH=$PWD:$PWD/runtime python -m pytest -q -p no:cacheprovider tests/test_distributed.py -k nccl
"""

from __future__ import annotations

import json
import socket
import traceback

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(backend, rank, world, port):
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def _load(src, cache):
    from _pairs import load_pair

    return load_pair(src, cache, f"{src}.kernels")


def _cases(rank, tmp, backend, ports):
    import torch.distributed._functional_collectives as funcol

    import precompile_build
    from precompile_build.errors import CaptureError
    from precompile_runtime import CallError

    dev = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    out: dict = {}

    def paths(name):
        return {
            "artifact_path": f"{tmp}/{name}{rank}.py",
            "cache_path": f"{tmp}/{name}{rank}.cache",
        }

    _init(backend, rank, 2, ports[0])
    x = torch.full((4,), float(rank + 1), device=dev)

    # 1. funcol on the world group, frozen kernels
    def world_sum(x):
        return funcol.all_reduce(x, "sum", dist.group.WORLD) * 2

    with precompile_build.capture(world_sum, engine="frozen", **paths("world")) as f:
        want = f(x)
    served = _load(
        **{"src": paths("world")["artifact_path"], "cache": paths("world")["cache_path"]}
    )
    out["world"] = [served(x).tolist(), want.tolist()]

    # 2. a subgroup: captured as registry name "1", served where "1" is another group
    g01 = dist.new_group([0, 1])

    def group_sum(x):
        return funcol.all_reduce(x, "sum", g01) + 1

    with precompile_build.capture(group_sum, engine="eager", **paths("group")) as f:
        want = f(x)
    grouped = _load(paths("group")["artifact_path"], paths("group")["cache_path"])
    out["group_meta"] = grouped.metadata.get("collectives")
    g0 = dist.new_group([0])  # a group of rank 0 alone: only rank 0 runs its collective
    if rank == 0:
        with precompile_build.capture(
            lambda x: funcol.all_reduce(x, "sum", g0) * 3, engine="eager", **paths("single")
        ) as f:
            f(x)
        single = _load(paths("single")["artifact_path"], paths("single")["cache_path"])

    # 3. c10d collectives and DDP wrappers are refused
    def c10d_sum(x):
        dist.all_reduce(x)
        return x

    try:
        with precompile_build.capture(c10d_sum, engine="eager", **paths("c10d")) as f:
            want_c10d = f(x.clone())
        # a tracer that turns the c10d call into a functional collective (torch 2.11's
        # export does) captures it: then it must serve like one
        got_c10d = _load(paths("c10d")["artifact_path"], paths("c10d")["cache_path"])(x.clone())
        out["c10d_served"] = [got_c10d.tolist(), want_c10d.tolist()]
    except CaptureError as e:
        out["c10d"] = str(e)
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2).to(dev))
    try:
        with precompile_build.capture(
            lambda m, x: m(x).sum().backward(), engine="eager", **paths("ddp")
        ) as f:
            f(ddp, x)
    except CaptureError as e:
        out["ddp"] = str(e)

    # 4. a new world whose groups are created in another order: "1" is now rank 0 alone
    dist.destroy_process_group()
    try:
        served(x)
    except CallError as e:
        out["no_world"] = str(e)
    _init(backend, rank, 2, ports[1])
    if rank == 0:
        try:
            single(x)
        except CallError as e:
            out["no_group"] = str(e)
    only0 = dist.new_group([0])  # noqa: F841 - takes the registry name the capture's group had
    dist.new_group([0, 1])
    out["group"] = [grouped(x).tolist(), want.tolist()]
    out["world_again"] = served(x).tolist()
    if rank == 0:
        out["single"] = single(x).tolist()
    dist.barrier()
    dist.destroy_process_group()

    # 5. served in a world of another size
    if rank == 0:
        _init(backend, 0, 1, ports[2])
        try:
            served(x)
        except CallError as e:
            out["size"] = str(e)
        dist.destroy_process_group()
    return out


def _worker(rank, tmp, backend, ports):
    try:
        out = _cases(rank, tmp, backend, ports)
    except BaseException:
        out = {"error": traceback.format_exc()}
    with open(f"{tmp}/rank{rank}.json", "w") as f:
        json.dump(out, f)


def _run(tmp_path, backend):
    import torch.multiprocessing as mp

    ports = [_free_port() for _ in range(3)]
    mp.spawn(_worker, args=(str(tmp_path), backend, ports), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert "error" not in r, r["error"]
    total = 1.0 + 2.0
    for r in results:
        got, want = r["world"]
        assert got == want == [2 * total] * 4
        assert r["world_again"] == want
        assert r["group_meta"] == {
            "world_size": 2,
            "groups": {"precompile:ranks=0,1": [0, 1]},
            "backend": backend,
        }
        got, want = r["group"]
        assert got == want == [total + 1] * 4  # the sum over ranks 0 and 1, on both ranks
        if "c10d_served" in r:  # traced as a functional collective (torch 2.11)
            got, want = r["c10d_served"]
            assert got == want == [total] * 4
        else:
            assert (
                "use the functional collectives" in r["c10d"] and "register_buffer" not in r["c10d"]
            )
        assert (
            "wrapped in DistributedDataParallel" in r["ddp"] and "inner module's step" in r["ddp"]
        )
        assert "a world of 2 process(es); this process is in no process group" in r["no_world"]
    assert "this process is in a world of 1" in results[0]["size"]
    assert (
        "no group of these ranks; create it on every rank before the call: dist.new_group(ranks=[0])"
        in results[0]["no_group"]
    )
    assert results[0]["single"] == [3.0] * 4


def test_collectives_gloo(tmp_path):
    _run(tmp_path, "gloo")


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
    reason="needs 2 CUDA GPUs and NCCL",
)
def test_collectives_nccl(tmp_path):
    _run(tmp_path, "nccl")


def test_a_group_c10d_does_not_list_is_a_capture_error():
    """A group name that resolves to a ProcessGroup c10d has no ranks for (destroyed,
    or made outside dist.new_group) is a CaptureError saying what to do, not a KeyError."""
    from precompile_build.capturing.collectives import group_ranks
    from precompile_build.errors import CaptureError

    with pytest.raises(
        CaptureError,
        match=r"target 't': a collective names the process group '7', which "
        r"torch.distributed does not list among its groups .*dist.new_group\(ranks\) on "
        r"every rank",
    ):
        group_ranks(object(), name="7", target="t")
