"""A source half's code object: the bytecode pip wrote at install where it is valid
for the bytes the loader verified (PEP 552's rules), compiled otherwise."""

from __future__ import annotations

import importlib.util
import os
import py_compile

import pytest

from precompile_runtime import _bytecode

SOURCE = b"def load(kernel_dir):\n    return 41 + 1\n"


def _half(tmp_path, mode=py_compile.PycInvalidationMode.TIMESTAMP):
    path = tmp_path / "f.py"
    path.write_bytes(SOURCE)
    py_compile.compile(str(path), dfile="installed/f.py", doraise=True, invalidation_mode=mode)
    return path


def _origin(code):
    return "pyc" if code.co_filename == "installed/f.py" else "compiled"


@pytest.mark.parametrize("mode", [py_compile.PycInvalidationMode.TIMESTAMP,
                                  py_compile.PycInvalidationMode.CHECKED_HASH,
                                  py_compile.PycInvalidationMode.UNCHECKED_HASH])
def test_valid_bytecode_is_used(tmp_path, mode):
    path = _half(tmp_path, mode)
    code = _bytecode.source_code(path, SOURCE, "pkg/_precompiled/f.py")
    assert _origin(code) == "pyc"
    ns = {}
    exec(code, ns)
    assert ns["load"](None) == 42


def test_bytecode_of_other_bytes_is_not_used(tmp_path):
    path = _half(tmp_path, py_compile.PycInvalidationMode.CHECKED_HASH)
    other = SOURCE.replace(b"41", b"40")  # what the loader read and verified is these
    code = _bytecode.source_code(path, other, "pkg/_precompiled/f.py")
    assert _origin(code) == "compiled" and code.co_filename == "pkg/_precompiled/f.py"
    ns = {}
    exec(code, ns)
    assert ns["load"](None) == 41


def test_a_timestamp_pyc_of_another_mtime_or_size_is_stale(tmp_path):
    path = _half(tmp_path)
    st = os.stat(path)
    os.utime(path, (st.st_atime, st.st_mtime + 5))
    assert _origin(_bytecode.source_code(path, SOURCE, "x")) == "compiled"
    path = _half(tmp_path)
    path.write_bytes(SOURCE + b"# more\n")  # same second, another size
    os.utime(path, (st.st_atime, st.st_mtime))
    assert _origin(_bytecode.source_code(path, SOURCE + b"# more\n", "x")) == "compiled"


@pytest.mark.parametrize("damage", ["truncated", "other magic", "garbage"])
def test_a_damaged_pyc_falls_back_to_compiling(tmp_path, damage):
    path = _half(tmp_path)
    pyc = importlib.util.cache_from_source(str(path))
    data = open(pyc, "rb").read()
    data = {"truncated": data[:20], "other magic": b"\0\0\r\n" + data[4:],
            "garbage": data[:16] + b"\xff" * 40}[damage]
    with open(pyc, "wb") as f:
        f.write(data)
    os.utime(path, (os.stat(path).st_atime, os.stat(path).st_mtime))
    code = _bytecode.source_code(path, SOURCE, "x")
    assert _origin(code) == "compiled"


def test_no_file_or_no_pyc_compiles(tmp_path):
    assert _origin(_bytecode.source_code(object(), SOURCE, "x")) == "compiled"  # a zip's Traversable
    path = tmp_path / "g.py"
    path.write_bytes(SOURCE)
    assert _origin(_bytecode.source_code(path, SOURCE, "x")) == "compiled"
    with pytest.raises(SyntaxError):
        _bytecode.source_code(path, b"def (:\n", "x")
