"""Tests of precompile_runtime.load_packaged against fake installed packages.

Each test builds a package with a unique name in tmp_path: ``__init__.py`` plus
``_precompiled/`` written with ``envelope.dumps`` and ``manifest.dumps``. The fake
source half appends a line to a marker file when it is executed (so tests can count
loads and prove that no code of a tampered artifact ran) and its ``load(kernel_dir)``
returns a callable that reads a blob unpacked into ``kernel_dir`` (or says
``"fallback"`` when ``kernel_dir`` is None).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid
import warnings
import zipfile
from pathlib import Path

import pytest

from precompile_runtime import (
    HostMismatchError,
    HostMismatchWarning,
    IntegrityError,
    ManifestError,
    PrecompileLoadError,
    StaleArtifactError,
    StaleArtifactWarning,
    TargetNotFoundError,
    envelope,
    fingerprint,
    load_packaged,
    manifest,
)

RUNTIME = str(Path(__file__).resolve().parents[1] / "runtime")
BLOB = b"\x7fELF pretend kernel \x00\x01\x02" * 10
HOST = fingerprint.host_fingerprint("cpu")

SOURCE_TEMPLATE = '''\
PRECOMPILE_METADATA = {{
    "format": "precompile-build.source",
    "version": 1,
    "engine": {engine!r},
    "target": {target!r},
    "device": "cpu",
    "calling_convention": {{"args": [], "kwargs": []}},
}}
import os

with open({marker!r}, "a") as _f:
    _f.write("exec\\n")


def load(kernel_dir):
    if kernel_dir is None:
        return lambda: ("fallback", None)
    with open(os.path.join(kernel_dir, "sub", "k.bin"), "rb") as f:
        data = f.read()
    return lambda: ("kernels", data)
'''


class FakePkg:
    def __init__(self, root: Path, name: str, marker: Path) -> None:
        self.root = root  # directory on sys.path
        self.name = name
        self.marker = marker

    @property
    def dir(self) -> Path:
        return self.root / self.name

    @property
    def data(self) -> Path:
        return self.dir / "_precompiled"

    def manifest(self) -> dict:
        return json.loads((self.data / "manifest.json").read_text())

    def write_manifest(self, doc: dict) -> None:
        (self.data / "manifest.json").write_bytes(manifest.dumps(doc))

    def execs(self) -> int:
        return len(self.marker.read_text().splitlines()) if self.marker.exists() else 0


def make_source(pkg_marker: Path, target: str, engine: str = "frozen") -> bytes:
    return SOURCE_TEMPLATE.format(engine=engine, target=target, marker=str(pkg_marker)).encode()


def make_pair(source: bytes, engine: str = "frozen", blobs: dict | None = None, fp: dict | None = None) -> bytes:
    if blobs is None:
        blobs = {"sub/k.bin": BLOB} if engine == "frozen" else {}
    env = envelope.Envelope(
        engine=engine, code_hash=envelope.sha256_hex(source), fingerprint=fp or HOST, blobs=blobs
    )
    return envelope.dumps(env)


def file_entry(path: str, data: bytes) -> dict:
    return {"path": path, "size": len(data), "sha256": envelope.sha256_hex(data)}


def make_package(
    tmp_path: Path,
    targets: dict | None = None,
    *,
    engine: str = "frozen",
    extra_files: dict | None = None,
) -> FakePkg:
    """``targets``: name -> list of fingerprint overrides, one per variant
    (default: one target ``fwd`` with one variant matching this host)."""
    name = f"pcbfake_{uuid.uuid4().hex[:10]}"
    root = tmp_path / f"site-{name}"
    pkg = FakePkg(root, name, tmp_path / f"{name}.marker")
    pkg.data.mkdir(parents=True)
    (pkg.dir / "__init__.py").write_text("")
    for rel, text in (extra_files or {}).items():
        (pkg.dir / rel).write_text(text)
    doc = {"format": manifest.FORMAT, "version": manifest.VERSION, "package": name, "targets": {}}
    for target, overrides in (targets or {"fwd": [{}]}).items():
        variants = []
        for i, over in enumerate(overrides):
            fp = dict(HOST, **over)
            source = make_source(pkg.marker, target, engine)
            cache = make_pair(source, engine, fp=fp)
            stem = target if len(overrides) == 1 else f"{target}-{i}"
            (pkg.data / f"{stem}.py").write_bytes(source)
            (pkg.data / f"{stem}.cache").write_bytes(cache)
            variants.append(
                {
                    "id": fingerprint.variant_id(fp),
                    "engine": engine,
                    "device": "cpu",
                    "fingerprint": fp,
                    "code_hash": envelope.sha256_hex(source),
                    "files": {
                        "source": file_entry(f"{stem}.py", source),
                        "cache": file_entry(f"{stem}.cache", cache),
                    },
                    "capture_seconds": 1.0,
                    "captured_at": "2026-11-29T16:00:00Z",
                }
            )
        doc["targets"][target] = {"required": True, "status": "ok", "reason": None, "variants": variants}
    pkg.write_manifest(doc)
    return pkg


pytestmark = pytest.mark.usefixtures("runtime_env")


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    p = make_package(tmp_path)
    monkeypatch.syspath_prepend(str(p.root))
    return p


def on_path(monkeypatch, p: FakePkg) -> FakePkg:
    monkeypatch.syspath_prepend(str(p.root))
    return p


# ------------------------------------------------------------------- matching


def test_exact_match_loads_kernels(pkg, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn = load_packaged("fwd", package=pkg.name)
    assert fn() == ("kernels", BLOB)
    code_hash = pkg.manifest()["targets"]["fwd"]["variants"][0]["code_hash"]
    assert (tmp_path / "kcache" / code_hash / "sub" / "k.bin").read_bytes() == BLOB
    assert load_packaged("fwd", package=pkg.name) is fn
    assert pkg.execs() == 1
    # nothing left behind but the entry itself
    assert sorted(os.listdir(tmp_path / "kcache")) == [code_hash]


def test_second_variant_matching_is_chosen(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"torch": "0.0.1"}, {}]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)


@pytest.mark.parametrize("field", fingerprint.EXACT_FIELDS)
def test_each_field_mismatch_warns_and_falls_back(field, tmp_path, monkeypatch):
    other = f"other-{field}"
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{field: other}]}))
    with pytest.warns(HostMismatchWarning) as rec:
        fn = load_packaged("fwd", package=p.name)
    assert fn() == ("fallback", None)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert repr(p.name) in msg and "'fwd'" in msg
    assert f"{field}: built for {other!r}, this host has {HOST.get(field)!r}" in msg
    assert "fallback" in msg
    assert not (tmp_path / "kcache").exists()  # no kernels unpacked for a fallback
    # once per process
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_packaged("fwd", package=p.name) is fn


def test_warning_names_every_variant_and_field(tmp_path, monkeypatch):
    p = on_path(
        monkeypatch,
        make_package(tmp_path, {"fwd": [{"torch": "9.9", "python": "2.7"}, {"compute_capability": "9.0"}]}),
    )
    with pytest.warns(HostMismatchWarning) as rec:
        load_packaged("fwd", package=p.name)
    msg = str(rec[0].message)
    assert "variant 0" in msg and "variant 1" in msg
    assert "torch: built for '9.9'" in msg and "python: built for '2.7'" in msg
    assert "compute_capability: built for '9.0', this host has None" in msg


def _core(text: str) -> str:
    return text.split(" Using the slower fallback")[0].split(" Strict mode")[0]


def test_strict_true_raises_with_same_text(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"torch": "0.0.1"}]}))
    with pytest.raises(HostMismatchError) as ei:
        load_packaged("fwd", package=p.name, strict=True)
    assert p.execs() == 0
    with pytest.warns(HostMismatchWarning) as rec:
        load_packaged("fwd", package=p.name)
    assert _core(str(ei.value)) == _core(str(rec[0].message))
    assert "torch: built for '0.0.1'" in str(ei.value)
    # a cached fallback still refuses strict callers
    with pytest.raises(HostMismatchError):
        load_packaged("fwd", package=p.name, strict=True)


def _record_function(p: FakePkg, target: str, function: dict) -> None:
    """Put ``meta["function"]`` in a target's cache, as precompile_build.capture does
    for a module-level function, and update the manifest's size/sha256."""
    cache = p.data / f"{target}.cache"
    env = envelope.loads(cache.read_bytes())
    env.meta = dict(env.meta, function=function)
    cache.write_bytes(envelope.dumps(env))
    doc = p.manifest()
    doc["targets"][target]["variants"][0]["files"]["cache"] = file_entry(f"{target}.cache", cache.read_bytes())
    doc["editable"] = {"package_dir": str(p.dir), "package_sha256": "0" * 64}  # not its digest now
    p.write_manifest(doc)


def test_a_stale_editable_install_serves_the_current_code_and_refuses_strict(tmp_path, monkeypatch):
    """An editable install whose source changed: the captured function's current code
    (by the name the capture recorded) serves, never the old pair; that answer, cached
    by a non-strict load, is not handed to a later strict caller, who gets the
    StaleArtifactError that a first strict load would have raised."""
    p = on_path(monkeypatch, make_package(tmp_path, extra_files={
        "ops.py": "class Steps:\n    @staticmethod\n    def fwd():\n        return 'current code'\n"}))
    _record_function(p, "fwd", {"module": f"{p.name}.ops", "qualname": "Steps.fwd"})
    with pytest.warns(StaleArtifactWarning, match=rf"changed since the editable build .*calling the "
                      rf"current {p.name}.ops.Steps.fwd eagerly instead"):
        assert load_packaged("fwd", package=p.name)() == "current code"
    with pytest.raises(StaleArtifactError, match=r"changed since the editable build .* Strict mode \(strict=True or PRECOMPILE_STRICT=1\): no fallback"):
        load_packaged("fwd", package=p.name, strict=True)
    assert p.execs() == 0  # the stale pair's source never ran


@pytest.mark.parametrize("case", ["no name", "gone"])
def test_a_stale_editable_install_without_the_current_code_is_refused(tmp_path, monkeypatch, case):
    """No importable name recorded (a lambda, a torch-engine pair), or the recorded
    function no longer imports: StaleArtifactError without strict too, never the
    old pair's result."""
    p = on_path(monkeypatch, make_package(tmp_path))
    if case == "no name":
        doc = p.manifest()
        doc["editable"] = {"package_dir": str(p.dir), "package_sha256": "0" * 64}
        p.write_manifest(doc)
        want = r"no importable name \(a lambda"
    else:
        _record_function(p, "fwd", {"module": f"{p.name}.removed", "qualname": "fwd"})
        want = rf"the captured function {p.name}.removed.fwd does not import any more \(ModuleNotFoundError"
    with pytest.raises(StaleArtifactError, match=want + r".*Run the editable install again"):
        load_packaged("fwd", package=p.name)
    assert p.execs() == 0


def test_strict_env_raises(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"platform": "plan9"}]}))
    monkeypatch.setenv("PRECOMPILE_STRICT", "1")
    with pytest.raises(HostMismatchError, match="platform: built for 'plan9'"):
        load_packaged("fwd", package=p.name)
    # strict=False overrides the environment
    with pytest.warns(HostMismatchWarning):
        assert load_packaged("fwd", package=p.name, strict=False)() == ("fallback", None)


def test_fallback_still_verifies_source(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"torch": "0.0.1"}]}))
    src = p.data / "fwd.py"
    src.write_bytes(src.read_bytes().replace(b"fallback", b"fallbaXk"))
    with pytest.raises(IntegrityError, match="fwd.py: sha256 check failed"):
        load_packaged("fwd", package=p.name)
    assert p.execs() == 0


# --------------------------------------------------------------------- engines


def test_torch_engine_delegates_to_torch_pairs(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("precompile_runtime.torch_pairs")

    def load_torch_pair(source, cache, *, fallback, where):
        assert repr(p.name) in where and ("'fwd'" in where or "'bwd'" in where)
        calls.append((source, cache, fallback))
        return ("torch-pair", fallback)

    fake.load_torch_pair = load_torch_pair
    monkeypatch.setitem(sys.modules, "precompile_runtime.torch_pairs", fake)
    import precompile_runtime

    monkeypatch.setattr(precompile_runtime, "torch_pairs", fake, raising=False)
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{}], "bwd": [{"torch": "0.1"}]}, engine="torch"))
    assert load_packaged("fwd", package=p.name) == ("torch-pair", False)
    assert calls[0][0] == (p.data / "fwd.py").read_bytes()
    assert calls[0][1] == (p.data / "fwd.cache").read_bytes()
    with pytest.warns(HostMismatchWarning, match="torch: built for '0.1'"):
        assert load_packaged("bwd", package=p.name) == ("torch-pair", True)
    assert p.execs() == 0  # torch pairs are not exec'd by us


def test_eager_engine_loads_without_kernel_dir(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, engine="eager"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_packaged("fwd", package=p.name)() == ("fallback", None)


# ------------------------------------------------------------------ not found


def test_unknown_target_names_what_exists(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{}], "train": [{}]}))
    doc = p.manifest()
    doc["targets"]["gpu"] = {"required": False, "status": "failed", "reason": "no CUDA", "variants": []}
    p.write_manifest(doc)
    with pytest.raises(TargetNotFoundError) as ei:
        load_packaged("nope", package=p.name)
    msg = str(ei.value)
    assert "'nope'" in msg and "'fwd'" in msg and "'train'" in msg and "'gpu'" in msg
    with pytest.raises(TargetNotFoundError, match="no CUDA"):
        load_packaged("gpu", package=p.name)


def test_package_without_data(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path))
    shutil.rmtree(p.data)
    with pytest.raises(TargetNotFoundError, match="no _precompiled/manifest.json") as ei:
        load_packaged("fwd", package=p.name)
    assert f"in {p.dir} (is this the installed package? a source checkout on sys.path shadows it)" in str(ei.value)
    with pytest.raises(TargetNotFoundError, match="cannot be imported"):
        load_packaged("fwd", package="pcb_no_such_package_xyz")


# -------------------------------------------------------------------- tampering


def _flip(path: Path, offset: int = 40) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _tamper_source_flip(p):
    _flip(p.data / "fwd.py")
    return IntegrityError, ["fwd.py", "sha256 check failed"]


def _tamper_cache_flip(p):
    _flip(p.data / "fwd.cache", offset=-5)
    return IntegrityError, ["fwd.cache", "sha256 check failed"]


def _tamper_cache_truncated(p):
    c = p.data / "fwd.cache"
    c.write_bytes(c.read_bytes()[:-7])
    return IntegrityError, ["fwd.cache", "size check failed"]


def _tamper_swap_source(p):
    shutil.copy(p.data / "other.py", p.data / "fwd.py")
    return IntegrityError, ["fwd.py", "check failed"]


def _tamper_swap_source_and_manifest(p):
    # a consistent manifest edit: only the code_hash binding can tell
    doc = p.manifest()
    doc["targets"]["fwd"]["variants"][0]["files"]["source"] = doc["targets"]["other"]["variants"][0]["files"]["source"]
    p.write_manifest(doc)
    return IntegrityError, ["other.py", "code_hash check failed"]


def _tamper_cache_of_other(p):
    doc = p.manifest()
    v = doc["targets"]["fwd"]["variants"][0]
    v["files"]["cache"] = doc["targets"]["other"]["variants"][0]["files"]["cache"]
    p.write_manifest(doc)
    return IntegrityError, ["other.cache", "code_hash check failed"]


def _tamper_path(path):
    def tamper(p):
        doc = p.manifest()
        doc["targets"]["fwd"]["variants"][0]["files"]["cache"]["path"] = path
        p.write_manifest(doc)
        return ManifestError, [repr(path), "path traversal"]

    tamper.__name__ = f"_tamper_path_{path}"
    return tamper


def _tamper_newer_manifest(p):
    doc = p.manifest()
    doc["version"] = manifest.VERSION + 1
    p.write_manifest(doc)
    return ManifestError, ["newer", "upgrade precompile-runtime"]


def _tamper_missing_cache(p):
    (p.data / "fwd.cache").unlink()
    return IntegrityError, ["fwd.cache", "existence check failed"]


def _tamper_missing_source(p):
    (p.data / "fwd.py").unlink()
    return IntegrityError, ["fwd.py", "existence check failed"]


def _tamper_blob_traversal(p):
    # a cache re-made with an escaping blob name, manifest updated to match
    source = (p.data / "fwd.py").read_bytes()
    cache = make_pair(source, blobs={"../../escape.so": b"x"})
    (p.data / "fwd.cache").write_bytes(cache)
    doc = p.manifest()
    doc["targets"]["fwd"]["variants"][0]["files"]["cache"] = file_entry("fwd.cache", cache)
    p.write_manifest(doc)
    return IntegrityError, ["'../../escape.so'", "path traversal"]


def _tamper_garbage_cache(p):
    cache = b"PCBCACHE" + b"\xff" * 40
    (p.data / "fwd.cache").write_bytes(cache)
    doc = p.manifest()
    doc["targets"]["fwd"]["variants"][0]["files"]["cache"] = file_entry("fwd.cache", cache)
    p.write_manifest(doc)
    return IntegrityError, ["fwd.cache"]


@pytest.mark.parametrize(
    "tamper",
    [
        _tamper_source_flip,
        _tamper_cache_flip,
        _tamper_cache_truncated,
        _tamper_swap_source,
        _tamper_swap_source_and_manifest,
        _tamper_cache_of_other,
        _tamper_path("../x.cache"),
        _tamper_path("/etc/passwd"),
        _tamper_path("sub/x.cache"),
        _tamper_newer_manifest,
        _tamper_missing_cache,
        _tamper_missing_source,
        _tamper_blob_traversal,
        _tamper_garbage_cache,
    ],
    ids=lambda f: f.__name__.removeprefix("_tamper_"),
)
def test_tampered_artifacts_are_refused_and_never_run(tamper, tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{}], "other": [{}]}))
    # make the other target's source differ in more than the target name
    other = p.data / "other.py"
    assert other.read_bytes() != (p.data / "fwd.py").read_bytes()
    err, fragments = tamper(p)
    with pytest.raises(err) as ei:
        load_packaged("fwd", package=p.name)
    msg = str(ei.value)
    for frag in fragments:
        assert frag in msg, msg
    assert repr(p.name) in msg
    assert p.execs() == 0, "code from a tampered artifact ran"
    assert not (tmp_path / "escape.so").exists()
    kc = tmp_path / "kcache"
    assert not kc.exists() or os.listdir(kc) == []


# ---------------------------------------------------------------------- installs


def test_each_file_is_hashed_once(pkg, monkeypatch):
    """The cache file's sha256 (checked against the manifest) covers its header and
    every blob: the blobs' own sha256s are not computed again."""
    hashed = []
    real = envelope.sha256_hex
    monkeypatch.setattr(envelope, "sha256_hex", lambda data: hashed.append(bytes(data)) or real(data))
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)
    assert sorted(hashed) == sorted([(pkg.data / "fwd.py").read_bytes(), (pkg.data / "fwd.cache").read_bytes()])


def test_read_only_package_dir(pkg, tmp_path):
    before = sorted(str(q) for q in pkg.root.rglob("*"))
    modes = []
    for q in [pkg.root, *pkg.root.rglob("*")]:
        modes.append((q, q.stat().st_mode))
        q.chmod(q.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)
        after = sorted(str(q) for q in pkg.root.rglob("*"))
        # nothing written inside the package (no __pycache__ for the pair either)
        assert [a for a in after if "__pycache__" not in a] == before
        assert not list(pkg.data.rglob("__pycache__"))
    finally:
        for q, mode in reversed(modes):
            q.chmod(mode)


def test_zip_imported_package(tmp_path, monkeypatch):
    p = make_package(tmp_path)
    zpath = tmp_path / "site.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        for f in sorted(p.dir.rglob("*")):
            if f.is_file():
                zf.write(f, f.relative_to(p.root).as_posix())
    shutil.rmtree(p.root)
    monkeypatch.syspath_prepend(str(zpath))
    assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)
    assert ".zip" in sys.modules[p.name].__spec__.origin


def test_cache_root_not_writable_still_loads(pkg, tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(blocker / "cache"))
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)


def test_corrupt_cache_entry_is_replaced(pkg, tmp_path):
    code_hash = pkg.manifest()["targets"]["fwd"]["variants"][0]["code_hash"]
    entry = tmp_path / "kcache" / code_hash
    (entry / "sub").mkdir(parents=True)
    (entry / "sub" / "k.bin").write_bytes(b"half-written")
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)
    assert (entry / "sub" / "k.bin").read_bytes() == BLOB
    assert sorted(os.listdir(tmp_path / "kcache")) == [code_hash]


def test_full_disk_while_unpacking_leaves_no_entry(pkg, tmp_path, monkeypatch):
    import errno

    import precompile_runtime.kernel_cache as kernel_cache

    def full(path, data):
        with open(path, "wb") as f:
            f.write(data[: len(data) // 2])  # a part made it to disk, then the disk was full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(kernel_cache, "_write_file", full)
    with pytest.raises(PrecompileLoadError, match="No space left on device") as ei:
        load_packaged("fwd", package=pkg.name)
    assert repr(pkg.name) in str(ei.value) and "PRECOMPILE_CACHE_DIR" in str(ei.value)
    assert os.listdir(tmp_path / "kcache") == []  # no entry, no temp dir left
    monkeypatch.undo()
    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(tmp_path / "kcache"))
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)  # failures are not cached


def test_valid_cache_entry_is_reused(pkg, tmp_path):
    code_hash = pkg.manifest()["targets"]["fwd"]["variants"][0]["code_hash"]
    entry = tmp_path / "kcache" / code_hash
    (entry / "sub").mkdir(parents=True)
    (entry / "sub" / "k.bin").write_bytes(BLOB)
    ino = (entry / "sub" / "k.bin").stat().st_ino
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)
    assert (entry / "sub" / "k.bin").stat().st_ino == ino


CHILD = """
import sys, time
sys.path[:0] = [{runtime!r}, {site!r}]
import precompile_runtime
start = float(sys.argv[1])
while time.time() < start:
    pass
print(precompile_runtime.load_packaged("fwd", package={name!r})()[0])
"""


def test_processes_racing_on_empty_cache(pkg, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(runtime=RUNTIME, site=str(pkg.root), name=pkg.name))
    env = dict(os.environ, PRECOMPILE_CACHE_DIR=str(tmp_path / "kcache"))
    start = time.time() + 2.0
    procs = [
        subprocess.Popen([sys.executable, str(script), str(start)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()
        assert out.decode().strip() == "kernels"
    code_hash = pkg.manifest()["targets"]["fwd"]["variants"][0]["code_hash"]
    assert sorted(os.listdir(tmp_path / "kcache")) == [code_hash]
    assert (tmp_path / "kcache" / code_hash / "sub" / "k.bin").read_bytes() == BLOB


def test_threads_load_once(pkg):
    n = 32
    barrier = threading.Barrier(n)
    results, errors = [None] * n, []

    def work(i):
        try:
            barrier.wait()
            results[i] = load_packaged("fwd", package=pkg.name)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pkg.execs() == 1
    assert all(r is results[0] for r in results)
    assert results[0]() == ("kernels", BLOB)


# --------------------------------------------------------------- package default


def test_package_defaults_to_callers_top_level_package(tmp_path, monkeypatch):
    p = make_package(tmp_path)
    sub = p.dir / "models"
    sub.mkdir()
    (sub / "__init__.py").write_text("")
    (sub / "api.py").write_text(
        "from precompile_runtime import load_packaged\n\ndef get():\n    return load_packaged('fwd')\n"
    )
    on_path(monkeypatch, p)
    import importlib

    api = importlib.import_module(f"{p.name}.models.api")
    assert api.get()() == ("kernels", BLOB)


def test_main_script_without_package_is_an_error(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {RUNTIME!r})
        import precompile_runtime
        try:
            precompile_runtime.load_packaged("fwd")
        except precompile_runtime.PrecompileLoadError as e:
            print("ERR", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("ERR") and "package=" in out


def test_import_does_not_import_torch():
    code = (
        f"import sys; sys.path.insert(0, {RUNTIME!r}); import precompile_runtime; "
        "print('torch' in sys.modules, precompile_runtime.__version__)"
    )
    for extra in ({}, {"PRECOMPILE_NO_COMPILE": "1"}):
        env = dict(os.environ, **extra)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        assert out.stdout.split() == ["False", __import__("precompile_runtime").__version__]


def test_errors_are_precompile_load_errors():
    for cls in (HostMismatchError, IntegrityError, ManifestError, TargetNotFoundError):
        assert issubclass(cls, PrecompileLoadError)


# ------------------------------------------------------ boolean options and env vars


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_strict_env_accepts_true_spellings(value, tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"platform": "plan9"}]}))
    monkeypatch.setenv("PRECOMPILE_STRICT", value)
    with pytest.raises(HostMismatchError):
        load_packaged("fwd", package=p.name)


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF", ""])
def test_strict_env_accepts_false_spellings(value, tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"platform": "plan9"}]}))
    monkeypatch.setenv("PRECOMPILE_STRICT", value)
    with pytest.warns(HostMismatchWarning):
        assert load_packaged("fwd", package=p.name)() == ("fallback", None)


@pytest.mark.parametrize("var", ["PRECOMPILE_STRICT", "PRECOMPILE_NO_COMPILE"])
def test_env_flag_other_values_are_an_error(var, pkg, monkeypatch):
    from precompile_runtime import LoadOptionError, PrecompileLoadError

    monkeypatch.setenv(var, "enabled")
    with pytest.raises(LoadOptionError, match=f"{var}='enabled' is not a boolean: use 1, true, yes or on") as e:
        load_packaged("fwd", package=pkg.name)
    assert isinstance(e.value, PrecompileLoadError) and isinstance(e.value, ValueError)
    assert pkg.execs() == 0


def test_guard_env_accepts_true_spellings(monkeypatch):
    from precompile_runtime import guard_active

    for value, on in (("yes", True), ("On", True), ("TRUE", True), ("1", True),
                      ("no", False), ("0", False), ("", False)):
        monkeypatch.setenv("PRECOMPILE_NO_COMPILE", value)
        assert guard_active() is on, value


@pytest.mark.parametrize("option, value", [("strict", "false"), ("strict", 1), ("strict", "yes"),
                                           ("cuda_graphs", 1), ("cuda_graphs", 0), ("cuda_graphs", "yes")])
def test_strict_and_cuda_graphs_take_bools_only(option, value, pkg):
    from precompile_runtime import LoadOptionError

    with pytest.raises(LoadOptionError, match=rf"{option}={value!r}\): use None, True or False \({option} takes a bool; this is {type(value).__name__}\)"):
        load_packaged("fwd", package=pkg.name, **{option: value})
    assert pkg.execs() == 0


def test_a_numpy_bool_is_named_as_such(pkg):
    """strict=numpy.True_ is refused like any non-bool, and the message names its type
    so that it does not read 'takes a bool; this is bool'."""
    import numpy as np

    from precompile_runtime import LoadOptionError

    with pytest.raises(LoadOptionError, match=r"strict takes a bool; this is numpy\.bool"):
        load_packaged("fwd", package=pkg.name, strict=np.True_)
