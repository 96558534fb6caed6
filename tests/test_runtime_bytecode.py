"""A source half's code object: the bytecode pip wrote at install where it is valid
for the bytes the loader verified (PEP 552's rules), compiled otherwise, and then
written as a checked hash-based pyc so that the next process takes it (an install
that did not byte-compile: uv's default, pip --no-compile)."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
import textwrap

import pytest
from _fake_packages import RUNTIME, make_package

from precompile_runtime import _bytecode

SOURCE = b"def load(kernel_dir):\n    return 41 + 1\n"


def _half(tmp_path, mode=py_compile.PycInvalidationMode.TIMESTAMP):
    path = tmp_path / "f.py"
    path.write_bytes(SOURCE)
    py_compile.compile(str(path), dfile="installed/f.py", doraise=True, invalidation_mode=mode)
    return path


def _code(monkeypatch, path, source, filename="x"):
    """(source_code's result, "pyc" or "compiled": whether it compiled)."""
    compiled = []

    def counting(*a, **k):
        compiled.append(1)
        return compile(*a, **k)

    monkeypatch.setattr(_bytecode, "compile", counting, raising=False)
    code = _bytecode.source_code(path, source, filename)
    return code, "compiled" if compiled else "pyc"


@pytest.mark.parametrize("mode", [py_compile.PycInvalidationMode.TIMESTAMP,
                                  py_compile.PycInvalidationMode.CHECKED_HASH,
                                  py_compile.PycInvalidationMode.UNCHECKED_HASH])
def test_valid_bytecode_is_used(tmp_path, monkeypatch, mode):
    path = _half(tmp_path, mode)
    code, origin = _code(monkeypatch, path, SOURCE, "pkg/_precompiled/f.py")
    assert origin == "pyc" and code.co_filename == "pkg/_precompiled/f.py"  # the pair's name, not pip's path
    ns = {}
    exec(code, ns)
    assert ns["load"](None) == 42


@pytest.mark.parametrize("mode", [py_compile.PycInvalidationMode.TIMESTAMP,
                                  py_compile.PycInvalidationMode.CHECKED_HASH])
def test_bytecode_of_other_bytes_is_not_used(tmp_path, monkeypatch, mode):
    # the file was replaced after the loader read (and verified) its bytes: same size,
    # same mtime, so a timestamp pyc alone would pass
    path = _half(tmp_path, mode)
    other = SOURCE.replace(b"41", b"40")
    code, origin = _code(monkeypatch, path, other, "pkg/_precompiled/f.py")
    assert origin == "compiled" and code.co_filename == "pkg/_precompiled/f.py"
    ns = {}
    exec(code, ns)
    assert ns["load"](None) == 41


def test_a_timestamp_pyc_of_another_mtime_or_size_is_stale(tmp_path, monkeypatch):
    path = _half(tmp_path)
    st = os.stat(path)
    os.utime(path, (st.st_atime, st.st_mtime + 5))
    assert _code(monkeypatch, path, SOURCE)[1] == "compiled"
    path = _half(tmp_path)
    path.write_bytes(SOURCE + b"# more\n")  # same second, another size
    os.utime(path, (st.st_atime, st.st_mtime))
    assert _code(monkeypatch, path, SOURCE + b"# more\n")[1] == "compiled"
    path = _half(tmp_path)  # rewritten after its pyc, same size (and likely the same second)
    other = SOURCE.replace(b"41", b"40")
    path.write_bytes(other)
    code, origin = _code(monkeypatch, path, other)
    ns = {}
    exec(code, ns)
    assert origin == "compiled" and ns["load"](None) == 41


@pytest.mark.parametrize("damage", ["truncated", "other magic", "garbage", "unknown flags"])
def test_a_damaged_pyc_falls_back_to_compiling(tmp_path, monkeypatch, damage):
    path = _half(tmp_path)
    pyc = importlib.util.cache_from_source(str(path))
    data = open(pyc, "rb").read()
    data = {"truncated": data[:20], "other magic": b"\0\0\r\n" + data[4:],
            "garbage": data[:16] + b"\xff" * 40, "unknown flags": data[:4] + b"\x04\0\0\0" + data[8:]}[damage]
    with open(pyc, "wb") as f:
        f.write(data)
    os.utime(path, (os.stat(path).st_atime, os.stat(path).st_mtime))
    assert _code(monkeypatch, path, SOURCE)[1] == "compiled"


def test_no_file_or_no_pyc_compiles(tmp_path, monkeypatch):
    assert _code(monkeypatch, object(), SOURCE)[1] == "compiled"  # a zip's Traversable
    path = tmp_path / "g.py"
    path.write_bytes(SOURCE)
    assert _code(monkeypatch, path, SOURCE)[1] == "compiled"
    with pytest.raises(SyntaxError):
        _bytecode.source_code(path, b"def (:\n", "x")


def _pyc(path):
    return importlib.util.cache_from_source(str(path))


def test_compiled_code_is_written_as_a_checked_hash_pyc_and_taken_next(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    path = tmp_path / "g.py"
    path.write_bytes(SOURCE)
    os.chmod(path, 0o644)
    assert _code(monkeypatch, path, SOURCE)[1] == "compiled"
    data = open(_pyc(path), "rb").read()
    assert data[:4] == importlib.util.MAGIC_NUMBER and int.from_bytes(data[4:8], "little") == 0b11
    assert data[8:16] == importlib.util.source_hash(SOURCE)
    assert os.stat(_pyc(path)).st_mode & 0o777 == 0o644  # others may read it, as the source
    assert [p.name for p in (tmp_path / "__pycache__").iterdir()] == [os.path.basename(_pyc(path))]  # no temp left
    code, origin = _code(monkeypatch, path, SOURCE, "pkg/_precompiled/g.py")
    assert origin == "pyc" and code.co_filename == "pkg/_precompiled/g.py"
    ns: dict = {}
    exec(code, ns)
    assert ns["load"](None) == 42
    # the file replaced by other bytes of the same size and mtime: the written pyc is
    # bound to the old bytes' hash, so the new ones are compiled (and their pyc written)
    st = os.stat(path)
    other = SOURCE.replace(b"41", b"40")
    path.write_bytes(other)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    code, origin = _code(monkeypatch, path, other)
    exec(code, ns)
    assert origin == "compiled" and ns["load"](None) == 41
    assert _code(monkeypatch, path, other)[1] == "pyc"


def test_no_pyc_is_written_under_dont_write_bytecode_or_where_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "g.py"
    path.write_bytes(SOURCE)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    assert _code(monkeypatch, path, SOURCE)[1] == "compiled"
    assert not (tmp_path / "__pycache__").exists()
    monkeypatch.setattr(sys, "dont_write_bytecode", False)

    os.chmod(tmp_path, 0o555)  # a read-only install: not written, for root (who could) too
    try:
        assert _code(monkeypatch, path, SOURCE)[1] == "compiled"
        assert not (tmp_path / "__pycache__").exists()
    finally:
        os.chmod(tmp_path, 0o755)

    def refused(*a, **k):  # a write the system refuses (the tests may run as root: chmod alone would not)
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_bytecode.os, "replace", refused)
    for _ in range(2):
        code, origin = _code(monkeypatch, path, SOURCE)
        assert origin == "compiled"
    assert list((tmp_path / "__pycache__").iterdir()) == []  # the temporary file removed
    ns: dict = {}
    exec(code, ns)
    assert ns["load"](None) == 42


def test_a_read_only_install_under_pycache_prefix_writes_the_pyc_there(tmp_path, monkeypatch):
    # PYTHONPYCACHEPREFIX: Python's import writes every module's pyc under the prefix,
    # whatever the package directory's mode; so does the loader for the source half
    path = tmp_path / "g.py"
    path.write_bytes(SOURCE)
    prefix = tmp_path.parent / (tmp_path.name + "-pycache")
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    os.chmod(tmp_path, 0o555)
    try:
        assert _code(monkeypatch, path, SOURCE)[1] == "compiled"
        assert _code(monkeypatch, path, SOURCE)[1] == "pyc"
        assert os.path.commonpath([_pyc(path), str(prefix)]) == str(prefix) and os.path.isfile(_pyc(path))
        assert not (tmp_path / "__pycache__").exists()
    finally:
        os.chmod(tmp_path, 0o755)


def test_an_install_without_bytecode_compiles_once_across_processes(tmp_path, runtime_env):
    # load_packaged in two fresh processes of a package no installer byte-compiled:
    # the first compiles the source half (and writes its pyc), the second compiles nothing
    pkg = make_package(tmp_path)
    script = textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{RUNTIME!r}, {str(pkg.root)!r}]
        from precompile_runtime import _bytecode, load_packaged
        compiled = []
        _bytecode.compile = lambda *a, **k: compiled.append(a[1]) or compile(*a, **k)
        fn = load_packaged("fwd", package={pkg.name!r}, strict=True)
        print(len(compiled), fn()[0])
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
            .stdout.split() for _ in range(2)]
    assert runs == [["1", "kernels"], ["0", "kernels"]]
    assert os.path.exists(_pyc(pkg.data / "fwd.py")) and pkg.execs() == 2
