"""Real frontends (python -m build, pip) on the fixture project, in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from _build_helpers import (_clean_env, check_record, host_fp_json,  # noqa: F401
                            make_project, wheel_names)

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
EXPECTED = sorted([
    "simplepkg-0.1.0.dist-info/METADATA", "simplepkg-0.1.0.dist-info/RECORD",
    "simplepkg-0.1.0.dist-info/WHEEL", "simplepkg-0.1.0.dist-info/top_level.txt",
    "simplepkg/__init__.py", "simplepkg/_precompiled/double.cache",
    "simplepkg/_precompiled/double.py", "simplepkg/_precompiled/manifest.json"])


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "runtime")] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def _run(cmd, cwd):
    proc = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _check_and_load(whl: Path, tmp_path: Path):
    assert wheel_names(whl) == EXPECTED
    check_record(whl)
    target = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
          "--target", str(target), str(whl)], tmp_path)
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from precompile_runtime import load_packaged; "
            "print(load_packaged('double', package='simplepkg')(21))")
    out = _run([sys.executable, "-c", code, str(target)], tmp_path).stdout
    assert out.strip().splitlines()[-1] == "42"


def test_python_m_build_no_isolation(tmp_path):
    root = make_project(tmp_path)
    _run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check",
          "--wheel", "--outdir", str(tmp_path / "dist"), str(root)], tmp_path)
    (whl,) = (tmp_path / "dist").iterdir()
    _check_and_load(whl, tmp_path)


def test_python_m_build_sdist_then_wheel(tmp_path):
    root = make_project(tmp_path)
    _run([sys.executable, "-m", "build", "--no-isolation", "--skip-dependency-check",
          "--outdir", str(tmp_path / "dist"), str(root)], tmp_path)
    names = sorted(p.name for p in (tmp_path / "dist").iterdir())
    assert names == ["simplepkg-0.1.0-py3-none-any.whl", "simplepkg-0.1.0.tar.gz"]
    assert wheel_names(tmp_path / "dist" / names[0]) == EXPECTED


def test_pip_wheel_no_build_isolation(tmp_path):
    root = make_project(tmp_path)
    _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
          "--no-index", "-w", str(tmp_path / "dist"), str(root)], tmp_path)
    (whl,) = (tmp_path / "dist").iterdir()
    _check_and_load(whl, tmp_path)


@pytest.mark.parametrize("mode", ["lenient", "strict"])
def test_pip_install_editable_loads_its_artifacts(tmp_path, mode):
    """`pip install -e`: the pairs land in the source package (an editable import
    resolves there) and load_packaged serves them from it. With
    ``editable_mode=strict`` the import resolves to setuptools' link tree under
    build/, which gets them too (issue 15 case 5: was TargetNotFoundError)."""
    root = make_project(tmp_path)
    prefix = tmp_path / "prefix"
    extra = ["--config-settings", "editable_mode=strict"] if mode == "strict" else []
    _run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
          "--prefix", str(prefix), *extra, "-e", str(root)], tmp_path)
    assert (root / "simplepkg" / "_precompiled" / "manifest.json").is_file()
    (site_dir,) = prefix.glob("lib/python*/site-packages")
    code = ("import site, sys; site.addsitedir(sys.argv[1]); import simplepkg; "
            "from precompile_runtime import load_packaged; "
            "print(simplepkg.__file__); print(load_packaged('double', package='simplepkg')(21))")
    out = _run([sys.executable, "-c", code, str(site_dir)], tmp_path).stdout.strip().splitlines()
    if mode == "lenient":
        assert out[-2] == str(root / "simplepkg" / "__init__.py")  # from the source tree
    else:
        assert out[-2].startswith(str(root / "build" / "__editable__."))  # the link tree
        assert out[-2].endswith("simplepkg/__init__.py")
    assert out[-1] == "42"
