"""A tensor-parallel target's world: its `world-size` and `mesh` keys, and the
`distributed` setting that says how the build runs its ranks.

`world-size = N` declares that the capture script runs as one rank of a world of N
processes (torchrun's ``--nproc_per_node N``); `mesh = { dp = 2, tp = 4 }` declares
the DeviceMesh of a plan with several dimensions (its world size is the product).
`distributed` (``-C precompile.distributed=...``, ``PRECOMPILE_DISTRIBUTED``) picks how:
``real`` runs every rank, ``fake`` rank 0 alone under torch's fake process group
(compile-only), ``auto`` real where the build host has a device per rank (the CPU
always) and fake otherwise (builder/ranks.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Optional

from .messages import PREFIX, fail, invalid

DISTRIBUTED = ("auto", "fake", "real")
"""Values of the `distributed` setting."""


def parse_world(
    raw: Mapping[str, Any], key: str
) -> tuple[Optional[int], tuple[tuple[str, int], ...]]:
    """A target table's `world-size` and `mesh`.

    Args:
        raw: the target's table as parsed.
        key: its dotted key (``tool.precompile.targets.NAME``), for messages.
    Returns:
        ``(world size or None, mesh)``: the mesh as ``((dim name, size), ...)`` in the
        order written (empty when not given); with only a mesh, the world size is the
        product of its sizes.
    Raises:
        ConfigError: `world-size` not a positive integer; `mesh` not a table of
            positive integers keyed by identifiers; both given and the product of the
            mesh's sizes is not the world size.
    """
    world = raw.get("world-size")
    if world is not None and (isinstance(world, bool) or not isinstance(world, int) or world < 1):
        raise fail(
            f"`{key}.world-size` must be a positive integer (the number of ranks, as "
            f"torchrun's --nproc_per_node), not {world!r}"
        )
    mesh_raw = raw.get("mesh")
    mesh: tuple[tuple[str, int], ...] = ()
    if mesh_raw is not None:
        if (
            not isinstance(mesh_raw, dict)
            or not mesh_raw
            or not all(
                isinstance(k, str)
                and k.isidentifier()
                and not isinstance(v, bool)
                and isinstance(v, int)
                and v >= 1
                for k, v in mesh_raw.items()
            )
        ):
            raise fail(
                f"`{key}.mesh` must be a table of the DeviceMesh's dimension names and sizes, "
                f"e.g. `mesh = {{ dp = 2, tp = 4 }}` (positive integers), not {mesh_raw!r}"
            )
        mesh = tuple(mesh_raw.items())
        product = math.prod(v for _, v in mesh)
        if world is not None and world != product:
            raise fail(
                f"`{key}.world-size` = {world} but `{key}.mesh` = "
                f"{' x '.join(f'{k}={v}' for k, v in mesh)} makes {product} ranks; give one "
                "of them, or make them agree"
            )
        world = product
    return world, mesh


def parse_distributed(table: Mapping[str, Any], overrides: Mapping[str, tuple[Any, str]]) -> str:
    """The `distributed` setting: the override, else `[tool.precompile]`'s key, else
    ``"auto"``.

    Raises:
        ConfigError: a value other than :data:`DISTRIBUTED` (naming where it came from).
    """
    value, where = table.get("distributed", "auto"), f"`{PREFIX}.distributed`"
    if "distributed" in overrides:
        value, where = overrides["distributed"]
        value = str(value).strip().lower()
    if value not in DISTRIBUTED:
        msg = (
            f"must be one of {', '.join(map(repr, DISTRIBUTED))} (real: every rank with real "
            f"collectives; fake: rank 0 alone, compile-only), not {value!r}"
        )
        raise invalid(where, msg)
    return str(value)


def mesh_text(mesh: tuple[tuple[str, int], ...]) -> str:
    """``dp=2 x tp=4`` for messages."""
    return " x ".join(f"{k}={v}" for k, v in mesh)
