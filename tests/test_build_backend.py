"""PEP 517 hooks of precompile_build.backend, called in-process; the wheel opened."""

from __future__ import annotations

import hashlib
import sys
import tarfile
import zipfile

import pytest
from _build_helpers import (
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

pytestmark = pytest.mark.usefixtures("build_env")

DI = "simplepkg-0.1.0.dist-info"
BASE = [
    f"{DI}/METADATA",
    f"{DI}/RECORD",
    f"{DI}/WHEEL",
    f"{DI}/top_level.txt",
    "simplepkg/__init__.py",
]


def _pc(*names):
    return [f"simplepkg/_precompiled/{n}" for n in names]


def test_wheel_exact_files_record_tags_requires(tmp_path, monkeypatch):
    whl = build(make_project(tmp_path), monkeypatch)
    assert whl.name == "simplepkg-0.1.0-py3-none-any.whl"
    assert wheel_names(whl) == sorted(
        BASE + _pc("double.cache", "double.py", "double" + PYC, "manifest.json")
    )
    check_record(whl)
    assert list(whl.parent.iterdir()) == [whl]
    req = metadata_lines(whl, "Requires-Dist")
    assert req[0].startswith("precompile-runtime") and req[1:] == ["torch==2.13.0"]
    assert b"Tag: py3-none-any" in read_member(whl, "WHEEL")
    m = manifest_of(whl)
    assert m["package"] == "simplepkg"
    # the shipped pyc is covered by the manifest, like every file the loader reads
    (v,) = m["targets"]["double"]["variants"]
    pyc = read_member(whl, "double" + PYC)
    assert v["bytecode"] == {
        sys.implementation.cache_tag: {
            "path": "double" + PYC,
            "size": len(pyc),
            "sha256": hashlib.sha256(pyc).hexdigest(),
        }
    }
    (v,) = m["targets"]["double"]["variants"]
    assert m["targets"]["double"]["status"] == "ok"
    assert v["engine"] == "eager" and v["device"] == "cpu"
    assert v["files"]["source"]["path"] == "double.py"
    assert v["files"]["source"]["size"] == len(read_member(whl, "_precompiled/double.py"))
    from precompile_runtime.fingerprint import variant_id

    assert v["id"] == variant_id(v["fingerprint"])


def test_native_engine_gets_platform_tag(tmp_path, monkeypatch):
    whl = build(make_project(tmp_path, target_toml(mode="frozen")), monkeypatch)
    assert whl.name == f"simplepkg-0.1.0-{manylinux_tag()}.whl"
    assert "-none-any" not in whl.name
    wheel_info = read_member(whl, "WHEEL").decode()
    assert f"Tag: {manylinux_tag()}" in wheel_info and "Root-Is-Purelib: false" in wheel_info
    check_record(whl)
    assert list(whl.parent.iterdir()) == [whl]  # setuptools' py3-none-any one is gone


@pytest.mark.parametrize("policy, pins", [("minor", ["torch>=2.13,<2.14"]), ("none", [])])
def test_torch_pin_policy(tmp_path, monkeypatch, policy, pins):
    whl = build(
        make_project(tmp_path), monkeypatch, config_settings={"precompile.torch-pin": policy}
    )
    assert metadata_lines(whl, "Requires-Dist")[1:] == pins


def test_skip_builds_plain_wheel(tmp_path, monkeypatch, capfd):
    """`skip` builds without captures and says so; Requires-Dist keeps the project's
    own dependencies and precompile-runtime (no torch pin: it comes from the captures),
    and prepare_metadata agrees with the wheel."""
    from precompile_build.wheels.rewrite import runtime_requirement

    monkeypatch.setenv("PRECOMPILE_SKIP", "1")
    root = make_project(tmp_path)
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text().replace(
            'requires-python = ">=3.9"\n',
            'requires-python = ">=3.9"\ndependencies = ["numpy>=1"]\n',
        )
    )
    whl = build(root, monkeypatch)
    assert wheel_names(whl) == BASE and whl.name.endswith("-py3-none-any.whl")
    assert metadata_lines(whl, "Requires-Dist") == ["numpy>=1", runtime_requirement()]
    err = capfd.readouterr().err
    assert (
        "precompile: skipped the precompiled targets (double) as `skip` asks "
        "(-C precompile.skip=true or PRECOMPILE_SKIP): the wheel has no _precompiled/ and "
        f"adds {runtime_requirement()} to its requirements but no torch pin"
    ) in err, err
    md = tmp_path / "md"
    md.mkdir()
    name = backend.prepare_metadata_for_build_wheel(str(md))
    assert [
        ln[len("Requires-Dist: ") :]
        for ln in (md / name / "METADATA").read_text().splitlines()
        if ln.startswith("Requires-Dist")
    ] == ["numpy>=1", runtime_requirement()]


def test_targets_override_selects(tmp_path, monkeypatch):
    root = make_project(tmp_path, target_toml("a") + target_toml("b"))
    whl = build(root, monkeypatch, config_settings={"precompile.targets": "b"})
    assert wheel_names(whl) == sorted(BASE + _pc("b.cache", "b.py", "b" + PYC, "manifest.json"))
    assert list(manifest_of(whl)["targets"]) == ["b"]


def test_editable_writes_source_tree_and_sdist_excludes_it(tmp_path, monkeypatch):
    root = make_project(tmp_path)
    whl = build(root, monkeypatch, hook="build_editable")
    pc = root / "simplepkg" / "_precompiled"
    assert sorted(p.name for p in pc.iterdir()) == sorted(
        ["double.cache", "double.py", "double" + PYC, "manifest.json"]
    )
    assert not any("_precompiled" in n for n in wheel_names(whl))
    assert metadata_lines(whl, "Requires-Dist")[1:] == ["torch==2.13.0"]
    check_record(whl)
    # a rebuild replaces the directory (no leftovers, no temp dirs beside it)
    (pc / "stale.py").write_text("")
    build(root, monkeypatch, out=tmp_path / "dist2", hook="build_editable")
    assert sorted(p.name for p in pc.iterdir()) == sorted(
        ["double.cache", "double.py", "double" + PYC, "manifest.json"]
    )
    assert sorted(p.name for p in pc.parent.iterdir()) == ["__init__.py", "_precompiled"]
    # a regular wheel takes fresh pairs, not the source tree's copy
    whl = build(root, monkeypatch, out=tmp_path / "dist3")
    assert wheel_names(whl) == sorted(
        BASE + _pc("double.cache", "double.py", "double" + PYC, "manifest.json")
    )
    sdist = build(root, monkeypatch, out=tmp_path / "sd", hook="build_sdist")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
    assert not any("_precompiled" in n for n in names)


def test_sdist_has_scripts_and_no_artifacts(tmp_path, monkeypatch):
    root = make_project(tmp_path)
    sdist = build(root, monkeypatch, hook="build_sdist")
    assert sdist.name == "simplepkg-0.1.0.tar.gz"
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        assert (
            tf.extractfile("simplepkg-0.1.0/capture/pair.py").read()
            == (root / "capture" / "pair.py").read_bytes()
        )
    assert "simplepkg-0.1.0/pyproject.toml" in names
    assert not any(n.endswith((".cache", "manifest.json")) for n in names)
    assert list(sdist.parent.iterdir()) == [sdist]


def test_wheel_from_sdist(tmp_path, monkeypatch):
    """What `python -m build` does: sdist, unpack, wheel from the unpacked tree."""
    sdist = build(make_project(tmp_path), monkeypatch, hook="build_sdist")
    with tarfile.open(sdist) as tf:
        tf.extractall(tmp_path / "unpacked", filter="data")
    whl = build(tmp_path / "unpacked" / "simplepkg-0.1.0", monkeypatch, out=tmp_path / "w")
    assert wheel_names(whl) == sorted(
        BASE + _pc("double.cache", "double.py", "double" + PYC, "manifest.json")
    )


def test_wheel_from_sdist_with_a_helper_module_beside_the_script(tmp_path, monkeypatch):
    """A capture script outside the package imports a module from its own folder: the
    sdist carries both (setuptools' own sdist has neither), and the unpacked sdist builds."""
    root = make_project(tmp_path, target_toml(script="captures/pair.py"))
    (root / "captures").mkdir()
    (root / "captures" / "pair.py").write_text(  # the fixture script, importing a helper first
        "from modes import MODE  # beside this script\nassert MODE == 'ok'\n"
        + (root / "capture" / "pair.py").read_text()
    )
    (root / "captures" / "modes.py").write_text("MODE = 'ok'\n")
    (root / "captures" / "notes.txt").write_text("not a module\n")
    sdist = build(root, monkeypatch, hook="build_sdist")
    with tarfile.open(sdist) as tf:
        names = set(tf.getnames())
        tf.extractall(tmp_path / "unpacked", filter="data")
    base = "simplepkg-0.1.0/captures"
    assert {f"{base}/pair.py", f"{base}/modes.py"} <= names and f"{base}/notes.txt" not in names
    whl = build(tmp_path / "unpacked" / "simplepkg-0.1.0", monkeypatch, out=tmp_path / "w")
    assert manifest_of(whl)["targets"]["double"]["status"] == "ok"


def test_reproducible_with_source_date_epoch(tmp_path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    # two copies: setuptools caches created build/ paths per process (frontends run
    # each hook in a fresh process), so one tree cannot be built twice in-process
    a = build(make_project(tmp_path / "1"), monkeypatch, out=tmp_path / "a")
    b = build(make_project(tmp_path / "2"), monkeypatch, out=tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    (v,) = manifest_of(a)["targets"]["double"]["variants"]
    assert v["captured_at"] == "2023-11-14T22:13:20Z" and "capture_seconds" not in v
    with zipfile.ZipFile(a) as zf:
        assert {i.date_time for i in zf.infolist()} == {(2023, 11, 14, 22, 13, 20)}


def test_hooks_reexported():
    from setuptools import build_meta

    for name in [n for n in build_meta.__all__ if not n.startswith("_")]:
        assert callable(getattr(backend, name)), name
    assert set(backend.__all__) >= {
        "build_wheel",
        "build_sdist",
        "build_editable",
        "prepare_metadata_for_build_wheel",
    }
    with pytest.raises(AttributeError):
        backend._private_thing  # noqa: B018


def test_prepare_metadata_matches_wheel(tmp_path, monkeypatch):
    root = make_project(tmp_path)
    monkeypatch.chdir(root)
    md = tmp_path / "md"
    md.mkdir()
    name = backend.prepare_metadata_for_build_wheel(str(md))
    text = (md / name / "METADATA").read_text()
    whl = build(root, monkeypatch)
    assert [ln for ln in text.splitlines() if ln.startswith("Requires-Dist")] == [
        "Requires-Dist: " + r for r in metadata_lines(whl, "Requires-Dist")
    ]
    assert backend.get_requires_for_build_wheel() == []
