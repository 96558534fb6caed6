"""A `world-size` target's ranks: which way the build runs them, their torchrun
environment, and what the kept pair must show.

``real``: every rank in its own process, as ``torchrun --nproc_per_node N`` starts them
(script.py), each capturing and validating its shards against its eager call with
real collectives; rank 0's pair is kept, and every other rank's must compute the same
(:func:`rank_difference`: one pair serves every rank). ``fake``: rank 0 alone, its
``init_process_group()`` made torch's fake process group (process/world.py):
compile-only. ``auto``: real on the CPU (gloo) and where the build host has a GPU
per rank, fake otherwise.
"""

from __future__ import annotations

import ast
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from ..config.parallel import mesh_text
from ..config.settings import TargetSettings
from ..process.world import MODE_ENV, WORLD_ENV


@dataclass(frozen=True)
class WorldPlan:
    """How one build runs a world-size target's ranks."""

    size: int
    """The world size."""
    mode: str
    """``"real"`` (every rank) or ``"fake"`` (rank 0 alone)."""
    mesh: tuple[tuple[str, int], ...] = ()
    """The declared mesh, ``((dim name, size), ...)``; empty: one dimension."""
    why: str = ""
    """Why this mode (``distributed = auto: 1 GPU for 8 ranks``), for the build's line."""

    @property
    def processes(self) -> int:
        """How many capture processes run: the world size, or 1 under the fake backend."""
        return self.size if self.mode == "real" else 1


def plan(
    target: TargetSettings, device: str, distributed: str, gpus: int
) -> tuple[Optional[WorldPlan], Optional[str]]:
    """The plan for ``target`` on ``device``, or why it cannot run.

    Args:
        target: the target (its ``world_size`` and ``mesh``).
        device: ``"cpu"`` or ``"cuda"``.
        distributed: the `distributed` setting (``auto``, ``fake``, ``real``).
        gpus: the build host's usable GPUs.
    Returns:
        ``(None, None)`` for a single-process target; ``(plan, None)``; or ``(None,
        reason)`` when ``distributed = "real"`` asks for more GPUs than the host has.
    """
    n = target.world_size
    if n is None:
        return None, None
    if distributed == "fake":
        return WorldPlan(n, "fake", target.mesh, "distributed = fake"), None
    enough = device == "cpu" or gpus >= n
    if distributed == "real":
        if not enough:
            return None, (
                f"distributed = real runs each of the {n} ranks on its own GPU and this build host "
                f"has {gpus}; build on a host with {n} GPUs, or set `-C precompile.distributed=fake` "
                "to capture rank 0 alone (compile-only)"
            )
        return WorldPlan(n, "real", target.mesh, "distributed = real"), None
    if enough:
        return WorldPlan(
            n, "real", target.mesh, "gloo on the CPU" if device == "cpu" else f"{n} GPUs"
        ), None
    return WorldPlan(
        n, "fake", target.mesh, f"distributed = auto: {gpus} GPU(s) for {n} ranks"
    ), None


def free_port() -> int:
    """A TCP port free on the loopback interface now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def rank_env(env: Mapping[str, str], world: WorldPlan, rank: int, port: int) -> dict[str, str]:
    """``env`` with the torchrun environment of ``rank`` (RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; OMP_NUM_THREADS split between
    the processes unless set) and the build's :data:`MODE_ENV` / :data:`WORLD_ENV`."""
    out = dict(env)
    out.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world.size),
        LOCAL_WORLD_SIZE=str(world.size),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    out[MODE_ENV], out[WORLD_ENV] = world.mode, str(world.size)
    if "OMP_NUM_THREADS" not in env:  # as torchrun: the ranks share the cores
        out["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // world.processes))
    return out


def world_problem(meta: Mapping[str, Any], world: WorldPlan) -> Optional[str]:
    """What is wrong with the world rank 0's pair was captured in, or None.

    Returns:
        a failure reason: the script's world has another size than `world-size`, or
        the sharded model's DeviceMesh another shape (or dimension names) than `mesh`.
    """
    rec = meta.get("collectives")
    if not rec:
        return None
    if rec.get("world_size") != world.size:
        return (
            f"the script's process group has {rec.get('world_size')} rank(s) and the target declares "
            f"world-size = {world.size}; call dist.init_process_group() without world_size= or rank= "
            "(the build sets RANK and WORLD_SIZE as torchrun does)"
        )
    mesh = rec.get("mesh")
    if world.mesh and mesh:
        declared = dict(world.mesh)
        names = mesh.get("dim_names")
        if names:  # the parameters' mesh: the whole mesh, or a named part of it (mesh["tp"])
            fits = all(declared.get(k) == v for k, v in zip(names, mesh["shape"]))
            got = " x ".join(f"{k}={v}" for k, v in zip(names, mesh["shape"]))
        else:
            fits = mesh["shape"] == list(declared.values())
            got = " x ".join(map(str, mesh["shape"]))
        if not fits:
            return (
                f"the model is sharded over a DeviceMesh of {got} and the target declares mesh = "
                f"{mesh_text(world.mesh)}; make init_device_mesh's shape and mesh_dim_names the "
                "declared mesh, or change `mesh`"
            )
    return None


# a CUDA device's ordinal in generated code: each rank of a world on N GPUs captures on
# its own (the frozen engine serves the kernels on the inputs' device)
_ORDINAL = re.compile(rb"(device\(type='cuda', index=)\d+(\))|('cuda:)\d+(')")


def _without_metadata(source: bytes) -> bytes:
    """The source half without its PRECOMPILE_METADATA literal (the code that runs),
    its CUDA device ordinals written as 0."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "PRECOMPILE_METADATA" for t in node.targets
        ):
            source = b"".join(lines[: node.lineno - 1] + lines[node.end_lineno or node.lineno :])
            break
    return _ORDINAL.sub(
        lambda m: (m.group(1) or m.group(3)) + b"0" + (m.group(2) or m.group(4)), source
    )


# what may differ between the ranks' pairs: the numbers each rank's validation measured,
# and the eager engine's own record of its comparison
_PER_RANK = ("validation",)


def rank_difference(
    rank0: tuple[bytes, Mapping[str, Any]], other: tuple[bytes, Mapping[str, Any]], rank: int
) -> Optional[str]:
    """Why rank 0's pair would not serve ``rank`` (whose pair is ``other``), or None.

    Args:
        rank0, other: each ``(source bytes, its PRECOMPILE_METADATA)``.
    Returns:
        None when both record the same calling convention, shard shapes, collectives
        and constants and run the same code (only the validation numbers may differ);
        else a sentence naming the first difference and what to change.
    """
    (src0, meta0), (src, meta) = rank0, other
    for key in sorted(set(meta0) | set(meta)):
        if key in _PER_RANK or meta0.get(key) == meta.get(key):
            continue
        detail = ""
        if key in ("params", "tensor_inputs") and isinstance(meta0.get(key), list):
            names = meta0.get("param_names") if key == "params" else None
            for i, (a, b) in enumerate(zip(meta0[key], meta.get(key) or [])):
                if a != b:
                    what = names[i] if names and i < len(names) else f"{key} #{i}"
                    detail = (
                        f" ({what}: {a.get('shape')} on rank 0, {b.get('shape')} on rank {rank})"
                    )
                    break
        return (
            f"rank {rank}'s capture differs from rank 0's in `{key}`{detail}, so rank 0's pair would "
            f"compute something else on rank {rank}. One pair serves every rank when each rank's "
            "shards have one shape (dimensions divisible by the world size) and the captured "
            "function does not read its rank (dist.get_rank() inside it is frozen in at capture)"
        )
    if _without_metadata(src0) != _without_metadata(src):
        return (
            f"rank {rank}'s captured code differs from rank 0's, so rank 0's pair would compute "
            f"something else on rank {rank}: the captured function takes another path on that rank "
            "(a branch on dist.get_rank(), or a value read from it); keep rank-dependent choices "
            "outside the captured function"
        )
    return None


def record(world: WorldPlan, meta: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest's ``distributed`` entry of a variant.

    Returns:
        ``{"world_size", "mesh": {"shape", "dim_names"} or None, "mode": "real" |
        "fake", "backend": the capture's process-group backend, "ranks_captured": int,
        "validated": bool}``: validated is True when every rank validated its pair
        with real collectives.
    """
    rec = meta.get("collectives") or {}
    skipped = bool((meta.get("validation") or {}).get("skipped"))
    return {
        "world_size": world.size,
        "mesh": rec.get("mesh"),
        "mode": world.mode,
        "backend": rec.get("backend"),
        "ranks_captured": world.processes,
        "validated": world.mode == "real" and not skipped,
    }


def describe(entry: Mapping[str, Any]) -> str:
    """One line for the build and ``inspect``: how a tensor-parallel variant was made."""
    mesh = entry.get("mesh") or {}
    shape = ""
    if (mesh.get("shape") and len(mesh["shape"]) > 1) or mesh.get("dim_names"):
        names = mesh.get("dim_names") or [str(i) for i in range(len(mesh.get("shape") or []))]
        shape = (
            " (mesh " + " x ".join(f"{k}={v}" for k, v in zip(names, mesh.get("shape") or [])) + ")"
        )
    head = f"world size {entry.get('world_size')}{shape}: rank 0's pair serves every rank"
    if entry.get("mode") == "fake":
        return (
            head + "; rank 0 captured alone under the fake process-group backend: compile-only, "
            f"not validated at world size {entry.get('world_size')}"
        )
    backend = entry.get("backend") or "?"
    if entry.get("validated"):
        return (
            head
            + f"; captured on all {entry.get('ranks_captured')} ranks ({backend}), each validated"
        )
    return (
        head + f"; captured on all {entry.get('ranks_captured')} ranks ({backend}), not validated"
    )
