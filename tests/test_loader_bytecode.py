"""load_packaged runs the source half from the bytecode the installer wrote (pip
byte-compiles the package's .py files, the source halves among them) where that is the
bytecode of the verified source by Python's own rules, and compiles the source
otherwise: a first result without the compile of each source half (tens of ms)."""

from __future__ import annotations

import importlib.util
import os
import py_compile
from pathlib import Path

import pytest

from precompile_runtime import load_packaged
from precompile_runtime import loader as _loader
from test_runtime_loader import BLOB, clean_env, make_package, on_path  # noqa: F401 - clean_env: autouse

CHECKED = py_compile.PycInvalidationMode.CHECKED_HASH
TIMESTAMP = py_compile.PycInvalidationMode.TIMESTAMP


@pytest.fixture
def compiles(monkeypatch):
    """The loader's compile calls (a list of their filenames)."""
    calls = []

    def counting(source, filename, *args, **kwargs):
        calls.append(filename)
        return compile(source, filename, *args, **kwargs)

    monkeypatch.setattr(_loader, "compile", counting, raising=False)
    return calls


def _pyc(p, mode):
    src = p.data / "fwd.py"
    py_compile.compile(str(src), cfile=importlib.util.cache_from_source(str(src)), invalidation_mode=mode,
                       doraise=True)
    return src


@pytest.mark.parametrize("mode", [TIMESTAMP, CHECKED])
def test_the_installed_bytecode_serves_without_a_compile(tmp_path, monkeypatch, compiles, mode):
    p = on_path(monkeypatch, make_package(tmp_path))
    _pyc(p, mode)
    fn = load_packaged("fwd", package=p.name)
    assert fn() == ("kernels", BLOB) and p.execs() == 1
    assert compiles == []


def _stale_timestamp(p, src):
    st = os.stat(src)
    os.utime(src, (st.st_atime, st.st_mtime + 10))  # the source changed after the install's compile


def _other_hash(p, src):
    pyc = Path(importlib.util.cache_from_source(str(src)))
    data = bytearray(pyc.read_bytes())
    data[8] ^= 0xFF  # a hash-based pyc of another source
    pyc.write_bytes(bytes(data))


def _garbage(p, src):
    Path(importlib.util.cache_from_source(str(src))).write_bytes(b"not a pyc")


@pytest.mark.parametrize("mode, spoil", [(TIMESTAMP, _stale_timestamp), (CHECKED, _other_hash),
                                         (TIMESTAMP, _garbage), (TIMESTAMP, None)])
def test_bytecode_of_another_source_or_none_is_not_used(tmp_path, monkeypatch, compiles, mode, spoil):
    p = on_path(monkeypatch, make_package(tmp_path))
    src = _pyc(p, mode) if spoil is not None else p.data / "fwd.py"
    if spoil is not None:
        spoil(p, src)
    assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)
    assert compiles == [f"{p.name}/_precompiled/fwd.py"]
