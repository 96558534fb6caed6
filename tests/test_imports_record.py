"""The capture cache's imports record (precompile_build/process/imported.py) in one
process: what it takes as the project's own, and the import context it is compared in.
The builds that use it are in test_build_cache.py and test_build_rebuild.py."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

from precompile_build.process import imported


def _dist(site: Path, name: str, version: str, top: str, egg: bool = False) -> None:
    """Metadata of ``name`` at ``version`` providing module ``top`` in ``site``
    (``egg``: as setuptools' NAME.egg-info in a project root)."""
    info = site / (f"{name}.egg-info" if egg else f"{name}-{version}.dist-info")
    info.mkdir(parents=True)
    (info / ("PKG-INFO" if egg else "METADATA")).write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    )
    (info / "top_level.txt").write_text(f"{top}\n")


def _module(path: Path, text: str = "") -> types.ModuleType:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    m = types.ModuleType(path.stem)
    m.__file__ = str(path)
    return m


def _project(tmp: Path) -> tuple[Path, dict]:
    """A project root with its egg-info, its package, a helper beside the script."""
    root = tmp / "proj"
    _dist(root, "mypkg", "0.1.0", "mypkg", egg=True)
    modules = {
        "mypkg": _module(root / "mypkg" / "__init__.py", "X = 1\n"),
        "helpers": _module(root / "capture" / "helpers.py", "OFFSET = 0\n"),
    }
    return root, modules


def test_the_project_s_own_distribution_is_left_to_the_content_key(tmp_path, monkeypatch):
    """The project's package (whatever its egg-info says) is not recorded: the build
    keys it by content; the helper beside the script is, relative to the root; and so
    the record compares equal in another copy of the project (an unpacked sdist), and
    not after the helper changed there."""
    root, modules = _project(tmp_path)
    monkeypatch.syspath_prepend(str(root))  # the capture process sees the egg-info
    rec = imported.record(modules, root=str(root), package_dir=str(root / "mypkg"))
    assert "mypkg" not in rec["distributions"] and rec["files"] == {}
    assert list(rec["project_files"]) == ["capture/helpers.py"]
    env = imported.environment_record(root=str(root))
    assert "mypkg" not in env["distributions"] and "pytest" in env["distributions"]
    copy = Path(shutil.copytree(root, tmp_path / "elsewhere" / "proj"))
    assert imported.changes(rec, copy) == []
    (copy / "capture" / "helpers.py").write_text("OFFSET = 1\n")
    assert imported.changes(rec, copy) == ["capture/helpers.py changed"]
    (copy / "mypkg" / "__init__.py").write_text("X = 2\n")  # the package: the key's job
    assert imported.changes(rec, copy) == ["capture/helpers.py changed"]


def test_a_library_is_looked_up_where_the_capture_found_it(tmp_path, monkeypatch):
    """A distribution on a path entry only the capture process had (here appended
    after the others, as setuptools appends its _vendor folder, which holds older
    copies of libraries installed in site-packages too) is looked up in the recorded
    order: the version the capture imported, not the older copy, and not `not
    installed` in a process that lacks the entry."""
    site, vendor = tmp_path / "site", tmp_path / "vendor"
    _dist(site, "libdep", "2.0", "libdep")
    _dist(vendor, "libdep", "1.0", "libdep")
    _dist(vendor, "onlyvendored", "3.0", "onlyvendored")
    mods = {
        "libdep": _module(site / "libdep" / "__init__.py"),
        "onlyvendored": _module(vendor / "onlyvendored" / "__init__.py"),
    }
    base = list(sys.path)
    monkeypatch.setattr(sys, "path", [str(site), *base, str(vendor)])
    rec = imported.record(mods)
    assert rec["distributions"]["libdep"] == "2.0" and rec["distributions"]["onlyvendored"] == "3.0"
    monkeypatch.setattr(sys, "path", [str(site), *base])  # the comparing process lacks vendor
    assert imported.changes(rec) == []
    _dist(tmp_path / "newer", "libdep", "2.1", "libdep")
    shutil.rmtree(site / "libdep-2.0.dist-info")
    (site / "libdep-2.1.dist-info").symlink_to(tmp_path / "newer" / "libdep-2.1.dist-info")
    assert imported.changes(rec) == ["libdep 2.0 -> 2.1"]


def test_the_interpreter_s_start_up_hooks_are_not_recorded(tmp_path):
    """pip's isolated build environment imports a sitecustomize.py of its own from a
    new temp folder each build: no input of the capture (was: `…/sitecustomize.py
    changed` on every rebuild under `pip wheel`)."""
    mods = {
        "sitecustomize": _module(tmp_path / "pip-build-env" / "sitecustomize.py"),
        "usercustomize": _module(tmp_path / "user" / "usercustomize.py"),
        "other": _module(tmp_path / "lib" / "other.py"),
    }
    assert list(imported.record(mods)["files"]) == [str((tmp_path / "lib" / "other.py").resolve())]


def test_an_editable_install_is_recorded_by_its_files(tmp_path, monkeypatch):
    """A library installed editable (``pip install -e ../lib``: PEP 610's direct_url.json
    says so) is edited in place with no new version: its modules are recorded by
    content, and an edit is a change; an ordinary install stays keyed by its version."""
    site, src = tmp_path / "site", tmp_path / "lib-src"
    _dist(site, "devlib", "0.1", "devlib")
    (site / "devlib-0.1.dist-info" / "direct_url.json").write_text(
        '{"url": "file:///lib-src", "dir_info": {"editable": true}}'
    )
    _dist(site, "plainlib", "1.0", "plainlib")
    mods = {
        "devlib": _module(src / "devlib" / "__init__.py", "A = 1\n"),
        "plainlib": _module(site / "plainlib" / "__init__.py"),
    }
    monkeypatch.syspath_prepend(str(site))
    rec = imported.record(mods)
    assert "devlib" not in rec["distributions"] and rec["distributions"]["plainlib"] == "1.0"
    edited = str((src / "devlib" / "__init__.py").resolve())
    assert list(rec["files"]) == [edited]
    assert imported.changes(rec) == []
    (src / "devlib" / "__init__.py").write_text("A = 2\n")  # no new version
    assert imported.changes(rec) == [f"{edited} changed"]
