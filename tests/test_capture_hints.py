"""A capture script that fails for a set-up mistake says which: a
module the build environment lacks names `build-system.requires`; a file beside the
script named like a module it imports (captures/numpy.py) names the shadowing."""

from __future__ import annotations

import pytest
from _build_helpers import build, make_project

from precompile_build.errors import CaptureError

pytestmark = pytest.mark.usefixtures("build_env")


def _project(tmp_path, script: str, body: str):
    root = make_project(
        tmp_path, f'[tool.precompile.targets.t]\nscript = "capture/{script}"\ntimeout = 60\n'
    )
    (root / "capture" / script).write_text(body)
    return root


def test_a_missing_module_names_build_system_requires(tmp_path, monkeypatch):
    root = _project(tmp_path, "needs.py", "import nosuch_library_xyz\n")
    with pytest.raises(CaptureError) as e:
        build(root, monkeypatch)
    assert (
        "exited with status 1: ModuleNotFoundError: No module named 'nosuch_library_xyz'; "
        "`nosuch_library_xyz` is not installed where the build runs: an isolated build "
        "(`python -m build`, `pip wheel .`, `pip install .`) installs only `build-system.requires` "
        "of pyproject.toml, so add nosuch_library_xyz's distribution there"
    ) in str(e.value)


def test_a_script_named_like_a_module_it_imports_names_the_shadowing(tmp_path, monkeypatch):
    """captures/fractions.py importing fractions imports itself (the script's folder is
    first on sys.path): the failure says so (the issue's numpy.py: SIGSEGV, nothing else)."""
    root = _project(tmp_path, "fractions.py", "import fractions\nfractions.Fraction(1, 2)\n")
    with pytest.raises(CaptureError) as e:
        build(root, monkeypatch)
    assert (
        "capture/fractions.py is named like the module `fractions`: the script's folder comes "
        "first on its sys.path, so `import` of that name (by the script or by a library it imports, "
        "torch included) finds this file instead; rename it"
    ) in str(e.value)
    assert "nosuch" not in str(e.value)
