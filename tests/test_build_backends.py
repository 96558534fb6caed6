"""`[tool.precompile] backend`: precompile_build.backend wrapping hatchling, flit-core,
pdm-backend and scikit-build-core, its hooks called in-process on the
fixture projects tests/packages/{hatch,flit,pdm,skb}pkg (scikit-build-core: a C++
extension module beside the model) with the fixture capture script (no torch); the
wrapped backend's failures. Real frontends and real captures: test_build_backends_slow.py."""

from __future__ import annotations

import shutil
import sys
import sysconfig
import tarfile

import pytest
from _build_helpers import (
    PACKAGES,
    PYC,
    build,
    check_record,
    make_project,
    manifest_of,
    manylinux_tag,
    metadata_lines,
    read_member,
    target_toml,
    wheel_names,
)

from precompile_build import backend
from precompile_build.errors import BuildError, ConfigError

pytestmark = pytest.mark.usefixtures("build_env")

BACKENDS = {
    "hatchpkg": "hatchling.build",
    "flitpkg": "flit_core.buildapi",
    "pdmpkg": "pdm.backend",
    "skbpkg": "scikit_build_core.build",
}
# what each backend writes besides the package's files (pdm-backend: entry_points.txt;
# scikit-build-core: the C++ extension module CMake built)
OWN_META = {"hatchpkg": [], "flitpkg": [], "pdmpkg": ["entry_points.txt"], "skbpkg": []}
OWN_EXTRA = {"skbpkg": ["skbpkg/_native" + sysconfig.get_config_var("EXT_SUFFIX")]}
PAIR = ["double.cache", "double.py", "double" + PYC, "manifest.json"]


def project(tmp_path, name: str, toml: str | None = None, *, spec: str | None = None):
    """tests/packages/NAME copied, its `[tool.precompile]` replaced by `backend = spec`
    (the project's own by default) and ``toml`` (the fixture target `double` by
    default), with the fixture capture script beside the project's own."""
    body = f'[tool.precompile]\nbackend = "{spec or BACKENDS[name]}"\n\n' + (
        target_toml(mode="frozen") if toml is None else toml
    )
    root = make_project(tmp_path, body, name=name)
    shutil.copy(PACKAGES / "simple" / "capture" / "pair.py", root / "capture" / "pair.py")
    return root


def own_files(name: str) -> list[str]:
    di = f"{name}-0.1.0.dist-info"
    return (
        [
            f"{name}/__init__.py",
            f"{name}/model.py",
            f"{name}/data/info.json",
            f"{di}/METADATA",
            f"{di}/RECORD",
            f"{di}/WHEEL",
        ]
        + [f"{di}/{n}" for n in OWN_META[name]]
        + (OWN_EXTRA.get(name, []))
    )


@pytest.mark.parametrize("name", list(BACKENDS))
def test_the_wrapped_backends_wheel_gets_the_pairs_record_tag_and_requirements(
    tmp_path, monkeypatch, name
):
    root = project(tmp_path, name)
    whl = build(root, monkeypatch)
    assert whl.name == f"{name}-0.1.0-{manylinux_tag()}.whl"
    assert wheel_names(whl) == sorted(own_files(name) + [f"{name}/_precompiled/{n}" for n in PAIR])
    check_record(whl)
    assert list(whl.parent.iterdir()) == [whl]
    assert metadata_lines(whl, "Requires-Dist") == ["precompile-runtime", "torch==2.13.0"]
    wheel_info = read_member(whl, ".dist-info/WHEEL").decode()
    assert f"Tag: {manylinux_tag()}" in wheel_info and "Root-Is-Purelib: false" in wheel_info
    assert manifest_of(whl)["package"] == name
    assert (
        read_member(whl, f"{name}/data/info.json")
        == (root / name / "data" / "info.json").read_bytes()
    )

    md = tmp_path / "md"
    md.mkdir()
    dist_info = backend.prepare_metadata_for_build_wheel(str(md))
    requires = [
        ln.split(":", 1)[1].strip()
        for ln in (md / dist_info / "METADATA").read_text().splitlines()
        if ln.startswith("Requires-Dist:")
    ]
    assert requires == ["precompile-runtime", "torch==2.13.0"]
    assert (
        backend.get_requires_for_build_wheel() == []
        and backend.get_requires_for_build_sdist() == []
    )

    sdist = build(root, monkeypatch, out=tmp_path / "sd", hook="build_sdist")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    assert f"{name}-0.1.0/capture/pair.py" in names and f"{name}-0.1.0/pyproject.toml" in names
    assert not [n for n in names if "_precompiled" in n]


@pytest.mark.parametrize("name", list(BACKENDS))
def test_an_editable_build_writes_the_pairs_into_the_source_package(tmp_path, monkeypatch, name):
    root = project(tmp_path, name)
    whl = build(root, monkeypatch, hook="build_editable")
    assert not [n for n in wheel_names(whl) if "_precompiled" in n]
    assert metadata_lines(whl, "Requires-Dist") == ["precompile-runtime", "torch==2.13.0"]
    assert "-none-any" not in whl.name
    assert sorted(p.name for p in (root / name / "_precompiled").iterdir()) == sorted(PAIR)


def test_the_default_backend_is_setuptools_byte_for_byte(tmp_path, monkeypatch):
    """No `backend` and `backend = "setuptools.build_meta"` write the same bytes."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    a = build(make_project(tmp_path / "1"), monkeypatch, out=tmp_path / "a")
    explicit = '[tool.precompile]\nbackend = "setuptools.build_meta"\n\n' + target_toml()
    b = build(make_project(tmp_path / "2", explicit), monkeypatch, out=tmp_path / "b")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()


def test_a_setup_py_that_imports_its_own_folder_builds_with_the_legacy_backend(
    tmp_path, monkeypatch
):
    """docs/existing-library.md: a project whose setup.py imports a module beside it
    (as peft's reads its version) wraps `setuptools.build_meta:__legacy__`, which puts
    the folder on the path; the wheel carries setup.py's metadata and the pairs."""
    toml = '[tool.precompile]\nbackend = "setuptools.build_meta:__legacy__"\n\n' + target_toml()
    root = make_project(tmp_path, toml)
    (root / "_version_info.py").write_text('VERSION = "0.2.0"\n')
    (root / "setup.py").write_text(
        "from setuptools import setup\n\nfrom _version_info import VERSION\n\n"
        "setup(version=VERSION)\n"
    )
    py = root / "pyproject.toml"
    py.write_text(py.read_text().replace('version = "0.1.0"', 'dynamic = ["version"]'))
    whl = build(root, monkeypatch)
    assert whl.name.startswith("simplepkg-0.2.0-")
    assert "simplepkg/_precompiled/manifest.json" in wheel_names(whl)


def _in_tree(root, body: str) -> str:
    """An in-tree backend ``_backend/fixture_backend.py``; its `backend-path` line and the
    fixture target."""
    (root / "_backend").mkdir(exist_ok=True)
    (root / "_backend" / "fixture_backend.py").write_text(body)
    return 'backend-path = ["_backend"]\n\n' + target_toml(mode="frozen")


def test_backend_path_the_wrapped_backends_requirements_and_attributes(tmp_path, monkeypatch):
    """An in-tree backend found through `backend-path`: its requirements are the
    build's, its other names are the wrapper's; with no prepare_metadata hook the
    metadata is its wheel's; with no build_editable an editable build is refused."""
    root = make_project(tmp_path, name="hatchpkg")
    toml = _in_tree(
        root,
        "from hatchling.build import build_wheel, build_sdist\n"
        "class UnsupportedOperation(Exception):\n    pass\n"
        "def get_requires_for_build_wheel(config_settings=None):\n"
        "    return ['fixture-req>=1']\n",
    )
    root = project(tmp_path / "again", "hatchpkg", toml, spec="fixture_backend")
    _in_tree(root, (tmp_path / "proj" / "_backend" / "fixture_backend.py").read_text())
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root / "_backend"))  # the test's sys.path restored after it
    import fixture_backend

    assert backend.get_requires_for_build_wheel() == ["fixture-req>=1"]
    assert backend.get_requires_for_build_editable() == []
    assert backend.UnsupportedOperation is fixture_backend.UnsupportedOperation
    md = tmp_path / "md"
    md.mkdir()
    dist_info = backend.prepare_metadata_for_build_wheel(str(md))
    assert dist_info == "hatchpkg-0.1.0.dist-info"
    assert "Requires-Dist: torch==2.13.0" in (md / dist_info / "METADATA").read_text()
    with pytest.raises(BuildError, match="`fixture_backend` .* has no build_editable hook"):
        build(root, monkeypatch, hook="build_editable")
    del sys.modules["fixture_backend"]


@pytest.mark.parametrize(
    "kind, match",
    [
        (
            "missing",
            r"Failed to load the build backend `nosuch\.build` \(`tool\.precompile\.backend`\): "
            r"ModuleNotFoundError: No module named 'nosuch'; list its distribution \(nosuch\) in "
            r"`build-system\.requires`",
        ),
        (
            "fails",
            r"Failed in build_wheel: the wrapped build backend `fixture_backend` \(`tool\.precompile\.backend`\) "
            r"raised RuntimeError: the backend's own failure",
        ),
        (
            "no wheel",
            r"Failed in build_wheel: the wrapped build backend `fixture_backend` \(`tool\.precompile\.backend`\) "
            r"returned 'fixture-0\.1\.0-py3-none-any\.whl', but wrote no such file \(found: nothing\)",
        ),
    ],
)
def test_a_wrapped_backend_that_is_missing_fails_or_writes_no_wheel_is_named(
    tmp_path, monkeypatch, kind, match
):
    mark = tmp_path / "ran"
    monkeypatch.setenv("FIXTURE_MARK", str(mark))
    root = make_project(tmp_path, "")
    if kind == "missing":
        toml, spec = target_toml(mode="frozen"), "nosuch.build"
    else:
        body = {
            "fails": 'raise RuntimeError("the backend\'s own failure")',
            "no wheel": "return 'fixture-0.1.0-py3-none-any.whl'",
        }[kind]
        toml, spec = (
            _in_tree(
                root,
                f"def build_wheel(wheel_directory, config_settings=None, "
                f"metadata_directory=None):\n    {body}\n",
            ),
            "fixture_backend",
        )
    body = f'[tool.precompile]\nbackend = "{spec}"\n' + toml
    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + body)
    monkeypatch.syspath_prepend(str(root / "_backend"))
    sys.modules.pop("fixture_backend", None)
    out = tmp_path / "dist"
    with pytest.raises(BuildError, match=match):
        build(root, monkeypatch, out=out)
    assert not list(out.iterdir())  # no wheel, partial or whole
    assert mark.exists() == (kind != "missing")  # a missing backend fails before any capture


@pytest.mark.parametrize(
    "toml, match",
    [
        (
            'backend = "hatchling build"\n',
            r"`tool\.precompile\.backend` must be a PEP 517 backend object reference "
            r"\(`module` or `module:object`, e\.g\. \"hatchling\.build\"\), not 'hatchling build'",
        ),
        (
            'backend = ["hatchling.build"]\n',
            r"`tool\.precompile\.backend` must be a PEP 517 backend object reference",
        ),
        (
            'backend-path = ["../elsewhere"]\n',
            r"`tool\.precompile\.backend-path` entry '\.\./elsewhere' resolves to "
            r".*, outside the project root",
        ),
        (
            'backend-path = "_backend"\n',
            r"`tool\.precompile\.backend-path` must be an array of directory paths",
        ),
    ],
)
def test_a_bad_backend_key_is_a_config_error(tmp_path, monkeypatch, toml, match):
    root = make_project(tmp_path, "[tool.precompile]\n" + toml + target_toml())
    monkeypatch.chdir(root)
    with pytest.raises(ConfigError, match=match):
        backend.get_requires_for_build_wheel()
    with pytest.raises(ConfigError, match=match):
        build(root, monkeypatch)
