"""Publishable wheels: no torch in the build, the build summary, honest
metadata, the platform tag, editable installs that never go stale, file modes."""

from __future__ import annotations

import sys

import pytest
from _build_helpers import (
    build,
    check_record,
    make_project,
    manifest_of,
    metadata_lines,
    target_toml,
    torch_only_path,
    wheel_names,
)

from precompile_build.errors import CaptureError

pytestmark = pytest.mark.usefixtures("build_env")

# -- no torch where the build runs --------------------------------------------------


def test_no_torch_in_the_build_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what find_spec sees without torch
    root = make_project(tmp_path)
    with pytest.raises(
        CaptureError,
        match=r"torch is not installed where the build runs "
        r".*`build-system.requires`.*--no-isolation",
    ):
        build(root, monkeypatch)
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []


def test_failed_fingerprint_turns_the_cache_off_not_a_key_error(tmp_path, monkeypatch, capfd):
    from precompile_build.builder import capture_cache

    def broken(*a, **k):
        raise CaptureError("Failed to compute the host fingerprint: No module named 'torch'")

    monkeypatch.setattr(capture_cache, "host_fingerprints", broken)
    whl = build(make_project(tmp_path), monkeypatch)
    assert "double.cache" in " ".join(wheel_names(whl))
    assert "capture cache unavailable for this build" in capfd.readouterr().err


# -- which torch the artifacts are for ----------------------------------------------


@pytest.mark.parametrize("mode", ["ok", "cuda-fp"])
def test_summary_names_the_torch_the_artifacts_are_for(tmp_path, monkeypatch, capfd, mode):
    """A CPU pair names no CUDA or Triton: a CUDA build of torch (2.14.1+cu130) said
    "CUDA 13.0" for a CPU target."""
    import json
    import os

    fp = json.loads(os.environ["FIXTURE_FINGERPRINT"])
    build(make_project(tmp_path, target_toml(mode=mode)), monkeypatch)
    err = capfd.readouterr().err
    line = [ln for ln in err.splitlines() if "the artifacts are for" in ln]
    what = (
        "CPU"
        if mode == "ok"
        else f"CUDA {fp['cuda'] or 'none'}, Triton {fp['triton'] or 'none'}, sm 9.0"
    )
    assert line == [
        f"precompile: the artifacts are for torch {fp['torch']}, {what}, Python "
        f"{fp['python']}, {fp['platform']} (another torch: pin it in "
        "`build-system.requires`, or build with --no-isolation where it is "
        "installed)"
    ]


def test_a_failed_build_names_no_torch_for_artifacts(tmp_path, monkeypatch, capfd):
    """A failed build writes no artifacts, so it names no torch they
    are for, also when another target of it captured fine."""
    from precompile_build.errors import CaptureError

    toml = target_toml() + target_toml("bad", mode="raise")
    with pytest.raises(CaptureError, match="boom from capture script"):
        build(make_project(tmp_path, toml), monkeypatch)
    err = capfd.readouterr().err
    assert "precompile: summary" in err and "the artifacts are for" not in err


def test_dynamic_dependencies_from_a_file_keep_the_users_and_add_ours(tmp_path, monkeypatch, capfd):
    """The user guide's (docs/guide.md) `[tool.setuptools.dynamic]` example: the user's own requirement
    from requirements.txt and the build's precompile-runtime, both in METADATA, and no
    warning about static dependencies."""
    root = make_project(tmp_path, target_toml())
    _set_project(root, 'dynamic = ["dependencies"]')
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text().replace(
            "[tool.setuptools]\n",
            "[tool.setuptools.dynamic]\n"
            'dependencies = { file = ["requirements.txt"] }\n\n'
            "[tool.setuptools]\n",
        )
    )
    (root / "requirements.txt").write_text("numpy>=1.26\n")
    whl = build(root, monkeypatch)
    lines = metadata_lines(whl, "Requires-Dist")
    assert "numpy>=1.26" in lines and any(ln.startswith("precompile-runtime") for ln in lines), (
        lines
    )
    assert "is static" not in capfd.readouterr().err


# -- metadata that tells the truth --------------------------------------------------


def _set_project(root, extra: str) -> None:
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text().replace(
            'requires-python = ">=3.9"\n', f'requires-python = ">=3.9"\n{extra}\n'
        )
    )


def test_wheel_requires_each_project_once(tmp_path, monkeypatch):
    root = make_project(tmp_path)
    _set_project(root, 'dependencies = ["torch", "numpy>=1"]')
    whl = build(root, monkeypatch)
    req = metadata_lines(whl, "Requires-Dist")
    assert req[:2] == ["torch==2.13.0", "numpy>=1"]
    assert [r for r in req[2:] if not r.startswith("precompile-runtime")] == []
    assert len(req) == 3


def test_wheel_pin_against_a_static_requirement_that_excludes_it(tmp_path, monkeypatch):
    from precompile_build.errors import BuildError

    root = make_project(tmp_path)
    _set_project(root, 'dependencies = ["torch<2"]')
    with pytest.raises(
        BuildError,
        match=r"the artifacts need torch==2.13.0, but "
        r"`project.dependencies` requires torch<2",
    ):
        build(root, monkeypatch)


def test_sdist_pkg_info_marks_requires_dist_dynamic(tmp_path, monkeypatch):
    import tarfile

    sdist = build(make_project(tmp_path), monkeypatch, hook="build_sdist")
    with tarfile.open(sdist) as tf:
        infos = {
            n: tf.extractfile(n).read().decode() for n in tf.getnames() if n.endswith("PKG-INFO")
        }
    assert sorted(infos) == [
        "simplepkg-0.1.0/PKG-INFO",
        "simplepkg-0.1.0/simplepkg.egg-info/PKG-INFO",
    ]
    for text in infos.values():
        head = text.split("\n\n")[0].splitlines()
        assert "Dynamic: Requires-Dist" in head
        major, minor = map(int, head[0].split(":")[1].split("."))
        assert head[0].startswith("Metadata-Version:") and (major, minor) >= (2, 2)


@pytest.mark.parametrize(
    "deps, warned",
    [
        (None, True),  # no `dependencies`: static and empty (PEP 621)
        ('dependencies = ["torch"]', True),
        ('dependencies = ["torch==2.13.0", "precompile-runtime"]', False),
        ('dynamic = ["dependencies"]', False),
    ],
)
def test_static_dependencies_that_miss_the_build_requirements_warn(
    tmp_path, monkeypatch, capfd, deps, warned
):
    root = make_project(tmp_path)
    if deps:
        _set_project(root, deps)
    build(root, monkeypatch)
    err = capfd.readouterr().err
    assert (
        "precompile: warning: `project.dependencies` in pyproject.toml is static, but "
        "this build adds " in err
    ) is warned
    if deps == 'dependencies = ["torch"]':
        assert "adds precompile-runtime>=0.3, torch==2.13.0 to the wheel" in err


def test_static_dependencies_gap_takes_the_parsed_project_table():
    """The backend passes `[project]` as settings parsed it; nothing reads pyproject.toml again."""
    from precompile_build.backend import static_dependencies_gap

    req = ["precompile-runtime>=0.3", "torch==2.13.0"]
    assert static_dependencies_gap({"dependencies": ["torch==2.13.0"]}, req) == [
        "precompile-runtime>=0.3"
    ]
    assert static_dependencies_gap({"dependencies": ["torch"]}, req) == req
    assert static_dependencies_gap({}, req) == req  # no `dependencies`: static and empty
    assert static_dependencies_gap({"dynamic": ["dependencies"]}, req) == []
    assert static_dependencies_gap(None, req) == []  # no [project]: setup.py/setup.cfg metadata


def _uv() -> str | None:
    import shutil
    from pathlib import Path

    here = Path(sys.executable).parent / "uv"
    return str(here) if here.exists() else shutil.which("uv")


@pytest.mark.slow
@pytest.mark.skipif(_uv() is None, reason="uv is not installed (pip install uv)")
@pytest.mark.parametrize("what", ["project", "sdist", "wheel"])
def test_uv_pip_install_into_a_fresh_venv_loads(tmp_path, what):
    """`uv pip install .` / SDIST / WHEEL into a fresh venv installs precompile-runtime
    (uv takes static metadata as final) and the target loads. Offline: the runtime
    comes from a local wheel, torch from the test's own environment (a path with only
    torch on it, so nothing else leaks in); the fixture's pin is off so uv need not
    fetch torch."""
    import os
    import subprocess
    from pathlib import Path

    import torch

    repo = Path(__file__).resolve().parents[1]
    uv = _uv()
    root = make_project(tmp_path, '[tool.precompile]\ntorch-pin = "none"\n' + target_toml())
    _set_project(root, 'dynamic = ["dependencies"]')
    site = Path(torch.__file__).parents[1]
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(repo), str(repo / "runtime"), str(site)])
    )
    env.pop("VIRTUAL_ENV", None)

    def run(*cmd, **kw):
        proc = subprocess.run(
            [str(c) for c in cmd], capture_output=True, text=True, timeout=300, cwd=tmp_path, **kw
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    links = tmp_path / "links"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-w",
        links,
        repo / "runtime",
        env=env,
    )
    source = root
    if what != "project":
        hook = "--sdist" if what == "sdist" else "--wheel"
        run(
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            hook,
            "--outdir",
            tmp_path / "dist",
            root,
            env=env,
        )
        (source,) = (tmp_path / "dist").iterdir()
    venv = tmp_path / "venv"
    run(uv, "venv", "-q", "--python", sys.executable, venv)
    vpy = venv / "bin" / "python"
    run(
        uv,
        "pip",
        "install",
        "--python",
        vpy,
        "--no-index",
        "--find-links",
        links,
        "--no-build-isolation",
        "--no-cache",
        source,
        env=env,
    )
    listed = run(uv, "pip", "list", "--python", vpy, env=env)
    assert "precompile-runtime" in listed and "simplepkg" in listed
    only_torch = torch_only_path(tmp_path / "only-torch")
    code = (
        "import simplepkg, precompile_runtime; "
        "print(precompile_runtime.load_packaged('double', package='simplepkg')(21))"
    )
    out = run(vpy, "-c", code, env=dict(os.environ, PYTHONPATH=str(only_torch)))
    assert out.strip().splitlines()[-1] == "42"


# -- a platform tag PyPI accepts -----------------------------------------------------

KERNEL_CPP = r"""
#include <string>
#include <cmath>
extern "C" double kernel(const char* s, double x) { return std::string(s).size() * std::exp(x); }
"""


def _compile(tmp_path, name: str, src: str, *flags: str):
    import shutil
    import subprocess

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++) to build a kernel")
    (tmp_path / f"{name}.cpp").write_text(src)
    out = tmp_path / f"lib{name}.so"
    subprocess.run(
        [cxx, "-shared", "-fPIC", "-O2", "-o", str(out), str(tmp_path / f"{name}.cpp"), *flags],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return out


def _auditwheel_show(tmp_path, so) -> str:
    """The platform tag `auditwheel show` gives a plain wheel with ``so`` in it."""
    import re
    import subprocess

    from _build_helpers import generic_tag

    from precompile_build.wheels.rewrite import write_wheel

    tag = generic_tag()
    entries = {
        "plain/__init__.py": (b"", 0o644),
        f"plain/{so.name}": (so.read_bytes(), 0o755),
        "plain-0.1.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: plain\nVersion: 0.1\n",
            0o644,
        ),
        "plain-0.1.dist-info/WHEEL": (
            f"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: false\nTag: {tag}\n".encode(),
            0o644,
        ),
    }
    whl = write_wheel(tmp_path / "aw", f"plain-0.1-{tag}.whl", entries)
    proc = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", str(whl)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = " ".join((proc.stdout + proc.stderr).split())
    m = re.search(r'consistent with the following platform tag: "([^"]+)"', text)
    assert m, text
    return m.group(1)


def test_frozen_kernels_get_the_manylinux_tag_auditwheel_gives_them(tmp_path, monkeypatch, capfd):
    pytest.importorskip("auditwheel")
    so = _compile(tmp_path, "kern", KERNEL_CPP)
    expected = _auditwheel_show(tmp_path, so)
    assert expected.startswith("manylinux_")
    monkeypatch.setenv("FIXTURE_KERNEL", str(so))
    whl = build(make_project(tmp_path, target_toml(mode="frozen")), monkeypatch)
    plat = whl.name[:-4].split("-")[-1].split(".")
    assert expected in plat and not any(p.startswith("linux_") for p in plat)
    check_record(whl)
    assert f"precompile: platform tag {expected}" in capfd.readouterr().err


def test_kernels_linking_another_library_stay_linux_with_the_reason(tmp_path, monkeypatch, capfd):
    pytest.importorskip("auditwheel")
    dep = _compile(tmp_path, "private", 'extern "C" int private_fn() { return 1; }')
    so = _compile(
        tmp_path,
        "kern2",
        'extern "C" int private_fn();\nextern "C" int kernel() { return private_fn(); }',
        f"-L{tmp_path}",
        "-Wl,--no-as-needed",
        "-lprivate",
    )
    monkeypatch.setenv("FIXTURE_KERNEL", str(so))
    whl = build(make_project(tmp_path, target_toml(mode="frozen")), monkeypatch)
    assert whl.name.endswith("-linux_x86_64.whl") or "-linux_" in whl.name
    err = capfd.readouterr().err
    assert (
        "the kernels link libraries that neither torch nor the manylinux policy "
        "provides: libprivate.so (needed by simplepkg/_precompiled/double.cache!kernel.so))"
    ) in err
    assert dep.exists()


@pytest.mark.slow
def test_twine_check_passes_on_a_built_wheel(tmp_path, monkeypatch):
    import subprocess

    pytest.importorskip("twine")
    root = make_project(tmp_path, target_toml(mode="frozen"))
    _set_project(root, 'readme = {text = "A fixture.", content-type = "text/markdown"}')
    whl = build(root, monkeypatch)
    assert "manylinux_" in whl.name
    proc = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(whl)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "PASSED" in proc.stdout, proc.stdout + proc.stderr


# -- editable installs never serve stale kernels ------------------------------------


def test_editable_load_notices_a_changed_source(tmp_path, monkeypatch):
    import warnings

    from precompile_runtime import StaleArtifactError, loader

    root = make_project(tmp_path, target_toml(mode="frozen"))
    build(root, monkeypatch, hook="build_editable")
    doc = __import__("json").loads(
        (root / "simplepkg" / "_precompiled" / "manifest.json").read_bytes()
    )
    assert doc["editable"]["package_dir"] == str((root / "simplepkg").resolve())
    monkeypatch.syspath_prepend(str(root))
    unpacked = []
    real_unpack = loader._unpack
    monkeypatch.setattr(loader, "_unpack", lambda *a: unpacked.append(1) or real_unpack(*a))
    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(tmp_path / "kcache"))

    def load(**kw):
        monkeypatch.setattr(loader, "_loaded", {})
        return loader.load_packaged("double", package="simplepkg", **kw)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load()(21) == 42  # unchanged source: the kernels are served
    assert unpacked == [1]
    (root / "simplepkg" / "model.py").write_text("ACT = 'gelu'\n")  # the user edits
    # the fixture's pair records no importable function: the old code's result is
    # never served (test_build_slow.py serves the current code)
    with pytest.raises(
        StaleArtifactError,
        match=r"package 'simplepkg', target 'double': "
        r"the package source in .* changed since the editable build.*"
        r"no importable name.*pip install -e \.",
    ):
        load()
    assert unpacked == [1]  # no kernels this time
    with pytest.raises(
        StaleArtifactError, match=r"Strict mode \(strict=True or PRECOMPILE_STRICT=1\): no fallback"
    ):
        load(strict=True)
    # a regular wheel records nothing, so an installed package never pays for the check
    whl = build(root, monkeypatch, out=tmp_path / "w")
    assert "editable" not in manifest_of(whl)


# -- reproducible wheels under another umask ----------------------------------------


def test_same_wheel_and_sdist_under_another_umask(tmp_path, monkeypatch):
    import os
    import tarfile
    import zipfile

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    out = {}
    for mask in (0o022, 0o077):
        old = os.umask(mask)
        try:
            root = make_project(tmp_path / oct(mask), target_toml(mode="frozen"))
            whl = build(root, monkeypatch, out=tmp_path / f"w{mask}")
            sdist = build(root, monkeypatch, out=tmp_path / f"s{mask}", hook="build_sdist")
        finally:
            os.umask(old)
        with zipfile.ZipFile(whl) as zf:
            modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in zf.infolist()}
        with tarfile.open(sdist) as tf:
            tmodes = {m.name: m.mode for m in tf.getmembers()}
        out[mask] = (whl.read_bytes(), modes, tmodes)
    assert out[0o022][1] == out[0o077][1]
    assert {
        m
        for n, m in out[0o077][1].items()  # RECORD: wheel's own fixed 0o664
        if not n.endswith("/RECORD")
    } <= {0o644, 0o755}
    assert out[0o022][2] == out[0o077][2]
    assert set(out[0o077][2].values()) <= {0o644, 0o755}
    assert out[0o022][0] == out[0o077][0]


# -- kernel size -------------------------------------------------------------------


def test_strip_kernel_drops_debug_info_and_symtab_and_still_loads(tmp_path):
    import ctypes
    import io
    import shutil

    from elftools.elf.elffile import ELFFile

    from precompile_build.engines.kernel_size import strip_kernel

    if shutil.which("strip") is None:
        pytest.skip("binutils' strip is not installed")
    so = _compile(tmp_path, "dbg", KERNEL_CPP, "-g")
    data = so.read_bytes()

    def sections(blob):
        return {s.name for s in ELFFile(io.BytesIO(blob)).iter_sections()}

    assert {".symtab", ".debug_info"} <= sections(data)
    out = strip_kernel(data)
    assert len(out) < len(data) // 2
    assert not {n for n in sections(out) if n.startswith(".debug") or n == ".symtab"}
    assert ".dynsym" in sections(out)
    assert strip_kernel(data) == out  # deterministic
    assert strip_kernel(b"not an elf") == b"not an elf"
    (tmp_path / "s.so").write_bytes(out)
    lib = ctypes.CDLL(str(tmp_path / "s.so"))
    lib.kernel.restype, lib.kernel.argtypes = ctypes.c_double, [ctypes.c_char_p, ctypes.c_double]
    assert lib.kernel(b"abc", 0.0) == 3.0


def test_without_auditwheel_the_tag_is_linux_with_the_reason(monkeypatch):
    from precompile_build.wheels import platform_tags

    monkeypatch.setitem(sys.modules, "auditwheel.policy", None)
    said = []
    tags = platform_tags.wheel_tags({"x.cache": b"opaque"}, say=said.append)
    assert len(tags) == 1 and tags[0].split("-")[2].startswith("linux_")
    assert (
        said and "auditwheel is not importable" in said[0] and "pip install auditwheel" in said[0]
    )


def test_kernels_that_need_no_libc_get_the_floor_tag():
    """CUDA-only variants (cubins are ELF files for another machine): manylinux_2_17."""
    from precompile_build.wheels.platform_tags import decide_platform

    with open(sys.executable, "rb") as f:
        cubin = bytearray(f.read(64))
    cubin[18:20] = (190).to_bytes(2, "little")  # e_machine EM_CUDA
    d = decide_platform({"k.cache!triton/k.cubin": bytes(cubin)})
    assert d.reason is None and d.needs == {}
    assert d.platforms[0].startswith("manylinux_2_17_")
