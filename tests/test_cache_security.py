"""Nobody else's bytes run: a kernel cache directory, or an entry in it,
that another user could change is never used, and the kernels load from bytes this
process wrote itself from the wheel's verified cache, so a file swapped after the
check is never loaded. Each case: the safe path, a message, the call served right.

The tests run as root (the project's CI and dev containers), where ``os.chown`` makes
folders of another uid; where it cannot, those cases are skipped with the reason.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
from _fake_packages import BLOB, RUNTIME, make_package, on_path

from precompile_runtime import (
    CacheSecurityWarning,
    PrecompileLoadError,
    kernel_cache,
    load_packaged,
    loader,
)

pytestmark = pytest.mark.usefixtures("runtime_env")

EVIL = b"\x7fELF someone else's kernel" * 10
OTHER_UID = 12345


def _chown_other(path: Path) -> None:
    """``path`` owned by uid 12345 (or the test is skipped: only root can give a file away)."""
    try:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    except PermissionError:
        pytest.skip(f"cannot chown {path} to another uid as uid {os.geteuid()} (needs root)")


def _code_hash(p) -> str:
    return p.manifest()["targets"]["fwd"]["variants"][0]["code_hash"]


def _plant(entry: Path, data: bytes) -> Path:
    """An entry in the pre-#56 layout, ``<cache dir>/<code_hash>/sub/k.bin``."""
    (entry / "sub").mkdir(parents=True)
    (entry / "sub" / "k.bin").write_bytes(data)
    return entry / "sub" / "k.bin"


@pytest.fixture
def served_from(monkeypatch):
    """The folders the loads of this test took their kernels from."""
    dirs: list[str] = []
    real = loader._unpack

    def record(*args):
        dirs.append(real(*args))
        return dirs[-1]

    monkeypatch.setattr(loader, "_unpack", record)
    return dirs


def _assert_private(folder: str) -> None:
    """Only this process's uid can change ``folder``: it and the files in it are its
    own, and nobody else may write there."""
    from precompile_runtime import _safe_path

    assert _safe_path.problem(folder) is None
    for base, dirs, files in os.walk(folder):
        for name in dirs + files:
            st = os.lstat(os.path.join(base, name))
            assert st.st_uid == os.geteuid() and not st.st_mode & 0o077, (name, oct(st.st_mode))


def _load_warns(p, *fragments: str) -> str:
    with pytest.warns(CacheSecurityWarning) as rec:
        assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)  # the call served right
    msgs = [str(w.message) for w in rec if issubclass(w.category, CacheSecurityWarning)]
    assert len(msgs) == 1, msgs
    for frag in fragments:
        assert frag in msgs[0], msgs[0]
    assert repr(p.name) in msgs[0]
    return msgs[0]


def _load_quietly(p) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheSecurityWarning)
        assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)


# ------------------------------------------------------------------ the cache root


def test_a_cache_root_writable_by_others_is_not_used(tmp_path, monkeypatch, served_from):
    p = on_path(monkeypatch, make_package(tmp_path))
    root = tmp_path / "kcache"
    root.mkdir(mode=0o777)
    root.chmod(0o777)
    planted = _plant(root / _code_hash(p), BLOB)  # the right bytes, planted: not used either
    _load_warns(
        p,
        f"the kernel cache directory {root} is not used",
        "writable by its group and others (mode 0o777)",
        f"run `chmod go-w {root}`",
        "private temp directory",
        "PRECOMPILE_CACHE_DIR",
    )
    assert not served_from[0].startswith(str(root))
    _assert_private(served_from[0])
    assert (
        sorted(os.listdir(root)) == [_code_hash(p)] and planted.read_bytes() == BLOB
    )  # nothing written there


def test_a_cache_root_owned_by_another_uid_is_not_used(tmp_path, monkeypatch, served_from):
    p = on_path(monkeypatch, make_package(tmp_path))
    root = tmp_path / "kcache"
    root.mkdir(mode=0o755)
    _plant(root / _code_hash(p), EVIL)
    _chown_other(root)
    _load_warns(
        p,
        f"{root} is owned by uid {OTHER_UID}, not by you (uid {os.geteuid()})",
        "or set PRECOMPILE_CACHE_DIR to a directory only you can write",
    )
    assert not served_from[0].startswith(str(root))
    assert sorted(os.listdir(root)) == [_code_hash(p)]


def test_a_folder_above_the_root_writable_by_others_is_refused_unless_sticky(
    tmp_path, monkeypatch, served_from
):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others may rename what it holds: the cache dir itself
    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(shared / "kcache"))
    p = on_path(monkeypatch, make_package(tmp_path))
    _load_warns(
        p,
        f"{shared}, a folder above {shared / 'kcache'}, is writable by its group and others (mode 0o777) "
        "without the sticky bit",
        f"`chmod go-w {shared}`",
    )
    assert not served_from[0].startswith(str(shared))
    shared.chmod(0o1777)  # /tmp's mode: only an entry's owner may rename it
    q = on_path(monkeypatch, make_package(tmp_path / "q"))
    _load_quietly(q)
    assert served_from[1].startswith(str(shared / "kcache" / kernel_cache.RUN_PREFIX))


def test_a_symlinked_root_is_used_where_it_points_when_that_is_trusted(
    tmp_path, monkeypatch, served_from
):
    real = tmp_path / "real-cache"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(tmp_path / "link"))
    p = on_path(monkeypatch, make_package(tmp_path))
    _load_quietly(p)
    assert served_from[0].startswith(str(real / kernel_cache.RUN_PREFIX))


# ------------------------------------------------------------------ entries


@pytest.mark.parametrize("how", ["owned by another uid", "writable by others"])
def test_a_planted_entry_is_never_loaded(tmp_path, monkeypatch, served_from, how):
    p = on_path(monkeypatch, make_package(tmp_path))
    entry = tmp_path / "kcache" / _code_hash(p)
    planted = _plant(entry, EVIL)
    if how == "owned by another uid":
        for q in (planted, planted.parent, entry):
            _chown_other(q)
        fragments = (
            f"the kernel cache entry {entry} is not used",
            f"owned by uid {OTHER_UID}",
            f"`rm -rf {entry}`",
        )
    else:
        entry.chmod(0o777)
        fragments = (
            f"the kernel cache entry {entry} is not used",
            "writable by its group and others (mode 0o777)",
        )
    _load_warns(p, *fragments, "loads kernels only from the private folder of this process")
    assert served_from[0].startswith(str(tmp_path / "kcache" / kernel_cache.RUN_PREFIX))
    _assert_private(served_from[0])
    assert planted.read_bytes() == EVIL  # left for its owner to look at


def test_a_symlinked_entry_pointing_outside_the_root_is_never_loaded(
    tmp_path, monkeypatch, served_from
):
    p = on_path(monkeypatch, make_package(tmp_path))
    outside = tmp_path / "outside"
    planted = _plant(outside, BLOB)
    (tmp_path / "kcache").mkdir(mode=0o700)
    entry = tmp_path / "kcache" / _code_hash(p)
    entry.symlink_to(outside)
    _load_warns(
        p,
        f"the kernel cache entry {entry} is not used",
        f"is a symbolic link (to {outside})",
        f"`rm {entry}`",
    )
    assert (
        not served_from[0].startswith(str(outside))
        and os.path.realpath(served_from[0]) == served_from[0]
    )
    _assert_private(served_from[0])
    assert planted.read_bytes() == BLOB and sorted(os.listdir(outside)) == [
        "sub"
    ]  # nothing written there


def test_a_good_entry_of_an_older_runtime_is_left_alone_quietly(tmp_path, monkeypatch, served_from):
    p = on_path(monkeypatch, make_package(tmp_path))
    planted = _plant(tmp_path / "kcache" / _code_hash(p), b"half-written")
    ino = planted.stat().st_ino
    _load_quietly(p)
    assert planted.stat().st_ino == ino and planted.read_bytes() == b"half-written"
    assert served_from[0].startswith(str(tmp_path / "kcache" / kernel_cache.RUN_PREFIX))


# ------------------------------------------------------------ the bytes loaded


@pytest.mark.parametrize("swap", ["replaced", "written in place"])
def test_a_swap_between_verification_and_load_is_never_loaded(tmp_path, monkeypatch, swap):
    """The seam: after the runtime checked what it will load (inside ``unpack``) and
    before the pair's ``load(kernel_dir)`` maps it. An entry with the right bytes sits
    in the cache directory (what an earlier runtime verified, then loaded from), and it
    is swapped at that moment, as is the package's cache file: neither is loaded."""
    from _fake_packages import make_pair, make_source

    p = on_path(monkeypatch, make_package(tmp_path))
    planted = _plant(tmp_path / "kcache" / _code_hash(p), BLOB)
    evil_cache = make_pair(make_source(p.marker, "fwd"), blobs={"sub/k.bin": EVIL})
    real = loader._unpack

    def unpack_then_swap(*args):
        kernel_dir = real(*args)
        for target, data in ((planted, EVIL), (p.data / "fwd.cache", evil_cache)):
            if swap == "replaced":  # a new file renamed over it
                other = target.with_name("evil.tmp")
                other.write_bytes(data)
                os.replace(other, target)
            else:
                target.write_bytes(data)
        return kernel_dir

    monkeypatch.setattr(loader, "_unpack", unpack_then_swap)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheSecurityWarning)
        fn = load_packaged("fwd", package=p.name)
    assert planted.read_bytes() == EVIL  # the swap happened
    assert fn() == ("kernels", BLOB)  # the verified bytes ran


def test_the_entry_s_swap_never_reaches_the_private_folder(tmp_path, monkeypatch, served_from):
    """What the pair loads is a file this process wrote from the verified bytes, no
    link to anything in the cache directory: changing an old entry in place (as root,
    or its owner) changes nothing loaded."""
    p = on_path(monkeypatch, make_package(tmp_path))
    planted = _plant(tmp_path / "kcache" / _code_hash(p), BLOB)
    assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)
    loaded = Path(served_from[0]) / "sub" / "k.bin"
    assert loaded.stat().st_ino != planted.stat().st_ino and loaded.stat().st_nlink == 1
    planted.write_bytes(EVIL)
    assert loaded.read_bytes() == BLOB


CHILD = """
import sys
sys.path[:0] = [{runtime!r}, {site!r}]
import precompile_runtime
from precompile_runtime import loader
real = loader._unpack
seen = []
loader._unpack = lambda *a: seen.append(real(*a)) or seen[-1]
print(precompile_runtime.load_packaged("fwd", package={name!r})()[0])
print(seen[0])
"""


def test_a_process_s_folder_is_its_own_and_gone_when_it_ends(tmp_path):
    p = make_package(tmp_path)
    kc = tmp_path / "kcache"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(runtime=RUNTIME, site=str(p.root), name=p.name))
    env = dict(os.environ, PRECOMPILE_CACHE_DIR=str(kc))
    out = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    served, folder = out.stdout.split()
    assert served == "kernels"
    assert folder.startswith(str(kc / kernel_cache.RUN_PREFIX)) and folder.endswith(_code_hash(p))
    assert os.listdir(kc) == []  # removed at exit
    assert stat.S_IMODE(kc.stat().st_mode) == 0o700


def test_a_crashed_process_s_folder_is_removed_by_the_next_load(tmp_path, monkeypatch):
    import fcntl

    kc = tmp_path / "kcache"
    dead = kc / f"{kernel_cache.RUN_PREFIX}dead0001"
    live = kc / f"{kernel_cache.RUN_PREFIX}live0001"
    for d in (dead, live):
        (d / "x").mkdir(parents=True, mode=0o700)
        (d / "x" / "k.so").write_bytes(b"left behind")
    fd = os.open(live, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process, alive, holds its folder
    try:
        p = on_path(monkeypatch, make_package(tmp_path))
        # a fresh process's first load sweeps (this process already made its folder)
        monkeypatch.setattr(kernel_cache, "_runs", {})
        assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)
        assert not dead.exists() and (live / "x" / "k.so").exists()
    finally:
        os.close(fd)


def test_an_unsafe_temp_folder_is_refused_with_the_fix(tmp_path, monkeypatch):
    """The cache root cannot be used and the temp directory could be changed by
    another user (TMPDIR on a folder writable by all, no sticky bit): the load refuses
    rather than unpack there, and says what to set."""
    p = on_path(monkeypatch, make_package(tmp_path))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(blocker / "cache"))
    open_tmp = tmp_path / "open-tmp"
    open_tmp.mkdir()
    open_tmp.chmod(0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(open_tmp))
    with pytest.raises(PrecompileLoadError) as ei:
        load_packaged("fwd", package=p.name)
    msg = str(ei.value)
    assert f"the private temp directory {open_tmp}/precompile-runtime-" in msg
    assert f"{open_tmp}, a folder above" in msg and "without the sticky bit" in msg
    assert "set TMPDIR, or PRECOMPILE_CACHE_DIR, to a directory only you can write" in msg
    assert p.execs() == 0  # nothing of the pair ran


# ------------------------------------------------- other files read after the check


def test_a_pyc_in_a_shared_pycache_prefix_is_not_run(tmp_path, monkeypatch):
    """``PYTHONPYCACHEPREFIX`` on a folder others can write: a pyc planted there for the
    pair's source half (its header names the verified source's hash, its code is
    someone else's) is not used; the verified source is compiled instead."""
    import importlib.util
    from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]

    p = on_path(monkeypatch, make_package(tmp_path))
    prefix = tmp_path / "shared-pycache"
    prefix.mkdir()
    prefix.chmod(0o777)
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    source = (p.data / "fwd.py").read_bytes()
    evil = source.replace(b'return lambda: ("kernels", data)', b'return lambda: ("planted", data)')
    assert evil != source
    pyc = Path(importlib.util.cache_from_source(str(p.data / "fwd.py")))
    assert str(pyc).startswith(str(prefix))
    pyc.parent.mkdir(parents=True)
    pyc.write_bytes(
        _code_to_hash_pyc(compile(evil, "fwd.py", "exec"), importlib.util.source_hash(source))
    )
    _chown_other(pyc)
    assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)


def test_a_forked_child_s_exit_leaves_the_parent_s_folder(tmp_path, monkeypatch, served_from):
    """A child forked after the load runs the exit handlers when it ends normally:
    the folder is its parent's (whose CUDA kernels load from it lazily), so it stays."""
    p = on_path(monkeypatch, make_package(tmp_path))
    assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)
    pid = os.fork()
    if pid == 0:  # the child: what atexit runs at a normal exit, then leave at once
        try:
            kernel_cache._remove_private_dirs()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    assert (Path(served_from[0]) / "sub" / "k.bin").read_bytes() == BLOB
