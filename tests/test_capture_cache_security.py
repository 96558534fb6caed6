"""The build's capture cache is code copied into wheels: a cache directory
that another user could change is not used (the build line says why), and an entry
written by another user, writable by others or a symlink is never reused (the capture
runs again and replaces it). Each case: the safe path, a message, a right wheel.

The tests run as root, where ``os.chown`` makes files of another uid; where it cannot,
those cases are skipped with the reason.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from _build_helpers import build, check_record, make_project

from precompile_build.builder import capture_cache

pytestmark = pytest.mark.usefixtures("build_env")

OTHER_UID = 12345


def _chown_other(path: Path) -> None:
    try:
        os.chown(path, OTHER_UID, OTHER_UID, follow_symlinks=False)
    except PermissionError:
        pytest.skip(f"cannot chown {path} to another uid as uid {os.geteuid()} (needs root)")


def _cache_dir() -> Path:
    return Path(os.environ["PRECOMPILE_BUILD_CACHE_DIR"])


def _built(root, monkeypatch, capfd, tag):
    """Build; return (wheel, whether the capture script ran, stderr)."""
    mark = root.parent / f"ran-{tag}"
    monkeypatch.setenv("FIXTURE_MARK", str(mark))
    whl = build(root, monkeypatch, out=root.parent / f"dist-{tag}")
    return whl, mark.exists(), capfd.readouterr().err


def _first_build(tmp_path, monkeypatch, capfd):
    root = make_project(tmp_path)
    _, ran, _ = _built(root, monkeypatch, capfd, "1")
    assert ran
    (entry,) = [p for p in _cache_dir().iterdir() if p.is_dir() and len(p.name) == 64]
    return root, entry


@pytest.mark.parametrize(
    "how", ["writable by others", "owned by another uid", "below a folder others can write"]
)
def test_an_untrusted_capture_cache_is_not_used(tmp_path, monkeypatch, capfd, how):
    root, entry = _first_build(tmp_path, monkeypatch, capfd)
    cache = _cache_dir()
    if how == "writable by others":
        cache.chmod(0o777)
        said = [
            f"{cache} is writable by its group and others (mode 0o777)",
            f"`chmod go-w {cache}`",
        ]
    elif how == "owned by another uid":
        _chown_other(cache)
        said = [f"{cache} is owned by uid {OTHER_UID}, not by you (uid {os.geteuid()})"]
    else:
        moved = tmp_path / "shared" / "pcache"
        moved.parent.mkdir()
        moved.parent.chmod(0o777)
        cache.rename(moved)
        monkeypatch.setenv("PRECOMPILE_BUILD_CACHE_DIR", str(moved))
        cache, entry = moved, moved / entry.name
        said = [
            f"{moved.parent}, a folder above {moved}, is writable by its group and others "
            "(mode 0o777) without the sticky bit"
        ]
    before = sorted(p.name for p in cache.iterdir())
    whl, ran, err = _built(root, monkeypatch, capfd, "2")
    assert ran, "the entry of an untrusted cache was reused"
    line = [ln for ln in err.splitlines() if "capture cache unavailable for this build" in ln]
    assert line, err
    assert f"the capture cache directory {cache} is not used" in line[0]
    assert "whoever can change it can put code into every wheel built from it" in line[0]
    assert "PRECOMPILE_BUILD_CACHE_DIR" in line[0] and "docs/security.md" in line[0]
    for frag in said:
        assert frag in line[0], line[0]
    assert "captured (why: cache off: the capture cache directory" in err
    assert sorted(p.name for p in cache.iterdir()) == before  # nothing written there
    check_record(whl)


def _entry_owned_by_other(entry: Path) -> str:
    for p in (entry, *entry.iterdir()):
        _chown_other(p)
    return f"{entry} is owned by uid {OTHER_UID}, not by you"


def _entry_file_writable(entry: Path) -> str:
    (entry / "double.cache").chmod(0o666)
    return f"{entry / 'double.cache'} is writable by its group and others (mode 0o666)"


def _entry_symlink_outside(entry: Path) -> str:
    outside = entry.parent.parent / "outside-entry"
    entry.rename(outside)  # the right bytes, but outside the cache: still not used
    entry.symlink_to(outside)
    return f"{entry} is a symbolic link (to {outside})"


@pytest.mark.parametrize(
    "plant", [_entry_owned_by_other, _entry_file_writable, _entry_symlink_outside]
)
def test_an_untrusted_entry_is_never_reused(tmp_path, monkeypatch, capfd, plant):
    root, entry = _first_build(tmp_path, monkeypatch, capfd)
    said = plant(entry)
    whl, ran, err = _built(root, monkeypatch, capfd, "2")
    assert ran, "an untrusted entry was reused"
    assert f"captured (why: entry not trusted: {said}" in err, err
    check_record(whl)
    # the new capture's entry replaced it, is this user's own, and is reused next time
    st = os.lstat(entry)
    assert st.st_uid == os.geteuid() and not os.path.islink(entry)
    assert not _built(root, monkeypatch, capfd, "3")[1]


def test_a_new_cache_directory_is_private(tmp_path):
    """Each folder the build creates for the cache is mode 0o700 (a umask of 002 would
    otherwise leave it writable by the group, which the next build refuses)."""
    old = os.umask(0o002)
    try:
        capture_cache.check_root(tmp_path / "a" / "b" / "cache")
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "cache"):
        assert d.stat().st_mode & 0o777 == 0o700
