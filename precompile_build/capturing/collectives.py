"""torch.distributed inside a captured function: the contract.

- **Functional collectives** (``torch.distributed._functional_collectives``:
  ``funcol.all_reduce(t, "sum", group)``, ``all_gather_tensor``, ``reduce_scatter_tensor``,
  ``all_to_all_single``, ...) are supported by both engines. They trace to
  ``_c10d_functional`` ops that name their group by its process-local registry name
  ("0", "1", ...), which depends on the order a process created its groups. The
  capture records each group by its **ranks** (in group-rank order) and rewrites the
  name to ``precompile:ranks=0,1`` (:func:`canonical_groups`); at serve time the
  driver finds this process's group with those ranks and registers it under that
  name, so the pair runs over the same ranks however the serving process numbered
  its groups. A group with these ranks must exist (the world group always does;
  create a subgroup with ``dist.new_group(ranks)`` on every rank before the call).
- **World size** is recorded and checked on every call (CallError): a pair captured
  under ``torchrun --nproc_per_node 2`` serves a world of 2 processes.
- **c10d collectives** (``dist.all_reduce(t)``) pass a ProcessGroup object, which a
  pair cannot carry: refused at capture, saying to use functional collectives.
- **DistributedDataParallel / FSDP** wrappers average gradients in autograd hooks the
  trace does not see: refused at capture (:func:`refuse_data_parallel`); capture the
  inner module's step and average gradients outside (or with funcol inside).

Every rank runs the capture (the trace, Inductor's compile and the frozen engine's
check run the collectives for real), in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import torch

from precompile_runtime.pair_format import Collectives

from ..errors import CaptureError
from ..process.world import backend_name
from .dtensors import mesh_record

PREFIX = "precompile:ranks="
MESH_PREFIX = "precompile:mesh="
_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")


def _group_args(node) -> list[tuple[int, str]]:
    """``[(position, name)]`` of the group-name arguments of a functional collective."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return []
    if target.namespace not in _NAMESPACES:
        return []
    return [
        (i, node.args[i])
        for i, a in enumerate(target._schema.arguments)
        if a.name == "group_name" and i < len(node.args) and isinstance(node.args[i], str)
    ]


def group_ranks(pg, *, name: str, target: str) -> list[int]:
    """Global ranks of process group ``pg``, in group-rank order.

    Args:
        pg: a ``ProcessGroup``, as resolved from ``name``.
        name: the registry name a collective gave for it (for the message).
        target: the target name (for the message).
    Returns:
        the global ranks, e.g. ``[0, 1]``.
    Raises:
        CaptureError: c10d does not know ``pg``'s ranks (it is not in
            ``distributed_c10d._world.pg_group_ranks``: destroyed, or made without
            ``dist.new_group``/``init_process_group``).
    """
    from torch.distributed import distributed_c10d as c10d

    mapping = c10d._world.pg_group_ranks.get(pg)  # global rank -> group rank
    if mapping is None:
        raise CaptureError(
            f"a collective names the process group {name!r}, which "
            "torch.distributed does not list among its groups (destroyed, or made without "
            "dist.new_group / dist.init_process_group), so the pair cannot record its ranks. "
            "Create the group with dist.new_group(ranks) on every rank, keep it alive during "
            "the capture, and pass it (or the default world group) to the collective",
            target=target,
        )
    return sorted(mapping, key=mapping.__getitem__)


def mesh_dim_label(mesh, dim: int) -> str:
    """The pair's name for dimension ``dim`` of a DeviceMesh: ``precompile:mesh=tp``
    (its dimension name), or ``precompile:mesh=0`` for an unnamed mesh."""
    names = getattr(mesh, "mesh_dim_names", None)
    return MESH_PREFIX + (names[dim] if names else str(dim))


def _mesh_dims(mesh) -> dict[str, str]:
    """``{registry name of this process's group along each dim: the pair's name}``."""
    from torch.distributed import distributed_c10d as c10d

    if mesh is None:
        return {}
    out = {}
    for dim in range(mesh.ndim):
        pg = mesh.get_group(dim)
        out[
            c10d._get_process_group_name(pg)
            if hasattr(c10d, "_get_process_group_name")
            else pg.group_name
        ] = mesh_dim_label(mesh, dim)
    return out


def canonical_groups(gm, target: str, meshes: Iterable[Any] = ()) -> Collectives | None:
    """Rewrite the group names of ``gm``'s functional collectives (subgraphs
    included) to names that mean the same group on every rank, registered in this
    process, and return what the pair records: ``{"world_size": int, "groups": {name:
    ranks}, "backend": the default group's (world.backend_name)}``, plus ``"mesh":
    {"shape", "dim_names"}`` when ``meshes`` has one (a sharded model's) and
    ``"mesh_groups": {name: dim}`` when a collective runs along a dimension of it;
    None when the graph runs no collective and there is no mesh.

    A group that is this process's group along a dimension of the first mesh in
    ``meshes`` (the DeviceMesh of the model's DTensor parameters: what DTensor's own
    collectives name) is ``precompile:mesh=<dim name>``: on a 2-D mesh rank 0's and rank
    2's tensor-parallel groups have other ranks, and the name stands for both; the
    driver finds the group from the served model's mesh. Any other group is
    ``precompile:ranks=0,1`` (its ranks, in group-rank order).

    Raises:
        CaptureError: a collective names a group this process cannot resolve, or
            one whose ranks c10d does not know (:func:`group_ranks`).
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    mesh = next(iter(meshes), None)
    by_dim = _mesh_dims(mesh)
    groups: dict[str, list[int]] = {}
    mesh_groups: dict[str, int] = {}
    for mod in gm.modules():
        if not isinstance(mod, torch.fx.GraphModule):
            continue
        changed = False
        for node in mod.graph.nodes:
            for i, name in _group_args(node):
                if name.startswith(PREFIX):
                    groups[name] = [int(r) for r in name[len(PREFIX) :].split(",")]
                    continue
                if name.startswith(MESH_PREFIX):
                    canonical = name
                else:
                    try:
                        pg = c10d._resolve_process_group(name)  # type: ignore[arg-type]  # (GroupName: a str)
                    except Exception as e:
                        raise CaptureError(
                            "a collective names the process group "
                            f"{name!r}, which this process cannot resolve ({e})",
                            target=target,
                        ) from e
                    if name in by_dim:
                        canonical = by_dim[name]
                    else:
                        canonical = PREFIX + ",".join(
                            map(str, group_ranks(pg, name=name, target=target))
                        )
                    _register(canonical, pg)
                    args = list(node.args)
                    args[i] = canonical
                    node.args = tuple(args)
                    changed = True
                if canonical.startswith(MESH_PREFIX):
                    mesh_groups[canonical] = list(by_dim.values()).index(canonical)
                else:
                    groups[canonical] = [int(r) for r in canonical[len(PREFIX) :].split(",")]
        if changed:
            mod.recompile()
    if not groups and not mesh_groups and mesh is None:
        return None
    out: dict = {"world_size": dist.get_world_size(), "groups": groups, "backend": backend_name()}
    if mesh is not None:  # a sharded model: its shards are for this mesh, collectives or not
        out["mesh"] = mesh_record(mesh)
    if mesh_groups:
        out["mesh_groups"] = mesh_groups
    return cast(Collectives, out)


def _register(name: str, pg) -> None:
    from torch._C import _distributed_c10d as C

    try:
        C._unregister_process_group(name)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - not registered yet
        pass
    C._register_process_group(name, pg)  # type: ignore[arg-type]


def refuse_data_parallel(fn, modules: Iterable[Any], target: str) -> None:
    """Refuse a capture whose model is wrapped in DistributedDataParallel or FSDP (as
    an argument, or as the function itself, its ``self`` or a closure variable).

    Raises:
        CaptureError: naming the wrapper and what to capture instead.
    """
    if not (torch.distributed.is_available()):
        return
    from torch.nn.parallel import DistributedDataParallel

    wrappers: tuple = (DistributedDataParallel,)
    try:
        from torch.distributed import fsdp

        wrappers += tuple(
            getattr(fsdp, n) for n in ("FullyShardedDataParallel", "FSDPModule") if hasattr(fsdp, n)
        )
    except ImportError:  # pragma: no cover - torch without fsdp
        pass
    candidates = [*modules, fn, getattr(fn, "__self__", None)]
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    for cell in getattr(getattr(fn, "__func__", fn), "__closure__", None) or ():
        try:
            candidates.append(cell.cell_contents)
        except ValueError:
            pass
    g = getattr(getattr(fn, "__func__", fn), "__globals__", {})
    candidates += [g[n] for n in getattr(code, "co_names", ()) if n in g]
    for c in candidates:
        if not isinstance(c, torch.nn.Module):
            continue
        for m in c.modules():
            if isinstance(m, wrappers):
                raise CaptureError(
                    f"the model is wrapped in {type(m).__name__}, whose gradient "
                    "averaging runs in autograd hooks the capture cannot trace (the loaded step "
                    "would not average gradients across ranks). Capture the inner module's step "
                    "(pass `wrapped.module`) and average the gradients outside the loaded function "
                    "(dist.all_reduce(p.grad) / world size per parameter), or average them inside "
                    "with functional collectives (funcol.all_reduce(p.grad, 'avg', group))",
                    target=target,
                )
