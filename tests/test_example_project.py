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
from _build_helpers import PYC, build_and_install, torch_only_path

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def _build_and_demo(tmp_path: Path, engine: str | None) -> tuple[Path, str]:
    wheel, site, _ = build_and_install(
        ROOT / "example_project", tmp_path, {"PRECOMPILE_ENGINE": engine} if engine else None
    )
    run_env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "runtime")]),
        HOME=str(tmp_path / "home"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        TRITON_CACHE_DIR=str(tmp_path / "triton"),
        PRECOMPILE_CACHE_DIR=str(tmp_path / "kernels"),
    )
    demo = subprocess.run(
        [sys.executable, "-m", "tinylm.demo", "--strict"],
        env=run_env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr[-3000:]
    return wheel, demo.stdout


def _uv_install_and_demo(tmp_path: Path, wheel: Path) -> str:
    """`uv pip install WHEEL` into a fresh venv (offline: precompile-runtime from a
    wheel built here; torch overridden away for the resolver and put on the path
    alone, so nothing else of this environment leaks in), then the demo."""
    uv = Path(sys.executable).parent / "uv"
    uv = str(uv) if uv.exists() else shutil.which("uv")
    links, venv = tmp_path / "links", tmp_path / "uv-venv"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(links),
            str(ROOT / "runtime"),
        ],
        check=True,
        capture_output=True,
    )
    (tmp_path / "overrides.txt").write_text("torch; sys_platform == 'never'\n")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run(
        [uv, "venv", "-q", "--python", sys.executable, str(venv)],
        check=True,
        env=env,
        capture_output=True,
    )
    proc = subprocess.run(
        [
            uv,
            "pip",
            "install",
            "--python",
            str(venv / "bin" / "python"),
            "--no-index",
            "--find-links",
            str(links),
            "--no-cache",
            "--override",
            str(tmp_path / "overrides.txt"),
            str(wheel),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from precompile_runtime import _bytecode

    (pc,) = venv.glob("lib/python*/site-packages/tinylm/_precompiled")
    assert not (pc / "__pycache__").exists()  # uv byte-compiles nothing by default
    for target in (
        "forward",
        "train_step",
    ):  # the build's shipped bytecode serves: the load compiles none
        src = pc / f"{target}.py"
        shipped = (pc / f"{target}{PYC}").read_bytes()
        assert _bytecode._installed_bytecode(src, src.read_bytes(), None) is None, (
            target
        )  # no installer pyc
        assert _bytecode._installed_bytecode(src, src.read_bytes(), shipped) is not None, target
    only_torch = torch_only_path(tmp_path / "only-torch")
    run_env = dict(
        env,
        PYTHONPATH=str(only_torch),
        HOME=str(tmp_path / "home2"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor2"),
        PRECOMPILE_CACHE_DIR=str(tmp_path / "kernels2"),
    )
    demo = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "tinylm.demo", "--strict"],
        env=run_env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr[-3000:]
    return demo.stdout


@pytest.mark.slow
def test_tinylm_wheel_frozen_engine(tmp_path):
    wheel, out = _build_and_demo(tmp_path, None)
    names = sorted(n for n in zipfile.ZipFile(wheel).namelist() if "/_precompiled/" in n)
    assert names == [
        f"tinylm/_precompiled/{n}"
        for n in sorted(
            (
                "forward.cache",
                "forward.py",
                "forward" + PYC,
                "manifest.json",
                "train_step.cache",
                "train_step.py",
                "train_step" + PYC,
            )
        )
    ]
    assert "-manylinux_" in wheel.name  # a tag PyPI takes
    from precompile_runtime import _bytecode

    for target in (
        "forward",
        "train_step",
    ):  # pip byte-compiled the source halves: the load compiles none
        src = tmp_path / "site" / "tinylm" / "_precompiled" / f"{target}.py"
        assert _bytecode._installed_bytecode(src, src.read_bytes(), None) is not None, target
    outs = [out]
    uv = Path(sys.executable).parent / "uv"
    if uv.exists() or shutil.which("uv"):  # uv installs precompile-runtime too
        outs.append(_uv_install_and_demo(tmp_path, wheel))
    for o in outs:
        for target in ("forward", "train_step"):
            line = next(ln for ln in o.splitlines() if ln.startswith(target))
            assert "engine=frozen" in line and line.rstrip().endswith("ok"), line


@pytest.mark.slow
@pytest.mark.torch_engine
@pytest.mark.skipif(
    not callable(getattr(getattr(torch, "compiler", None), "precompile", None)),
    reason="this torch has no torch.compiler.precompile (the torch engine needs 2.14+)",
)
def test_tinylm_wheel_torch_engine(tmp_path):
    _, out = _build_and_demo(tmp_path, "torch")
    for target in ("forward", "train_step"):
        line = next(ln for ln in out.splitlines() if ln.startswith(target))
        assert "engine=torch" in line and line.rstrip().endswith("ok"), line
