"""DTensor parameters (a model sharded with ``parallelize_module``): lifted as their
local shards.

A tensor-parallel model's sharded parameters are ``torch.distributed.tensor.DTensor``
objects: a local shard plus a device mesh and placements. The pair holds no weights
and no rank: the capture lifts each DTensor parameter as its **local shard** (a plain
tensor, the shard's shape), and inside the traced function wraps the shard again
(``DTensor.from_local`` with the parameter's mesh, placements, global shape and
stride; no communication), so the model runs as it does under torchrun and DTensor's
dispatch traces into the shard's ATen ops plus the functional collectives it inserts
(``_c10d_functional.all_reduce`` for a rowwise layer's partial sum, ...). The
collectives' groups are then recorded by mesh dimension or ranks (collectives.py).

The pair records, per lifted DTensor parameter, its mesh (shape, dimension names) and
placements (:func:`layout_of`); the driver unwraps the served model's DTensors to their
shards and refuses a model sharded another way (templates/driver.py ``_local_params``).

Not supported (refused at capture with what to do instead): DTensor arguments and
results (pass and return plain tensors: the plan's ``input_layouts`` /
``use_local_output``), and a backward through DTensor parameters (the loaded step
would not give the DTensors' ``.grad`` their shards' gradients).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import CaptureError


@dataclass
class Lifted:
    """One DTensor parameter as the trace sees it: the live mesh and placements (to
    wrap the shard again) and what the pair records of it."""

    index: int  # position among the lifted parameters/buffers
    mesh: Any  # DeviceMesh
    placements: tuple
    shape: tuple  # the global shape
    stride: tuple  # the global stride

    def record(self) -> dict:
        """What the pair keeps: ``{"index", "mesh": {"shape", "dim_names"},
        "placements": [str], "shape": global shape}``."""
        return {
            "index": self.index,
            "mesh": mesh_record(self.mesh),
            "placements": [repr(p) for p in self.placements],
            "shape": list(self.shape),
        }


def _dtensor_type():
    module = sys.modules.get("torch.distributed.tensor")  # never imported: no DTensor exists
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(t) -> bool:
    """Whether ``t`` is a ``torch.distributed.tensor.DTensor`` (without importing it)."""
    cls = _dtensor_type()
    return cls is not None and isinstance(t, cls)


def mesh_record(mesh) -> dict:
    """``{"shape": [int], "dim_names": [str] | None}`` of a DeviceMesh."""
    names = getattr(mesh, "mesh_dim_names", None)
    return {"shape": list(mesh.shape), "dim_names": list(names) if names else None}


def lift(params: list) -> tuple[list, list[Lifted]]:
    """Replace each DTensor in ``params`` by its local shard.

    Returns:
        ``(tensors, lifted)``: ``params`` with each DTensor's local tensor in its place,
        and a :class:`Lifted` per DTensor (in order).
    """
    out, lifted = [], []
    for i, t in enumerate(params):
        if is_dtensor(t):
            lifted.append(
                Lifted(i, t.device_mesh, tuple(t.placements), tuple(t.shape), tuple(t.stride()))
            )
            out.append(t._local_tensor)
        else:
            out.append(t)
    return out, lifted


def wrap(leaves: list, lifted: list[Lifted]) -> list:
    """``leaves`` (the traced lifted tensors) with each DTensor position wrapped again
    as a DTensor of its mesh, placements and global shape (no communication)."""
    if not lifted:
        return leaves
    from torch.distributed.tensor import DTensor

    out = list(leaves)
    for d in lifted:
        out[d.index] = DTensor.from_local(
            out[d.index],
            d.mesh,
            d.placements,
            run_check=False,
            shape=torch.Size(d.shape),
            stride=d.stride,
        )
    return out


def refuse_dtensor_arguments(user_tensors: list, paths: list, target: str) -> None:
    """Raises CaptureError naming the first DTensor among the call's tensor arguments
    (the pair takes plain tensors)."""
    for t, path in zip(user_tensors, paths):
        if is_dtensor(t):
            raise CaptureError(
                f"{path} is a DTensor; a captured call takes plain tensors (the pair holds no "
                "mesh). Pass its local tensor (`.to_local()`) or the replicated input, and let "
                "the parallelize_module plan's input_layouts make the DTensor inside the model",
                target=target,
            )


def refuse_backward(grad_indices: list, lifted: list[Lifted], names: list, target: str) -> None:
    """Raises CaptureError when the traced call computed a gradient for a DTensor
    parameter (a backward inside: the pair serves tensor-parallel inference)."""
    hit = sorted({d.index for d in lifted} & set(grad_indices))
    if hit:
        raise CaptureError(
            f"the function runs a backward through the DTensor parameter {names[hit[0]]}; a "
            "tensor-parallel capture serves inference (the loaded step would not give the "
            "DTensors' .grad their shards' gradients). Capture the forward (under torch.no_grad() "
            "or without loss.backward()), or the step without parallelize_module",
            target=target,
        )


def refuse_dtensor_result(outs: list, target: str) -> None:
    """Raises CaptureError when the result holds a DTensor (the pair returns plain tensors)."""
    if any(is_dtensor(o) for o in outs):
        raise CaptureError(
            "the function returns a DTensor; a captured call returns plain tensors. Return "
            "`.to_local()` (this rank's shard) or `.full_tensor()`, or set use_local_output=True "
            "in the parallelize_module plan of the last layer",
            target=target,
        )
