"""Real frontends (python -m build, pip) on the fixture project, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _build_helpers import PYC, check_record, make_project, wheel_names

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("build_env")]
REPO = Path(__file__).resolve().parents[1]
EXPECTED = sorted(
    [
        "simplepkg-0.1.0.dist-info/METADATA",
        "simplepkg-0.1.0.dist-info/RECORD",
        "simplepkg-0.1.0.dist-info/WHEEL",
        "simplepkg-0.1.0.dist-info/top_level.txt",
        "simplepkg/__init__.py",
        "simplepkg/_precompiled/double.cache",
        "simplepkg/_precompiled/double.py",
        "simplepkg/_precompiled/double" + PYC,
        "simplepkg/_precompiled/manifest.json",
    ]
)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "runtime")] + [p for p in [env.get("PYTHONPATH")] if p]
    )
    return env


def _run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _check_and_load(whl: Path, tmp_path: Path):
    assert wheel_names(whl) == EXPECTED
    check_record(whl)
    target = tmp_path / "site"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--target",
            str(target),
            str(whl),
        ],
        tmp_path,
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from precompile_runtime import load_packaged; "
        "print(load_packaged('double', package='simplepkg')(21))"
    )
    out = _run([sys.executable, "-c", code, str(target)], tmp_path).stdout
    assert out.strip().splitlines()[-1] == "42"


def test_python_m_build_no_isolation(tmp_path):
    root = make_project(tmp_path)
    _run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--wheel",
            "--outdir",
            str(tmp_path / "dist"),
            str(root),
        ],
        tmp_path,
    )
    (whl,) = (tmp_path / "dist").iterdir()
    _check_and_load(whl, tmp_path)


def test_python_m_build_sdist_then_wheel(tmp_path):
    root = make_project(tmp_path)
    _run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            str(tmp_path / "dist"),
            str(root),
        ],
        tmp_path,
    )
    names = sorted(p.name for p in (tmp_path / "dist").iterdir())
    assert names == ["simplepkg-0.1.0-py3-none-any.whl", "simplepkg-0.1.0.tar.gz"]
    assert wheel_names(tmp_path / "dist" / names[0]) == EXPECTED


def test_pip_wheel_no_build_isolation(tmp_path):
    root = make_project(tmp_path)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "-w",
            str(tmp_path / "dist"),
            str(root),
        ],
        tmp_path,
    )
    (whl,) = (tmp_path / "dist").iterdir()
    _check_and_load(whl, tmp_path)


@pytest.mark.parametrize("mode", ["lenient", "strict"])
def test_pip_install_editable_loads_its_artifacts(tmp_path, mode):
    """`pip install -e`: the pairs land in the source package (an editable import
    resolves there) and load_packaged serves them from it. With
    ``editable_mode=strict`` the import resolves to setuptools' link tree under
    build/, which gets them too (was: TargetNotFoundError)."""
    root = make_project(tmp_path)
    prefix = tmp_path / "prefix"
    extra = ["--config-settings", "editable_mode=strict"] if mode == "strict" else []
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "--prefix",
            str(prefix),
            *extra,
            "-e",
            str(root),
        ],
        tmp_path,
    )
    assert (root / "simplepkg" / "_precompiled" / "manifest.json").is_file()
    (site_dir,) = prefix.glob("lib/python*/site-packages")
    code = (
        "import site, sys; site.addsitedir(sys.argv[1]); import simplepkg; "
        "from precompile_runtime import load_packaged; "
        "print(simplepkg.__file__); print(load_packaged('double', package='simplepkg')(21))"
    )
    out = _run([sys.executable, "-c", code, str(site_dir)], tmp_path).stdout.strip().splitlines()
    if mode == "lenient":
        assert out[-2] == str(root / "simplepkg" / "__init__.py")  # from the source tree
    else:
        assert out[-2].startswith(str(root / "build" / "__editable__."))  # the link tree
        assert out[-2].endswith("simplepkg/__init__.py")
    assert out[-1] == "42"


_OPS = "import torch\n\n\ndef act(x):\n    return torch.relu(x) * 3 + 1\n"
_ACT_CAPTURE = """import sys
import torch
import precompile_build
from simplepkg import ops

fn = ops.act if sys.argv[1] == "by-name" else (lambda x: ops.act(x))
with precompile_build.capture(fn) as f:
    f(torch.arange(-2.0, 3.0))
"""


def test_an_edited_editable_install_serves_the_edited_code(tmp_path):
    """`pip install -e .`, then an edit of the captured function:
    load_packaged serves the edited code (called by the name the capture recorded),
    and refuses a target captured through a lambda; never the old graph's result."""
    toml = "".join(
        f'[tool.precompile.targets.{name}]\nscript = "capture/act.py"\n'
        f'args = ["{how}"]\ntimeout = 300\n'
        for name, how in (("act", "by-name"), ("act_lambda", "lambda"))
    )
    root = make_project(tmp_path, toml)
    (root / "simplepkg" / "ops.py").write_text(_OPS)
    (root / "capture" / "act.py").write_text(_ACT_CAPTURE)
    prefix = tmp_path / "prefix"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-build-isolation",
            "--no-deps",
            "--no-index",
            "--prefix",
            str(prefix),
            "-e",
            str(root),
        ],
        tmp_path,
    )
    (site_dir,) = prefix.glob("lib/python*/site-packages")
    code = (
        "import site, sys, warnings; site.addsitedir(sys.argv[1]); import torch\n"
        "from precompile_runtime import load_packaged, StaleArtifactError\n"
        "x = torch.arange(-2.0, 3.0)\n"
        "for name in ('act', 'act_lambda'):\n"
        "    with warnings.catch_warnings(record=True) as w:\n"
        "        warnings.simplefilter('always')\n"
        "        try:\n"
        "            print(name, load_packaged(name, package='simplepkg')(x).tolist(),\n"
        "                  [type(m.message).__name__ for m in w])\n"
        "        except StaleArtifactError as e:\n"
        "            print(name, 'refused:', str(e).splitlines()[0][-120:])\n"
    )
    before = _run([sys.executable, "-c", code, str(site_dir)], tmp_path).stdout.splitlines()
    assert before[-2:] == [
        "act [1.0, 1.0, 1.0, 4.0, 7.0] []",
        "act_lambda [1.0, 1.0, 1.0, 4.0, 7.0] []",
    ]
    (root / "simplepkg" / "ops.py").write_text(
        _OPS.replace("torch.relu(x) * 3 + 1", "torch.sigmoid(x) * 5 - 1")
    )
    after = _run([sys.executable, "-c", code, str(site_dir)], tmp_path).stdout.splitlines()
    import torch

    edited = (torch.sigmoid(torch.arange(-2.0, 3.0)) * 5 - 1).tolist()
    assert after[-2] == f"act {edited} ['StaleArtifactWarning']", after
    assert after[-1].startswith("act_lambda refused:") and "pip install -e ." in after[-1], after
