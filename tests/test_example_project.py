"""The example project, end to end: build tinylm's wheel with a real frontend (its
capture scripts run through the backend), install it under another prefix, run
`python -m tinylm.demo` in a fresh process with empty compiler caches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def _build_and_demo(tmp_path: Path, engine: str | None) -> tuple[Path, str]:
    project = tmp_path / "example_project"
    shutil.copytree(ROOT / "example_project", project,
                    ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "_precompiled", "__pycache__"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-build"),
               PRECOMPILE_BUILD_CACHE_DIR=str(tmp_path / "capture-cache"))
    env.pop("PRECOMPILE_ENGINE", None)
    if engine:
        env["PRECOMPILE_ENGINE"] = engine
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path / "dist"),
                    str(project)], check=True, env=env, capture_output=True)
    wheel = next((tmp_path / "dist").glob("tinylm-*.whl"))
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    run_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "runtime")]),
                   HOME=str(tmp_path / "home"), TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
                   TRITON_CACHE_DIR=str(tmp_path / "triton"), PRECOMPILE_CACHE_DIR=str(tmp_path / "kernels"))
    demo = subprocess.run([sys.executable, "-m", "tinylm.demo", "--strict"], env=run_env,
                          capture_output=True, text=True, cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr[-3000:]
    return wheel, demo.stdout


@pytest.mark.slow
def test_tinylm_wheel_frozen_engine(tmp_path):
    wheel, out = _build_and_demo(tmp_path, None)
    names = sorted(n for n in zipfile.ZipFile(wheel).namelist() if "/_precompiled/" in n)
    assert names == [f"tinylm/_precompiled/{n}" for n in
                     ("forward.cache", "forward.py", "manifest.json", "train_step.cache", "train_step.py")]
    for target in ("forward", "train_step"):
        line = next(ln for ln in out.splitlines() if ln.startswith(target))
        assert "engine=frozen" in line and line.rstrip().endswith("ok"), line


@pytest.mark.slow
@pytest.mark.torch_engine
@pytest.mark.skipif(not callable(getattr(getattr(torch, "compiler", None), "precompile", None)),
                    reason="this torch has no torch.compiler.precompile (the torch engine needs 2.14+)")
def test_tinylm_wheel_torch_engine(tmp_path):
    _, out = _build_and_demo(tmp_path, "torch")
    for target in ("forward", "train_step"):
        line = next(ln for ln in out.splitlines() if ln.startswith(target))
        assert "engine=torch" in line and line.rstrip().endswith("ok"), line
