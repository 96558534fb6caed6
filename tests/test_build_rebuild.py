"""An unchanged rebuild reuses every capture, under each frontend.

The capture imports the project's own package (whose metadata setuptools writes into
the project root: the capture process sees simplepkg.egg-info, the build's process
does not) and a helper beside the script. Each frontend builds twice with one capture
cache; the second build reuses (was: `imports changed: simplepkg 0.1.0 -> not
installed`, every time). The isolated frontends get precompile-build and
precompile-runtime as wheels of this tree, and torch with what the backend needs
through a wheel of one .pth file (``hostlink``) naming a folder of links to this
environment's installs: offline, and each build in a new environment (pypa/build's
venv in a new temp dir, pip's overlay prefix in a new temp dir). ``uv build`` builds
the sdist, then the wheel from it unpacked in a new temp dir each time.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _build_helpers import dist_links, make_project

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("build_env")]
REPO = Path(__file__).resolve().parents[1]

_CAPTURE = """import torch
import precompile_build
import helpers  # capture/helpers.py, beside this script
from simplepkg import ops  # the project's own package

with precompile_build.capture(lambda x: ops.act(x) + helpers.OFFSET, engine="eager") as f:
    f(torch.ones(2))
"""


def _hostlink_wheel(dest: Path, folder: Path) -> None:
    """``hostlink-1.0-py3-none-any.whl``: one .pth file that puts ``folder`` on the path
    of the environment it is installed into."""
    name = "hostlink-1.0"
    files = {
        "hostlink.pth": f"{folder}\n".encode(),
        f"{name}.dist-info/METADATA": b"Metadata-Version: 2.1\nName: hostlink\nVersion: 1.0\n",
        f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{n},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},"
            f"{len(d)}\n"
            for n, d in files.items()
        )
        + f"{name}.dist-info/RECORD,,\n"
    )
    with zipfile.ZipFile(dest / f"{name}-py3-none-any.whl", "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{name}.dist-info/RECORD", record)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """precompile-build and precompile-runtime built from this tree, and hostlink."""
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
    _hostlink_wheel(
        links,
        dist_links(
            tmp / "host",
            ["torch", "setuptools", "wheel", "packaging", "filelock", "platformdirs", "auditwheel"],
        ),
    )
    return links


def _uv() -> str:
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else (shutil.which("uv") or "uv")


FRONTENDS = {
    "python -m build": ["{py}", "-m", "build", "--wheel", "--outdir", "{out}", "{proj}"],
    "python -m build --no-isolation": [
        "{py}",
        "-m",
        "build",
        "--no-isolation",
        "--skip-dependency-check",
        "--wheel",
        "--outdir",
        "{out}",
        "{proj}",
    ],
    "pip wheel": ["{py}", "-m", "pip", "wheel", "-v", "-w", "{out}", "{proj}"],
    "uv build": [
        "{uv}",
        "build",
        "--offline",
        "--no-index",
        "--no-build-isolation",
        "--python",
        "{py}",
        "--out-dir",
        "{out}",
        "{proj}",
    ],
}


@pytest.mark.parametrize("frontend", list(FRONTENDS))
def test_an_unchanged_rebuild_reuses_every_capture(tmp_path, wheelhouse, frontend):
    toml = '[tool.precompile.targets.act]\nscript = "capture/own.py"\ntimeout = 300\n'
    root = make_project(tmp_path, toml)
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text().replace(
            'requires = ["precompile-build"]',
            'requires = ["precompile-build", "precompile-runtime", "hostlink"]',
        )
    )
    (root / "simplepkg" / "ops.py").write_text("def act(x):\n    return x + 1\n")
    (root / "capture" / "own.py").write_text(_CAPTURE)
    (root / "capture" / "helpers.py").write_text("OFFSET = 0\n")
    (root / "MANIFEST.in").write_text("include capture/*.py\n")  # the sdist carries the helper
    env = dict(
        os.environ,
        PIP_NO_INDEX="1",
        PIP_NO_DEPS="1",
        PIP_FIND_LINKS=str(wheelhouse),
        TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
    )
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO), str(REPO / "runtime")]
    )  # the frontends without isolation
    for var in ("PRECOMPILE_ENGINE", "PRECOMPILE_TRACER", "PRECOMPILE_TARGETS"):
        env.pop(var, None)
    lines = []
    for n in (1, 2):
        cmd = [
            a.format(py=sys.executable, uv=_uv(), out=tmp_path / f"dist{n}", proj=root)
            for a in FRONTENDS[frontend]
        ]
        proc = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-5000:]
        assert list((tmp_path / f"dist{n}").glob("simplepkg-*.whl")), out[-3000:]
        lines.append([ln for ln in out.splitlines() if "precompile: act: ok" in ln])
    assert len(lines[0]) == 1 and "captured (why: no entry)" in lines[0][0], lines
    assert len(lines[1]) == 1 and "reused (key " in lines[1][0], lines
