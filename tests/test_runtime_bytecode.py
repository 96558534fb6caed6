"""A source half's code object: the bytecode pip wrote at install where it is valid
for the bytes the loader verified (PEP 552's rules), compiled otherwise."""

from __future__ import annotations

import importlib.util
import os
import py_compile
from pathlib import Path

import pytest

from precompile_runtime import _bytecode

SOURCE = b"def load(kernel_dir):\n    return 41 + 1\n"


def _half(tmp_path, mode=py_compile.PycInvalidationMode.TIMESTAMP):
    path = tmp_path / "f.py"
    path.write_bytes(SOURCE)
    py_compile.compile(str(path), dfile="installed/f.py", doraise=True, invalidation_mode=mode)
    return path


def _code(monkeypatch, path, source, filename="x", shipped=None):
    """(source_code's result, "pyc" or "compiled": whether it compiled); ``shipped``: the
    verified bytes of the build's pyc, as the loader passes them."""
    compiled = []

    def counting(*a, **k):
        compiled.append(1)
        return compile(*a, **k)

    monkeypatch.setattr(_bytecode, "compile", counting, raising=False)
    code = _bytecode.source_code(path, source, filename, shipped)
    return code, "compiled" if compiled else "pyc"


@pytest.mark.parametrize(
    "mode",
    [
        py_compile.PycInvalidationMode.TIMESTAMP,
        py_compile.PycInvalidationMode.CHECKED_HASH,
        py_compile.PycInvalidationMode.UNCHECKED_HASH,
    ],
)
def test_valid_bytecode_is_used(tmp_path, monkeypatch, mode):
    path = _half(tmp_path, mode)
    code, origin = _code(monkeypatch, path, SOURCE, "pkg/_precompiled/f.py")
    assert (
        origin == "pyc" and code.co_filename == "pkg/_precompiled/f.py"
    )  # the pair's name, not pip's path
    ns = {}
    exec(code, ns)
    assert ns["load"](None) == 42


@pytest.mark.parametrize(
    "mode", [py_compile.PycInvalidationMode.TIMESTAMP, py_compile.PycInvalidationMode.CHECKED_HASH]
)
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
    data = Path(pyc).read_bytes()
    data = {
        "truncated": data[:20],
        "other magic": b"\0\0\r\n" + data[4:],
        "garbage": data[:16] + b"\xff" * 40,
        "unknown flags": data[:4] + b"\x04\0\0\0" + data[8:],
    }[damage]
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


# ------------------------------------------------- bytecode the build ships beside the source


def _shipped(tmp_path, source=SOURCE):
    """f.py and the pyc the build ships beside it (wheels/bytecode.py), no __pycache__:
    as an installer that does not byte-compile leaves them."""
    from precompile_build.wheels.bytecode import shipped_bytecode

    path = tmp_path / "f.py"
    path.write_bytes(source)
    ((name, data),) = shipped_bytecode({"f.py": source}).items()
    assert name == os.path.basename(_bytecode.shipped_path(str(path)))
    (tmp_path / name).write_bytes(data)
    assert not (tmp_path / "__pycache__").exists()
    return path, tmp_path / name


def test_shipped_bytecode_serves_an_install_that_did_not_byte_compile(tmp_path, monkeypatch):
    path, pyc = _shipped(tmp_path)
    assert (
        _code(monkeypatch, path, SOURCE)[1] == "compiled"
    )  # not passed (not in the manifest): not read
    code, origin = _code(monkeypatch, path, SOURCE, "pkg/_precompiled/f.py", pyc.read_bytes())
    assert origin == "pyc" and code.co_filename == "pkg/_precompiled/f.py"
    ns = {}
    exec(code, ns)
    assert ns["load"](None) == 42


def test_shipped_bytecode_of_other_bytes_is_not_used(tmp_path, monkeypatch):
    path, pyc = _shipped(tmp_path)
    other = SOURCE.replace(b"41", b"40")
    path.write_bytes(other)  # the source half replaced (an upgrade), its old pyc left
    code, origin = _code(monkeypatch, path, other, shipped=pyc.read_bytes())
    ns = {}
    exec(code, ns)
    assert origin == "compiled" and ns["load"](None) == 41


def test_a_shipped_pyc_that_is_not_hash_based_or_is_corrupt_is_not_used(tmp_path, monkeypatch):
    path, pyc = _shipped(tmp_path)
    good = pyc.read_bytes()
    # a timestamp pyc at the shipped name: not what the build writes, and nothing ties it to these bytes
    py_compile.compile(
        str(path),
        cfile=str(pyc),
        doraise=True,
        invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP,
    )
    assert _code(monkeypatch, path, SOURCE, shipped=pyc.read_bytes())[1] == "compiled"
    bad = good[:16] + good[16:40]  # truncated: the header still says these bytes
    assert _code(monkeypatch, path, SOURCE, shipped=bad)[1] == "compiled"
    bad = good[:4] + b"\0\0\0\0" + good[8:]  # flags cleared: read as a timestamp pyc
    assert _code(monkeypatch, path, SOURCE, shipped=bad)[1] == "compiled"
    assert _code(monkeypatch, path, SOURCE, shipped=good)[1] == "pyc"


def test_installers_bytecode_is_taken_first(tmp_path, monkeypatch):
    path, pyc = _shipped(tmp_path)
    py_compile.compile(str(path), doraise=True)  # pip's, in __pycache__
    assert _code(monkeypatch, path, SOURCE, shipped=b"not a pyc")[1] == "pyc"


def test_shipped_bytecode_is_reproducible_and_checked_hash():
    from precompile_build.wheels.bytecode import shipped_bytecode

    sources = {"a.py": SOURCE, "b.py": b"import torch\nX = {'k': (1, 2.5, None)}\n"}
    first, again = shipped_bytecode(sources), shipped_bytecode(sources)
    assert first == again and sorted(first) == sorted(
        os.path.basename(_bytecode.shipped_path(n)) for n in sources
    )
    for name, data in first.items():
        assert int.from_bytes(data[4:8], "little") == 0b11  # checked hash (PEP 552)
        assert data[8:16] == importlib.util.source_hash(sources[name.split(".")[0] + ".py"])


def test_a_source_half_that_does_not_compile_fails_the_build_with_its_error():
    from precompile_build.errors import BuildError
    from precompile_build.wheels.bytecode import shipped_bytecode

    with pytest.raises(BuildError) as ei:
        shipped_bytecode({"good.py": SOURCE, "bad.py": b"def f(:\n"})
    msg = str(ei.value)
    assert "bad.py" in msg and "SyntaxError" in msg and "report it" in msg, msg


# ------------------------------------------------- the shipped pyc is covered by the manifest


def _package_with_shipped_pyc(tmp_path, monkeypatch, listed=True):
    """A fake installed package whose source half has the pyc the build ships beside it,
    listed in the manifest (its ``bytecode`` entry) or not (a wheel of an older build)."""
    import sys

    from _fake_packages import file_entry, make_package

    from precompile_build.wheels.bytecode import shipped_bytecode

    p = make_package(tmp_path)
    monkeypatch.syspath_prepend(str(p.root))
    ((name, data),) = shipped_bytecode({"fwd.py": (p.data / "fwd.py").read_bytes()}).items()
    (p.data / name).write_bytes(data)
    if listed:
        doc = p.manifest()
        doc["targets"]["fwd"]["variants"][0]["bytecode"] = {
            sys.implementation.cache_tag: file_entry(name, data)
        }
        p.write_manifest(doc)
    return p, p.data / name


def _swap_code_object(pyc, marker):
    """Keep the pyc's header (its flags and the source hash: still "these bytes'"), swap
    the code object for one that writes ``marker`` and serves something else."""
    import marshal

    evil = compile(
        f"open({str(marker)!r}, 'w').write('ran')\ndef load(kernel_dir):\n    return lambda: 'evil'\n",
        "fwd.py",
        "exec",
    )
    good = pyc.read_bytes()
    pyc.write_bytes(good[:16] + marshal.dumps(evil))


@pytest.mark.usefixtures("runtime_env")
def test_a_listed_shipped_pyc_serves_and_one_with_a_swapped_code_object_is_refused(
    tmp_path, monkeypatch
):
    from precompile_runtime import IntegrityError, load_packaged

    p, pyc = _package_with_shipped_pyc(tmp_path, monkeypatch)
    compiled = []
    monkeypatch.setattr(
        _bytecode, "compile", lambda *a, **k: compiled.append(1) or compile(*a, **k), raising=False
    )
    assert load_packaged("fwd", package=p.name)()[0] == "kernels"
    assert compiled == []  # the shipped pyc served: no compile

    q, pyc = _package_with_shipped_pyc(tmp_path / "q", monkeypatch)
    marker = tmp_path / "evil-ran"
    _swap_code_object(pyc, marker)
    with pytest.raises(
        IntegrityError,
        match=rf"package '{q.name}', target 'fwd': _precompiled/{pyc.name}: "
        r"sha256 check failed: the manifest says \d+ bytes with sha256 \w+, the file has",
    ):
        load_packaged("fwd", package=q.name)
    assert not marker.exists() and q.execs() == 0  # nothing of it ran


@pytest.mark.usefixtures("runtime_env")
def test_a_shipped_pyc_the_manifest_does_not_list_is_not_read(tmp_path, monkeypatch):
    """A wheel of an older build (no ``bytecode`` entry), or a pyc dropped in: compiled
    from the verified source instead, whatever the pyc holds."""
    from precompile_runtime import load_packaged

    p, pyc = _package_with_shipped_pyc(tmp_path, monkeypatch, listed=False)
    marker = tmp_path / "evil-ran"
    _swap_code_object(pyc, marker)
    assert load_packaged("fwd", package=p.name)()[0] == "kernels"
    assert not marker.exists() and p.execs() == 1
