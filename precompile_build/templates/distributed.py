# ---- torch.distributed at serve time: the world, its groups, DTensor shards ---------
# Copied verbatim into every source half of the `frozen` and `eager` engines (before the
# driver, codegen.py). The pair records the world it was captured in
# (PRECOMPILE_METADATA["collectives"], capturing/collectives.py) and its sharded
# parameters (["dtensors"], capturing/dtensors.py); the driver calls _check_world at load,
# _check_dist on every call of a pair that runs collectives, _local_params when it reads
# a model's parameters and _use_mesh before a call whose collectives run along the mesh.
# Needs only torch (imported when called) and the stdlib.
# stand-ins: names the rest of the source half defines (codegen.py drops this block)
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any  # noqa: F401 - for _DIST's type comment

    from .source_names import _META, PRECOMPILE_METADATA, CallError, _param_label
# end stand-ins


_DIST = PRECOMPILE_METADATA.get("collectives")  # type: Any  # {"world_size", "groups": {name: ranks}} (collectives.py)
_DIST_WORLD: list = []  # the WORLD group whose groups are registered under the pair's names


def _check_world():
    """This process's default group has the world size of the capture. Raises CallError
    naming both (at load and on every call)."""
    import torch.distributed as dist

    want = _DIST["world_size"]
    got = dist.get_world_size() if dist.is_available() and dist.is_initialized() else None
    if got != want:
        what = (
            "runs collectives over"
            if _DIST["groups"] or _DIST.get("mesh_groups")
            else "is sharded for"
        )
        raise CallError(
            f"target {_META['target']!r}: the captured function {what} a world of "
            f"{want} process(es); this process is in "
            + ("no process group" if got is None else f"a world of {got}")
            + f". Serve it with {want} processes (torchrun --nproc_per_node {want}) and call "
            "dist.init_process_group() before loading it, or capture again in this world"
            + (f" (`world-size = {got}`)" if got else "")
        )
    return dist


def _check_dist():
    """The world size the pair was captured for, and its groups found by ranks in this
    process and registered under the names the captured code uses. Raises CallError."""
    dist = _check_world()
    world = dist.group.WORLD
    if _DIST_WORLD and _DIST_WORLD[0] is world:
        return
    from torch._C import _distributed_c10d as _C
    from torch.distributed import distributed_c10d as c10d

    known = list(c10d._world.pg_group_ranks.items())
    for name, ranks in _DIST["groups"].items():
        pg = next((g for g, m in known if sorted(m, key=m.get) == ranks), None)  # type: ignore[arg-type]
        if pg is None:
            raise CallError(
                f"target {_META['target']!r}: the captured function runs a collective over the "
                f"ranks {ranks}, and this process has no group of these ranks; create it on every "
                f"rank before the call: dist.new_group(ranks={ranks})"
            )
        try:
            _C._unregister_process_group(name)
        except Exception:
            pass
        _C._register_process_group(name, pg)
    _DIST_WORLD[:] = [world]


# ---- DTensor parameters (capturing/dtensors.py): served as their local shards -------
_DTENSORS = {d["index"]: d for d in PRECOMPILE_METADATA.get("dtensors") or ()}
_MESH_GROUPS = (_DIST or {}).get("mesh_groups") or {}  # pair's name -> mesh dim
_MESH_NOW = [None, None]  # (mesh, WORLD) whose dim groups are registered under those names


def _mesh_text(mesh):
    shape = mesh["shape"] if isinstance(mesh, dict) else list(mesh.shape)
    names = mesh["dim_names"] if isinstance(mesh, dict) else getattr(mesh, "mesh_dim_names", None)
    return f"mesh {shape}" + (f" ({', '.join(names)})" if names else "")


def _local_params(params, names):
    """``params`` with each DTensor replaced by its local shard, checked against the
    capture's mesh and placements; returns ``(tensors, mesh or None)``. Raises
    CallError: a DTensor where the capture had a plain tensor, or the reverse, or
    another mesh shape or placements."""
    import sys

    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    out, mesh = [], None
    for i, (t, n) in enumerate(zip(params, names)):
        want = _DTENSORS.get(i)
        is_dt = dtensor is not None and isinstance(t, dtensor)
        if want is None:
            if is_dt:
                raise CallError(
                    f"target {_META['target']!r}: parameter/buffer {_param_label(n)} is a DTensor "
                    f"({', '.join(map(repr, t.placements))} over a {_mesh_text(t.device_mesh)}), but was a "
                    "plain tensor at capture; pass the model unsharded, as captured, or capture the "
                    "sharded model"
                )
            out.append(t)
            continue
        shown = f"{', '.join(want['placements'])} over a {_mesh_text(want['mesh'])}"
        if not is_dt:
            raise CallError(
                f"target {_META['target']!r}: parameter/buffer {_param_label(n)} was a DTensor at capture "
                f"({shown}) and is a plain tensor here; shard the model with the capture's "
                "parallelize_module plan (after dist.init_process_group()) before the call"
            )
        got_mesh = {
            "shape": list(t.device_mesh.shape),
            "dim_names": list(t.device_mesh.mesh_dim_names)
            if t.device_mesh.mesh_dim_names
            else None,
        }
        got = [repr(p) for p in t.placements]
        if got_mesh != want["mesh"] or got != want["placements"]:
            raise CallError(
                f"target {_META['target']!r}: parameter/buffer {_param_label(n)} is sharded "
                f"{', '.join(got)} over a {_mesh_text(got_mesh)}; the capture's was {shown}. "
                "Shard it with the capture's mesh and parallelize_module plan, or capture again "
                "with this one"
            )
        out.append(t._local_tensor)
        mesh = mesh if mesh is not None else t.device_mesh
    return out, mesh


def _use_mesh(params):
    """Register this process's groups along the served model's mesh dims under the
    names the captured code uses (``precompile:mesh=tp``). Raises CallError."""
    import torch.distributed as dist

    mesh = getattr(params, "mesh", None)
    if mesh is None:
        raise CallError(
            f"target {_META['target']!r}: the captured function runs collectives along the "
            "device mesh of its DTensor parameters, and this call passes no model sharded over "
            "one; pass the model sharded with the capture's parallelize_module plan"
        )
    world = dist.group.WORLD
    if _MESH_NOW[0] is mesh and _MESH_NOW[1] is world:
        return
    from torch._C import _distributed_c10d as _C

    for name, dim in _MESH_GROUPS.items():
        try:
            _C._unregister_process_group(name)
        except Exception:
            pass
        _C._register_process_group(name, mesh.get_group(dim))
    _MESH_NOW[:] = [mesh, world]  # type: ignore[list-item]
