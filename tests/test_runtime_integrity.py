"""precompile_runtime.load_packaged against tampered artifacts and on real installs
(read-only, zipped, a full disk, racing processes and threads), with the fake packages
of tests/_fake_packages.py: nothing of a tampered pair runs, no half-written kernel
cache entry stays."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from _fake_packages import (
    BLOB,
    RUNTIME,
    file_entry,
    make_package,
    make_pair,
    on_path,
)

from precompile_runtime import (
    IntegrityError,
    ManifestError,
    PrecompileLoadError,
    envelope,
    load_packaged,
    manifest,
)

pytestmark = pytest.mark.usefixtures("runtime_env")


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
    doc["targets"]["fwd"]["variants"][0]["files"]["source"] = doc["targets"]["other"]["variants"][
        0
    ]["files"]["source"]
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
    monkeypatch.setattr(
        envelope, "sha256_hex", lambda data: hashed.append(bytes(data)) or real(data)
    )
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)
    assert sorted(hashed) == sorted(
        [(pkg.data / "fwd.py").read_bytes(), (pkg.data / "fwd.cache").read_bytes()]
    )


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


def test_a_writable_package_without_bytecode_is_not_written_either(pkg, monkeypatch):
    # an install that did not byte-compile (uv's default, pip --no-compile): the load
    # compiles the source half in memory and leaves the installed package as it was,
    # even where Python's import would write a __pycache__ (design.md: the runtime never
    # writes inside the installed package)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    before = {
        q: q.read_bytes() for q in pkg.data.rglob("*")
    }  # the package's own __init__ is import's
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)
    assert {q: q.read_bytes() for q in pkg.data.rglob("*")} == before and pkg.execs() == 1


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


def test_corrupt_cache_entry_is_never_loaded(pkg, tmp_path):
    # a half-written entry of an earlier runtime (which shared one folder per code_hash
    # between processes): the kernels load from this process's own folder, written from
    # the verified bytes, so no such entry is read, reused or run
    code_hash = pkg.manifest()["targets"]["fwd"]["variants"][0]["code_hash"]
    entry = tmp_path / "kcache" / code_hash
    (entry / "sub").mkdir(parents=True)
    (entry / "sub" / "k.bin").write_bytes(b"half-written")
    assert load_packaged("fwd", package=pkg.name)() == ("kernels", BLOB)
    runs = [n for n in os.listdir(tmp_path / "kcache") if n != code_hash]
    assert len(runs) == 1 and runs[0].startswith(".run-")
    assert (tmp_path / "kcache" / runs[0] / code_hash / "sub" / "k.bin").read_bytes() == BLOB


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
        subprocess.Popen(
            [sys.executable, str(script), str(start)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()
        assert out.decode().strip() == "kernels"
    assert os.listdir(tmp_path / "kcache") == []  # each process's own folder, removed at its exit


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
