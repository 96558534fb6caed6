"""The distributed world a capture runs in: one rank alone under torch's fake process
group, or every rank with real collectives.

A target with `world-size = N` (or a `mesh`) is captured by a script written as the
user's torchrun serving code: ``dist.init_process_group()`` from the environment, a
DeviceMesh, the model sharded with ``parallelize_module``, then
``precompile_build.capture(fn)``. The build sets the torchrun environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)
and :data:`MODE_ENV`:

- ``real``: N processes, one per rank, with real collectives (gloo on the CPU, NCCL on
  N GPUs); each validates its pair against its eager call.
- ``fake``: rank 0 alone (fewer GPUs than ranks). Before the script runs,
  :func:`use_fake_backend` makes its ``init_process_group()`` (whatever backend it
  names) create torch's ``fake`` process group
  (``torch.testing._internal.distributed.fake_pg``): collectives return without
  communicating, so the trace and Inductor's compile see rank 0's shards and the
  collectives DTensor inserts, but no result is meaningful. The capture is
  compile-only there (:func:`fake_reason`): the frozen engine's validation and the
  eager-call check are skipped, and the pair records the backend.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Optional

MODE_ENV = "PRECOMPILE_WORLD"
"""Set by the build for a world-size target: ``"fake"`` or ``"real"``."""
WORLD_ENV = "PRECOMPILE_WORLD_SIZE"
"""Set by the build for a world-size target: the declared world size."""


def use_fake_backend() -> None:
    """Make ``torch.distributed.init_process_group`` create torch's fake process group
    for this process's ``RANK`` / ``WORLD_SIZE`` (the environment's, or the call's own
    ``rank=`` / ``world_size=``), whatever backend, init method or store the call
    names (``device_id`` and ``pg_options`` are dropped: the fake group has none).
    Installed in the capture process before the script runs (builder/script.py)."""
    import torch.distributed as dist

    if not dist.is_available():  # pragma: no cover - torch without distributed
        return
    from torch.distributed import distributed_c10d as c10d
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers "fake"

    real = c10d.init_process_group
    if getattr(real, "_precompile_fake", False):
        return

    @functools.wraps(real)
    def init_process_group(
        backend=None,
        init_method=None,
        timeout=None,
        world_size=-1,
        rank=-1,
        store=None,
        group_name="",
        pg_options=None,
        device_id=None,
        **kwargs,
    ):
        rank = rank if rank >= 0 else int(os.environ.get("RANK", "0"))
        world_size = world_size if world_size >= 0 else int(os.environ.get("WORLD_SIZE", "1"))
        extra = {"timeout": timeout} if timeout is not None else {}
        return real(
            "fake",
            store=FakeStore(),
            rank=rank,
            world_size=world_size,
            group_name=group_name,
            **extra,
            **kwargs,
        )

    init_process_group._precompile_fake = True  # type: ignore[attr-defined]
    # every module that bound the function by name (torch.distributed, its device_mesh)
    for module in list(sys.modules.values()):
        if (
            module is not None
            and getattr(module, "__name__", "").startswith("torch.distributed")
            and getattr(module, "init_process_group", None) is real
        ):
            module.init_process_group = init_process_group  # type: ignore[attr-defined]


def backend_name() -> Optional[str]:
    """The default process group's backend (``"gloo"``, ``"nccl"``, ``"fake"``; a
    device map such as ``"cpu:gloo,cuda:nccl"`` where ``init_process_group()`` named
    none and made one per device type), or None when none is initialized."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    try:
        name = str(dist.get_backend())
        if name == "undefined":  # one backend per device type
            name = str(dist.get_backend_config())
        return name
    except Exception:  # noqa: BLE001 - a backend without a name  # pragma: no cover
        return None


def fake_reason() -> Optional[str]:
    """Why the capture cannot judge results (a sentence), or None: the default process
    group is torch's fake one, whose collectives return no data."""
    backend = backend_name()
    if backend is None or "fake" not in backend:
        return None
    dist = sys.modules["torch.distributed"]
    return (
        f"captured as rank {dist.get_rank()} of {dist.get_world_size()} alone under the fake "
        "process-group backend (its collectives return no data): compile-only, not validated "
        "at this world size"
    )
