"""The suite's own rules (tests/conftest.py): frontends only in slow tests, CUDA tests
marked gpu, torch's config modules set through their own patch, the heavy tests the fast
loop leaves out (tests/heavy.txt)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest


def _this_suites_conftest():
    """tests/conftest.py as a module of its own: a run that also collects
    example_project/tests has another module named ``conftest`` in sys.modules."""
    spec = importlib.util.spec_from_file_location(
        "tests_conftest", Path(__file__).with_name("conftest.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


conftest = _this_suites_conftest()


@pytest.mark.parametrize(
    "args, frontend",
    [
        ([sys.executable, "-m", "build", "--wheel"], "build"),
        ([sys.executable, "-m", "pip", "install", "x"], "pip"),
        (["/usr/bin/uv", "pip", "install", "x"], "uv"),
        ("python3 -m venv /tmp/v", "venv"),
        ([sys.executable, "-c", "print('pip')"], None),
        ([sys.executable, "capture/build.py", "build"], None),
    ],
)
def test_what_counts_as_a_frontend(args, frontend):
    assert conftest._frontend(args) == frontend


def test_a_frontend_in_an_unmarked_test_fails_it():
    with pytest.raises(pytest.fail.Exception, match="is not marked slow"):
        subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    subprocess.run([sys.executable, "-c", "pass"], check=True)  # other subprocesses run


@pytest.mark.slow
def test_a_frontend_in_a_slow_test_runs():
    assert (
        subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode
        == 0
    )


class _Item:
    def __init__(self, path, reasons):
        self.fspath, self._reasons = path, reasons

    def iter_markers(self, name):
        return (
            [pytest.mark.skipif(True, reason=r).mark for r in self._reasons]
            if name == "skipif"
            else []
        )


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
    monkeypatch.setattr(
        sys, "dont_write_bytecode", sys.dont_write_bytecode
    )  # other objects: as pytest's


def test_every_heavy_entry_names_a_test_function():
    """tests/heavy.txt (the tests the fast loop leaves out) names only test functions that
    exist: one renamed or removed fails here, not silently back into the fast loop."""
    import ast

    from _heavy import read

    root = Path(__file__).resolve().parents[1]
    missing = []
    for name in read():
        path, *scopes = name.split("::")
        body = (
            ast.parse((root / path).read_text(encoding="utf-8")).body
            if (root / path).is_file()
            else []
        )
        for scope in scopes:
            node = next(
                (
                    n
                    for n in body
                    if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == scope
                ),
                None,
            )
            body = node.body if isinstance(node, ast.ClassDef) else []
            if node is None:
                missing.append(name)
                break
    assert missing == [], (
        "tests/heavy.txt names tests that do not exist (tests/_heavy.py: re-measure)"
    )


def test_a_durations_report_gives_each_function_its_slowest_case():
    from _heavy import measured, render

    report = "\n".join(
        [
            "============================== slowest durations ===============================",
            "3.50s call     tests/test_a.py::test_x[1]",
            "0.60s setup    tests/test_a.py::test_x[2]",
            "0.50s call     tests/test_a.py::test_x[2]",
            "0.90s call     tests/test_a.py::TestC::test_y",
            "0.20s teardown tests/test_a.py::TestC::test_y",
            "0.30s call     tests/test_b.py::test_z",
        ]
    )
    assert measured(report) == {
        "tests/test_a.py::test_x": 3.5,
        "tests/test_a.py::TestC::test_y": 1.1,
        "tests/test_b.py::test_z": 0.3,
    }
    assert render(report).splitlines()[1:] == [
        "    1.1  tests/test_a.py::TestC::test_y",
        "    3.5  tests/test_a.py::test_x",
    ]


class _Collected:
    def __init__(self, nodeid):
        self.nodeid, self.fspath, self.marks = nodeid, "/t/test_x.py", []

    def add_marker(self, mark):
        self.marks.append(mark)

    def iter_markers(self, name):
        return []

    def get_closest_marker(self, name):
        return None


def test_the_listed_heavy_functions_are_marked(pytestconfig, monkeypatch):
    """Every case of a function in tests/heavy.txt carries the heavy mark (the conftest)."""
    monkeypatch.setitem(conftest._HEAVY, "tests/test_x.py::test_y", 1.0)
    items = [
        _Collected("tests/test_x.py::test_y[a]"),
        _Collected("tests/test_x.py::test_y[b]"),
        _Collected("tests/test_x.py::test_z"),
    ]
    conftest.pytest_collection_modifyitems(pytestconfig, items)
    assert [[m.name for m in item.marks] for item in items] == [["heavy"], ["heavy"], []]
