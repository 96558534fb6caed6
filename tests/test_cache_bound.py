"""The capture cache is bounded: `cache-max-size`, least recently used
entries evicted after each build with their `.lock` files (never this build's, never one
another build holds), and its size in the build summary."""

from __future__ import annotations

import os
import time
from pathlib import Path

import filelock
import pytest
from _build_helpers import build, make_project, target_toml

from precompile_build.builder import cache_bound, capture_cache
from precompile_build.config.settings import settings_from_table
from precompile_build.errors import ConfigError


def _names(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name != capture_cache.TAG_NAME)


def _entry(root: Path, n: int, size: int, age: float) -> str:
    key = f"{n:x}" * 64
    (root / key).mkdir(parents=True)
    (root / key / "t.cache").write_bytes(b"x" * size)
    (root / f"{key}.lock").write_bytes(b"")
    then = time.time() - age
    os.utime(root / key, (then, then))
    return key


def test_least_recently_used_entries_go_first_with_their_locks(tmp_path):
    root = tmp_path / "cache"
    k = [_entry(root, i + 1, 1000, age=100 - 10 * i) for i in range(4)]  # k[0] the oldest
    line = cache_bound.bound(root, 2500, keep={k[0]})  # this build used the oldest one
    assert _names(root) == sorted([k[0], f"{k[0]}.lock", k[3], f"{k[3]}.lock"])
    assert line == (
        f"precompile: capture cache {root}: 2.0 KiB in 2 entries "
        "(at most 2.4 KiB; removed 2 least recently used, 2.0 KiB)"
    )


def test_a_reuse_makes_an_entry_the_most_recently_used(tmp_path):
    root = tmp_path / "cache"
    old, new = _entry(root, 1, 1000, age=100), _entry(root, 2, 1000, age=50)
    cache_bound.used(root, old)
    cache_bound.bound(root, 1500, keep=())
    assert (root / old).exists() and not (root / new).exists()


def test_an_entry_another_build_holds_is_kept(tmp_path):
    root = tmp_path / "cache"
    held, other = _entry(root, 1, 1000, age=100), _entry(root, 2, 1000, age=50)
    lock = filelock.FileLock(str(root / f"{held}.lock"))
    lock.acquire()
    try:
        line = cache_bound.bound(root, 1500, keep=())
    finally:
        lock.release()
    assert (
        (root / held).exists()
        and not (root / other).exists()
        and not (root / f"{other}.lock").exists()
    )
    assert "removed 1 least recently used" in line


def test_locks_of_entries_that_are_gone_are_removed(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    gone, fresh = "a" * 64, "b" * 64
    for key in (gone, fresh):
        (root / f"{key}.lock").write_bytes(b"")
    os.utime(root / f"{gone}.lock", (time.time() - 3600,) * 2)  # a capture that failed an hour ago
    line = cache_bound.bound(root, None, keep=())
    assert _names(root) == [f"{fresh}.lock"]  # one a build has just made: kept
    assert line == f"precompile: capture cache {root}: 0 B in 0 entries (no size bound)"


@pytest.mark.parametrize(
    "value, want",
    [
        ("10GiB", 10 * 2**30),
        ("512MB", 512 * 10**6),
        ("1.5 GB", 1_500_000_000),
        (4096, 4096),
        ("none", None),
        ("None", None),
    ],
)
def test_cache_max_size_values(tmp_path, value, want):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "cap.py").write_text("")
    table = {"package": "pkg", "targets": {"a": {"script": "cap.py"}}, "cache-max-size": value}
    assert settings_from_table(tmp_path, table, environ={}).cache_max_size == want
    del table["cache-max-size"]
    assert settings_from_table(tmp_path, table, environ={}).cache_max_size == 10 * 2**30
    got = settings_from_table(
        tmp_path, table, environ={"PRECOMPILE_CACHE_MAX_SIZE": "2GiB"}
    ).cache_max_size
    assert got == 2 * 2**30


@pytest.mark.parametrize("value", ["10XB", "ten", 0, -1, True, 1.5, ""])
def test_a_bad_cache_max_size_names_the_key(tmp_path, value):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "cap.py").write_text("")
    table = {"package": "pkg", "targets": {"a": {"script": "cap.py"}}, "cache-max-size": value}
    with pytest.raises(
        ConfigError,
        match=r"`tool.precompile.cache-max-size` must be a size \(\"10GiB\", \"512MB\", "
        r"bytes as a positive integer\) or \"none\" \(no bound\), not ",
    ):
        settings_from_table(tmp_path, table, environ={})


@pytest.mark.usefixtures("build_env")
def test_the_build_bounds_the_cache_and_says_its_size(tmp_path, monkeypatch, capfd):
    monkeypatch.delenv("PRECOMPILE_CACHE_MAX_SIZE", raising=False)
    root = make_project(tmp_path, target_toml(mode="ok"))
    build(root, monkeypatch, out=tmp_path / "d1")
    err = capfd.readouterr().err
    cache = capture_cache.cache_root(
        settings_from_table(
            root,
            {"package": "simplepkg", "targets": {"double": {"script": "capture/pair.py"}}},
            environ=dict(os.environ),
        )
    )
    (first,) = [p.name for p in cache.iterdir() if len(p.name) == 64]
    assert f"precompile: capture cache {cache}: " in err and "in 1 entry (at most 10.0 GiB)" in err
    (root / "capture" / "pair.py").write_text(
        (root / "capture" / "pair.py").read_text() + "\n# edited\n"
    )
    build(
        root, monkeypatch, out=tmp_path / "d2", config_settings={"precompile.cache-max-size": "1"}
    )
    err = capfd.readouterr().err
    (second,) = [
        p.name for p in cache.iterdir() if len(p.name) == 64
    ]  # the edit's entry: this build's, kept
    assert second != first and not (cache / f"{first}.lock").exists()
    assert "in 1 entry (at most 1 B; removed 1 least recently used, " in err, err
