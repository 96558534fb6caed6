"""Issue 55: the fixture projects of hatchling, flit-core, pdm-backend and
scikit-build-core (tests/packages/{hatch,flit,pdm,skb}pkg, `[tool.precompile] backend`), each built by
``python -m build`` without isolation and isolated, with a real capture (the frozen
engine, a tiny MLP on the CPU); the wheel installed into a fresh virtual environment
(torch linked in, nothing else of this one) and served strict under
``PRECOMPILE_NO_COMPILE=1``, equal to eager.

The isolated build gets precompile-build and precompile-runtime as wheels of this tree,
the wrapped backend as its wheel from the package index, and torch with what the
backend imports through ``hostlink`` (test_build_rebuild.py): the backends' wheels are
downloaded once, then every build is offline. (The isolated build captures again: its
precompile-build is a wheel of this tree, which the capture cache keys apart.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from _build_helpers import PACKAGES, PYC, check_record, dist_links, torch_only_path, wheel_names

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("build_env")]
REPO = Path(__file__).resolve().parents[1]
DISTS = {"hatchpkg": "hatchling", "flitpkg": "flit-core", "pdmpkg": "pdm-backend",
         "skbpkg": "scikit-build-core"}
OWN_META = {"hatchpkg": [], "flitpkg": [], "pdmpkg": ["entry_points.txt"], "skbpkg": []}
# scikit-build-core's project: the C++ extension module CMake built (the system's cmake)
OWN_EXTRA = {"skbpkg": ["skbpkg/_native" + sysconfig.get_config_var("EXT_SUFFIX")]}

_SERVE = """import sys, torch
from precompile_runtime import load_packaged
from {name}.model import TinyMLP
import precompile_runtime, {name}
assert "precompile_build" not in sys.modules and "/site-packages/" in {name}.__file__, {name}.__file__
model = TinyMLP().eval()
x = torch.randn(2, 8)
fn = load_packaged("mlp", package="{name}", strict=True)
with torch.no_grad():
    eager = TinyMLP.forward.__wrapped__(model, x)
    assert torch.allclose(fn(model, x), eager, rtol=1e-5, atol=1e-6)
    # the library's own API, routed through the pair (precompile_runtime.packaged)
    assert torch.allclose(model(x), eager, rtol=1e-5, atol=1e-6)
    three = torch.randn(3, 8)  # a shape the pair was not captured for: its own code
    assert torch.equal(model(three), TinyMLP.forward.__wrapped__(model, three))
if hasattr({name}, "twice"):  # the C++ extension module beside the model
    assert {name}.twice(2.0) == 4.0
route = TinyMLP.forward.route
assert (route.served, route.fallback) == (1, 1) and "CallError" not in route.reason, route.reason
print("served", "torch._inductor.codecache" in sys.modules)
"""


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """precompile-build and precompile-runtime built from this tree, hostlink (torch and
    the backends' imports), and the three backends' wheels (from the package index)."""
    from test_build_rebuild import _hostlink_wheel

    tmp = tmp_path_factory.mktemp("wheelhouse")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", ".venv*", ".whl", "build", "dist", "*.egg-info", "__pycache__", "bench", "tests", "example_project"))
    links = tmp / "links"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(links), str(src), str(src / "runtime")], check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    "-d", str(links), *DISTS.values()], check=True, capture_output=True)
    _hostlink_wheel(links, dist_links(tmp / "host", ["torch", "setuptools", "wheel", "packaging", "filelock",
                                                     "platformdirs", "auditwheel", *DISTS.values()]))
    return links


def _build(project: Path, out: Path, env: dict, *, isolated: bool) -> str:
    cmd = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(project)]
    if not isolated:
        cmd[3:3] = ["--no-isolation", "--skip-dependency-check"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout + proc.stderr


@pytest.mark.parametrize("name", list(DISTS))
def test_a_wrapped_backends_project_builds_installs_and_serves(tmp_path, wheelhouse, name):
    project = tmp_path / name
    shutil.copytree(PACKAGES / name, project)
    py = project / "pyproject.toml"
    py.write_text(py.read_text().replace('requires = ["precompile-build", ',
                                         'requires = ["precompile-build", "precompile-runtime", "hostlink", '))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PRECOMPILE_ENGINE", "PRECOMPILE_TRACER", "PRECOMPILE_TARGETS", "PYTHONPATH")}
    env.update(PIP_NO_INDEX="1", PIP_NO_DEPS="1", PIP_FIND_LINKS=str(wheelhouse),
               TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), SOURCE_DATE_EPOCH="1700000000")
    plain = dict(env, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "runtime")]))
    logs = [_build(project, tmp_path / "plain", plain, isolated=False),
            _build(project, tmp_path / "isolated", env, isolated=True)]
    assert all("precompile: mlp: ok on cpu" in log for log in logs), logs[1][-3000:]
    (whl,) = (tmp_path / "plain").glob("*.whl")
    (again,) = (tmp_path / "isolated").glob("*.whl")
    di = f"{name}-0.1.0.dist-info"
    assert wheel_names(whl) == sorted(
        [f"{name}/__init__.py", f"{name}/model.py", f"{name}/data/info.json", f"{di}/METADATA", f"{di}/RECORD",
         f"{di}/WHEEL"] + [f"{di}/{n}" for n in OWN_META[name]]
        + [f"{name}/_precompiled/{n}" for n in ("manifest.json", "mlp.cache", "mlp.py", "mlp" + PYC)]
        + OWN_EXTRA.get(name, []))
    check_record(whl)
    assert "-none-any" not in whl.name and again.name == whl.name
    assert wheel_names(again) == wheel_names(whl)
    check_record(again)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run([str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "torchlink.pth").write_text(f"{torch_only_path(tmp_path / 'torch')}\n")
    (runtime,) = wheelhouse.glob("precompile_runtime-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(vpy), "install", "-q", "--no-deps", "--no-index",
                    str(whl), str(runtime)], check=True, capture_output=True, env=env)  # no PYTHONPATH
    served = subprocess.run([str(vpy), "-c", _SERVE.format(name=name)], cwd=tmp_path, capture_output=True,
                            text=True, env=dict(env, PRECOMPILE_NO_COMPILE="1",
                                                PRECOMPILE_CACHE_DIR=str(tmp_path / "kcache")))
    assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-3000:]
    assert served.stdout.split() == ["served", "False"]
