"""The fixture projects of hatchling, flit-core, pdm-backend and
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
from _build_helpers import (
    PACKAGES,
    PYC,
    as_another_host,
    check_record,
    dist_links,
    manifest_of,
    torch_only_path,
    wheel_names,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("build_env")]
REPO = Path(__file__).resolve().parents[1]
DISTS = {
    "hatchpkg": "hatchling",
    "flitpkg": "flit-core",
    "pdmpkg": "pdm-backend",
    "skbpkg": "scikit-build-core",
}
OWN_META = {"hatchpkg": [], "flitpkg": [], "pdmpkg": ["entry_points.txt"], "skbpkg": []}
# scikit-build-core's project: the C++ extension module CMake built (the system's cmake)
OWN_EXTRA = {"skbpkg": ["skbpkg/_native" + sysconfig.get_config_var("EXT_SUFFIX")]}

_SERVE = """import sys, torch
from precompile_runtime import load_packaged
from {name}.model import TinyMLP
import precompile_runtime, {name}
assert "precompile_build" not in sys.modules and {where!r} in {name}.__file__, {name}.__file__
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
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv*",
            ".whl",
            "build",
            "dist",
            "*.egg-info",
            "__pycache__",
            "bench",
            "tests",
            "example_project",
        ),
    )
    links = tmp / "links"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(links),
            str(src),
            str(src / "runtime"),
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
            str(links),
            *DISTS.values(),
        ],
        check=True,
        capture_output=True,
    )
    _hostlink_wheel(
        links,
        dist_links(
            tmp / "host",
            [
                "torch",
                "setuptools",
                "wheel",
                "packaging",
                "filelock",
                "platformdirs",
                "auditwheel",
                *DISTS.values(),
            ],
        ),
    )
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
    py.write_text(
        py.read_text().replace(
            'requires = ["precompile-build", ',
            'requires = ["precompile-build", "precompile-runtime", "hostlink", ',
        )
    )
    env, plain = _env(tmp_path, wheelhouse)
    logs = [
        _build(project, tmp_path / "plain", plain, isolated=False),
        _build(project, tmp_path / "isolated", env, isolated=True),
    ]
    assert all("precompile: mlp: ok on cpu" in log for log in logs), logs[1][-3000:]
    (whl,) = (tmp_path / "plain").glob("*.whl")
    (again,) = (tmp_path / "isolated").glob("*.whl")
    di = f"{name}-0.1.0.dist-info"
    assert wheel_names(whl) == sorted(
        [
            f"{name}/__init__.py",
            f"{name}/model.py",
            f"{name}/data/info.json",
            f"{di}/METADATA",
            f"{di}/RECORD",
            f"{di}/WHEEL",
        ]
        + [f"{di}/{n}" for n in OWN_META[name]]
        + [
            f"{name}/_precompiled/{n}"
            for n in ("manifest.json", "mlp.cache", "mlp.py", "mlp" + PYC)
        ]
        + OWN_EXTRA.get(name, [])
    )
    check_record(whl)
    assert "-none-any" not in whl.name and again.name == whl.name
    assert wheel_names(again) == wheel_names(whl)
    check_record(again)
    (runtime,) = wheelhouse.glob("precompile_runtime-*.whl")
    assert _serve(tmp_path, env, name, [whl, runtime]) == ["served", "False"]


def _env(tmp_path: Path, wheelhouse: Path) -> tuple[dict, dict]:
    """The environments of an isolated build (offline, the wheelhouse) and of a build
    without isolation (this tree importable)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PRECOMPILE_ENGINE", "PRECOMPILE_TRACER", "PRECOMPILE_TARGETS", "PYTHONPATH")
    }
    env.update(
        PIP_NO_INDEX="1",
        PIP_NO_DEPS="1",
        PIP_FIND_LINKS=str(wheelhouse),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
        SOURCE_DATE_EPOCH="1700000000",
    )
    return env, dict(env, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "runtime")]))


def _serve(
    tmp_path: Path, env: dict, name: str, wheels: list, where: str = "/site-packages/"
) -> list:
    """Install ``wheels`` into a fresh virtual environment (torch linked in) and run
    _SERVE there: the words it prints."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run(
        [str(vpy), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "torchlink.pth").write_text(f"{torch_only_path(tmp_path / 'torch')}\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(vpy),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            *map(str, wheels),
        ],
        check=True,
        capture_output=True,
        env=env,
    )  # no PYTHONPATH
    served = subprocess.run(
        [str(vpy), "-c", _SERVE.format(name=name, where=where)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(env, PRECOMPILE_NO_COMPILE="1", PRECOMPILE_CACHE_DIR=str(tmp_path / "kcache")),
    )
    assert served.returncode == 0, served.stdout[-3000:] + served.stderr[-3000:]
    return served.stdout.split()


@pytest.mark.parametrize("name", ["hatchpkg", "flitpkg", "pdmpkg"])
def test_a_wrapped_backends_editable_install_serves_from_the_source_tree(
    tmp_path, wheelhouse, name
):
    """PEP 660 as pip calls it (``build_editable`` through pyproject-hooks): the pairs
    written into the source tree's package, the backend's editable wheel installed and
    served from the source tree. (scikit-build-core's editable install rebuilds its C++
    module through an import hook at run time: left to its own tests.)"""
    from pyproject_hooks import BuildBackendHookCaller

    project = tmp_path / name
    shutil.copytree(PACKAGES / name, project)
    env, plain = _env(tmp_path, wheelhouse)
    out = tmp_path / "editable"
    out.mkdir()

    def runner(cmd, cwd=None, extra_environ=None):
        subprocess.run(
            cmd, cwd=cwd, env=dict(plain, **(extra_environ or {})), check=True, capture_output=True
        )

    caller = BuildBackendHookCaller(str(project), "precompile_build.backend", runner=runner)
    whl = out / caller.build_editable(str(out))
    assert sorted(p.name for p in (project / name / "_precompiled").iterdir()) == sorted(
        ["manifest.json", "mlp.cache", "mlp.py", "mlp" + PYC]
    )
    assert not [n for n in wheel_names(whl) if "_precompiled" in n]  # served from the source tree
    check_record(whl)
    (runtime,) = wheelhouse.glob("precompile_runtime-*.whl")
    assert _serve(tmp_path, env, name, [whl, runtime], where=str(project)) == ["served", "False"]


@pytest.mark.parametrize("name", list(DISTS))
def test_a_wrapped_backends_wheels_reproduce_inspect_and_merge(tmp_path, wheelhouse, name):
    """With SOURCE_DATE_EPOCH a rebuild writes the same bytes; ``inspect`` reads the
    wheel; the wheel of another host (a GPU host's variant) merges with it, the
    backend's own files kept, and the merged wheel serves here."""
    project = tmp_path / name
    shutil.copytree(PACKAGES / name, project)
    env, plain = _env(tmp_path, wheelhouse)
    for out in ("a", "b"):
        _build(project, tmp_path / out, plain, isolated=False)
    (a,), (b,) = (tmp_path / "a").glob("*.whl"), (tmp_path / "b").glob("*.whl")
    assert a.read_bytes() == b.read_bytes()
    gpu = as_another_host(b, tmp_path / "gpu")
    shown = subprocess.run(
        [sys.executable, "-m", "precompile_build", "inspect", str(a)],
        env=plain,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert (
        f"{name}/_precompiled/manifest.json (package {name})" in shown
        and "this host: matches" in shown
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "precompile_build",
            "merge",
            str(a),
            str(gpu),
            "-o",
            str(tmp_path / "merged"),
        ],
        env=plain,
        capture_output=True,
        text=True,
        check=True,
    )
    (merged,) = (tmp_path / "merged").glob("*.whl")
    check_record(merged)
    own = [n for n in wheel_names(a) if "_precompiled" not in n and ".dist-info/" not in n]
    assert own == [
        n for n in wheel_names(merged) if "_precompiled" not in n and ".dist-info/" not in n
    ]
    assert [
        v["fingerprint"]["device_type"] for v in manifest_of(merged)["targets"]["mlp"]["variants"]
    ] == ["cpu", "cuda"]
    (runtime,) = wheelhouse.glob("precompile_runtime-*.whl")
    assert _serve(tmp_path, env, name, [merged, runtime]) == ["served", "False"]
