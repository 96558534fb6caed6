"""Fixtures shared by the test modules (pytest finds them here: no import needed), and
the rules of the suite's marks (docs/contributing.md):

- a test that runs a real frontend or installer in a subprocess (``python -m build``,
  pip, uv, venv, twine), itself or through a fixture, is marked ``slow`` (the
  integration tier): run unmarked, the subprocess call fails the test;
- a test that needs CUDA (in a ``test_gpu_*`` module, or skipped without CUDA) is
  marked ``gpu``: collection fails on one without the mark;
- no test sets a torch config module's entry with ``monkeypatch`` (its undo deletes
  the entry under pytest 9.2, and every later compile of the process fails): use the
  module's own ``config.patch``, e.g. through the ``torch_config`` fixture;
- the unit tests measured heavy (a case of a second or more) are listed in
  tests/heavy.txt (tests/_heavy.py makes it from a ``--durations=0`` run): every case
  of a listed function gets the ``heavy`` mark, which the fast loop leaves out.

A module opts in with ``pytestmark = pytest.mark.usefixtures("build_env")`` (builds of
the fixture projects) or ``"runtime_env"`` (loads by the runtime)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import pytest
from _heavy import function_id, read

# argv words that make a subprocess a frontend or an installer
_FRONTENDS = {"build", "pip", "pip3", "uv", "venv", "virtualenv", "twine"}
_current: list = [None]  # the test item running now (setup, call, teardown)
_HEAVY = read()  # tests/heavy.txt: function id -> its measured seconds


def _frontend(args) -> str | None:
    """The frontend ``args`` (a Popen argument) runs, or None."""
    argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
    for i, word in enumerate(argv):
        name = os.path.basename(word)
        if name in _FRONTENDS and (i == 0 or argv[i - 1] == "-m"):
            return name
    return None


_popen_init = subprocess.Popen.__init__


def _checked_popen_init(self, args, *rest, **kwargs):
    item = _current[0]
    frontend = _frontend(args)
    if item is not None and frontend and item.get_closest_marker("slow") is None:
        raise pytest.fail.Exception(
            f"{item.nodeid} runs {frontend!r} in a subprocess (itself or through a fixture) and "
            "is not marked slow: mark it @pytest.mark.slow (docs/contributing.md)"
        )
    _popen_init(self, args, *rest, **kwargs)


def pytest_configure(config):
    subprocess.Popen.__init__ = _checked_popen_init  # type: ignore[method-assign]


def pytest_unconfigure(config):
    subprocess.Popen.__init__ = _popen_init  # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current[0] = item
    try:
        yield
    finally:
        _current[0] = None


def _needs_cuda(item) -> bool:
    if os.path.basename(str(item.fspath)).startswith("test_gpu_"):
        return True
    return any(
        "cuda" in str(m.kwargs.get("reason", "")).lower() for m in item.iter_markers("skipif")
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the heavy mark must count
def pytest_collection_modifyitems(config, items):
    for item in items:
        if function_id(item.nodeid) in _HEAVY:
            item.add_marker(pytest.mark.heavy)
    unmarked = [
        item.nodeid
        for item in items
        if _needs_cuda(item) and item.get_closest_marker("gpu") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            "tests that need CUDA without the gpu mark (docs/contributing.md): "
            + ", ".join(unmarked[:10])
            + (" ..." if len(unmarked) > 10 else "")
        )


@pytest.fixture
def monkeypatch(monkeypatch):
    """pytest's monkeypatch, refusing torch's config modules (use ``torch_config``)."""
    setattr_ = monkeypatch.setattr

    def setattr_checked(target, *args, **kwargs):
        torch = sys.modules.get("torch")
        config_module = getattr(
            getattr(getattr(torch, "utils", None), "_config_module", None), "ConfigModule", None
        )
        if config_module is not None and isinstance(target, config_module):
            raise pytest.fail.Exception(
                f"monkeypatch.setattr on torch's config module {target.__name__}: its undo deletes "
                "the entry (pytest 9.2); use the torch_config fixture (the module's config.patch)"
            )
        return setattr_(target, *args, **kwargs)

    monkeypatch.setattr = setattr_checked
    return monkeypatch


@pytest.fixture
def torch_config():
    """``torch_config(module, name=value, ...)`` sets entries of a torch config module
    (``torch._inductor.config``, ``torch._functorch.config``) for the test, through the
    module's own ``patch``: undone at teardown as torch restores them."""
    with contextlib.ExitStack() as stack:
        yield lambda module, **values: stack.enter_context(module.patch(**values))


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
    for var in (
        "PRECOMPILE_SKIP",
        "PRECOMPILE_TARGETS",
        "PRECOMPILE_BUILD_STRICT",
        "PRECOMPILE_VERBOSE",
        "PRECOMPILE_TORCH_PIN",
        "SOURCE_DATE_EPOCH",
        "PRECOMPILE_CACHE",
        "PRECOMPILE_JOBS",
        "PRECOMPILE_DISTRIBUTED",
    ):
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
