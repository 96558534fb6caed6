"""The suite's own rules (tests/conftest.py): frontends only in slow tests, CUDA tests
marked gpu, torch's config modules set through their own patch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


def _this_suites_conftest():
    """tests/conftest.py as a module of its own: a run that also collects
    example_project/tests has another module named ``conftest`` in sys.modules."""
    spec = importlib.util.spec_from_file_location("tests_conftest", Path(__file__).with_name("conftest.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conftest = _this_suites_conftest()


@pytest.mark.parametrize("args, frontend", [
    ([sys.executable, "-m", "build", "--wheel"], "build"),
    ([sys.executable, "-m", "pip", "install", "x"], "pip"),
    (["/usr/bin/uv", "pip", "install", "x"], "uv"),
    ("python3 -m venv /tmp/v", "venv"),
    ([sys.executable, "-c", "print('pip')"], None),
    ([sys.executable, "capture/build.py", "build"], None),
])
def test_what_counts_as_a_frontend(args, frontend):
    assert conftest._frontend(args) == frontend


def test_a_frontend_in_an_unmarked_test_fails_it():
    with pytest.raises(pytest.fail.Exception, match="is not marked slow"):
        subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # other subprocesses run


@pytest.mark.slow
def test_a_frontend_in_a_slow_test_runs():
    assert subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


class _Item:
    def __init__(self, path, reasons):
        self.fspath, self._reasons = path, reasons

    def iter_markers(self, name):
        return [pytest.mark.skipif(True, reason=r).mark for r in self._reasons] if name == "skipif" else []


def test_what_needs_the_gpu_mark():
    assert conftest._needs_cuda(_Item("/t/test_gpu_x.py", []))
    assert conftest._needs_cuda(_Item("/t/test_x.py", ["needs 2 CUDA GPUs and NCCL"]))
    assert not conftest._needs_cuda(_Item("/t/test_x.py", ["needs transformers"]))


def test_torch_config_modules_are_not_monkeypatched(monkeypatch, torch_config):
    from torch._inductor import config

    with pytest.raises(pytest.fail.Exception, match="use the torch_config fixture"):
        monkeypatch.setattr(config, "fx_graph_cache", not config.fx_graph_cache)
    before = config.fx_graph_cache
    torch_config(config, fx_graph_cache=not before)
    assert config.fx_graph_cache is (not before)
    monkeypatch.setattr(sys, "dont_write_bytecode", sys.dont_write_bytecode)  # other objects: as pytest's
