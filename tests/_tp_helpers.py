"""Shared by the tensor-parallel tests (test_tensor_parallel.py, test_tp_llama.py): the
tests/packages/tpmodels wheel built both ways and served under torchrun."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from _build_helpers import PACKAGES, build, make_project

ROOT = Path(__file__).resolve().parents[1]


def unpack(wheel: Path, dest: Path) -> Path:
    """The wheel's files under ``dest`` (a site directory to put on the path)."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    return dest


def torchrun(
    site: Path, out: Path, targets: list[str], nproc: int = 2, timeout: int = 300
) -> list[dict]:
    """``torchrun --nproc_per_node nproc serve.py`` with ``site`` (an unpacked wheel)
    first on the path; returns each rank's JSON (tests/packages/tpmodels/serve.py)."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / "serve.py"  # outside the project: `import tpmodels` finds the wheel's
    shutil.copyfile(PACKAGES / "tpmodels" / "serve.py", script)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT), str(ROOT / "runtime")]),
        PRECOMPILE_CACHE_DIR=str(out / "kcache"),
        OMP_NUM_THREADS="1",
    )
    for _ in range(
        2
    ):  # torchrun's MASTER_PORT was free when it chose it; another process may take it
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node",
                str(nproc),
                str(script),
                str(out),
                *targets,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode == 0 or "EADDRINUSE" not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


def check_refusals(results: list[dict], targets: list[str]) -> None:
    """Before init_process_group every rank's load of ``targets`` was refused."""
    for r in results:
        for name in targets:
            assert "is in no process group" in r["before_init"][name], r["before_init"]


def check_world_of_one(one: dict, targets: list[str]) -> None:
    """In a world of one process every load of ``targets`` was refused, naming both sizes."""
    for name in targets:
        text = one["world_of_one"][name]
        assert (
            f"target {name!r}: the captured function runs collectives over a world of 2 process(es); "
            "this process is in a world of 1. Serve it with 2 processes (torchrun --nproc_per_node 2)"
            in text
        )


def built_both_ways(tmp_path, monkeypatch, real: str, fake: str) -> dict:
    """The tpmodels wheel built with `distributed = real` (targets ``real``, comma
    separated) and with `distributed = fake` (targets ``fake``): ``{mode: wheel}``."""
    wheels = {}
    for mode, targets in (("real", real), ("fake", fake)):
        root = make_project(tmp_path / mode, name="tpmodels")
        wheels[mode] = build(
            root,
            monkeypatch,
            config_settings={"precompile.distributed": mode, "precompile.targets": targets},
        )
    return wheels
