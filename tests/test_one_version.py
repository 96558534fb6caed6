"""One process, one version: load_packaged keys what it loaded by the
installed files it came from (the manifest's sha256, which covers every pair file),
and a package whose manifest changed since this process first loaded from it (an
upgrade in place, another install imported) is refused with PackageChangedError,
never served as a mix of the old version's targets and the new one's."""

from __future__ import annotations

import os
import sys

import pytest
from _fake_packages import BLOB, FakePkg, file_entry, make_package, make_pair, make_source

from precompile_runtime import IntegrityError, PackageChangedError, load_packaged

pytestmark = pytest.mark.usefixtures("runtime_env")


def _upgrade(p: FakePkg, target: str, blob: bytes) -> None:
    """Replace ``target``'s pair and the manifest in place, as pip does: new files."""
    doc = p.manifest()
    source = make_source(p.marker, target) + b"# the new version\n"
    cache = make_pair(source, blobs={"sub/k.bin": blob})
    variant = doc["targets"][target]["variants"][0]
    for role, data in (("source", source), ("cache", cache)):
        path = p.data / variant["files"][role]["path"]
        path.unlink()
        path.write_bytes(data)
        variant["files"][role] = file_entry(variant["files"][role]["path"], data)
    variant["code_hash"] = variant["files"]["source"]["sha256"]
    (p.data / "manifest.json").unlink()
    p.write_manifest(doc)


def test_an_upgrade_in_place_is_refused_not_mixed(tmp_path, monkeypatch):
    """The issue's case: after an in-place upgrade, a target loaded before came from the
    old version and one loaded after from the new. Now every later load says so."""
    p = make_package(tmp_path, {"a": [{}], "b": [{}]})
    monkeypatch.syspath_prepend(str(p.root))
    a = load_packaged("a", package=p.name)
    assert a() == ("kernels", BLOB)
    _upgrade(p, "b", b"v2")
    for target in ("b", "a"):  # never loaded / loaded before the upgrade
        with pytest.raises(
            PackageChangedError,
            match=(
                rf"package '{p.name}': its installed precompiled files changed since this process "
                r"loaded from them \(manifest sha256 \w{16}…, now \w{16}…, at .*manifest.json: an "
                r"upgrade or reinstall in place.*Restart the process to serve the new version"
            ),
        ):
            load_packaged(target, package=p.name)
    assert a() == ("kernels", BLOB)  # what was loaded keeps serving the version it came from
    assert issubclass(PackageChangedError, IntegrityError)


def test_a_reinstall_of_the_same_files_is_served(tmp_path, monkeypatch):
    """pip install --force-reinstall of the same wheel: new files, the same manifest."""
    p = make_package(tmp_path)
    monkeypatch.syspath_prepend(str(p.root))
    fn = load_packaged("fwd", package=p.name)
    raw = (p.data / "manifest.json").read_bytes()
    (p.data / "manifest.json").unlink()
    (p.data / "manifest.json").write_bytes(raw)
    assert load_packaged("fwd", package=p.name) is fn


def test_the_package_imported_again_from_another_install_is_refused(tmp_path, monkeypatch):
    p = make_package(tmp_path / "one")
    monkeypatch.syspath_prepend(str(p.root))
    assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)
    other = FakePkg(tmp_path / "site-two", p.name, p.marker)  # the same package, elsewhere
    os.makedirs(other.root)
    os.rename(p.dir, other.dir)
    _upgrade(other, "fwd", b"v2")
    monkeypatch.syspath_prepend(str(other.root))
    monkeypatch.delitem(sys.modules, p.name)
    with pytest.raises(PackageChangedError, match=r"now another install at .*site-two"):
        load_packaged("fwd", package=p.name)
