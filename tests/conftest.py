"""Fixtures shared by the test modules (pytest finds them here: no import needed).

A module opts in with ``pytestmark = pytest.mark.usefixtures("build_env")`` (builds of
the fixture projects) or ``"runtime_env"`` (loads by the runtime)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="session")
def host_fp_json() -> str:
    """This host's CPU fingerprint as JSON: what the fixture capture scripts record
    (``FIXTURE_FINGERPRINT``), so that they need no torch."""
    from precompile_runtime.fingerprint import host_fingerprint

    return json.dumps(host_fingerprint("cpu"))


@pytest.fixture
def build_env(monkeypatch, host_fp_json, tmp_path_factory):
    """No override of the developer's environment reaches a build; the fixture scripts'
    fingerprint; a capture cache of the test's own, never the user's."""
    for var in ("PRECOMPILE_SKIP", "PRECOMPILE_TARGETS", "PRECOMPILE_BUILD_STRICT",
                "PRECOMPILE_VERBOSE", "PRECOMPILE_TORCH_PIN", "SOURCE_DATE_EPOCH",
                "PRECOMPILE_CACHE", "PRECOMPILE_JOBS", "PRECOMPILE_DISTRIBUTED"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FIXTURE_FINGERPRINT", host_fp_json)
    monkeypatch.setenv("PRECOMPILE_BUILD_CACHE_DIR", str(tmp_path_factory.mktemp("pcache")))


@pytest.fixture
def runtime_env(monkeypatch, tmp_path):
    """Loads in strict mode or under the serving guard only where a test asks, on this
    host's own CPU flags, unpacking kernels into the test's own cache directory."""
    from precompile_runtime import fingerprint

    for var in ("PRECOMPILE_STRICT", "PRECOMPILE_NO_COMPILE", fingerprint.CPUINFO_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(tmp_path / "kcache"))


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """A fake installed package (tests/_fake_packages.py) with one target ``fwd`` matching
    this host, importable (its folder on sys.path) for the test."""
    from _fake_packages import make_package

    p = make_package(tmp_path)
    monkeypatch.syspath_prepend(str(p.root))
    return p
