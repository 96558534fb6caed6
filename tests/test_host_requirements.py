"""What the host must support and what may change under a load:

- the CPU instruction-set level the frozen CPU kernels were compiled for is a
  requirement checked against this host's CPU flags (a fake ``/proc/cpuinfo`` through
  ``PRECOMPILE_CPUINFO``), at load and in ``inspect``;
- a kernel cache directory on a ``noexec`` file system: a typed error under strict,
  else a warning and the fallback (simulated, and for real in a private mount
  namespace where this host allows one);
- a load that races a reinstall: a typed error that says to retry.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import warnings
from pathlib import Path

import pytest
from _fake_packages import (
    BLOB,
    RUNTIME,
    file_entry,
    make_package,
    make_pair,
    make_source,
    on_path,
)

from precompile_runtime import (
    CacheDirNotExecutableError,
    HostMismatchError,
    HostMismatchWarning,
    IntegrityError,
    PackageChangedError,
    PrecompileLoadError,
    TargetNotFoundError,
    fingerprint,
    load_packaged,
    loader,
)

# A host with AVX512 and VNNI, without AMX (the flags line of a real /proc/cpuinfo).
AVX512_HOST = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
    "mmx fxsr sse sse2 ht syscall nx pdpe1gb rdtscp lm constant_tsc nopl xtopology "
    "pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave "
    "avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch bmi1 avx2 smep bmi2 erms "
    "invpcid avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd sha_ni "
    "avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves avx512_bf16 avx512vbmi umip "
    "avx512_vbmi2 gfni vaes vpclmulqdq avx512_vnni avx512_bitalg avx512_vpopcntdq"
)
AMX_HOST = AVX512_HOST + " amx_bf16 amx_tile amx_int8"
AVX2_HOST = " ".join(f for f in AVX512_HOST.split() if not f.startswith("avx512"))


pytestmark = pytest.mark.usefixtures("runtime_env")


def fake_cpu(monkeypatch, tmp_path, flags: str) -> None:
    """This process now reads its CPU flags from a /proc/cpuinfo copy with ``flags``."""
    path = tmp_path / f"cpuinfo-{abs(hash(flags))}"
    path.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {flags}\n\n")
    monkeypatch.setenv(fingerprint.CPUINFO_ENV, str(path))


# ------------------------------------------------------------------ CPU ISA


@pytest.mark.parametrize(
    "isa, flags, missing",
    [
        ("avx512 avx512_vnni x86-64-v4", AVX512_HOST, None),
        ("avx512 avx512_vnni amx_tile", AVX512_HOST, "amx_tile, amx_bf16, amx_int8"),
        ("avx512 avx512_vnni amx_tile", AMX_HOST, None),
        (
            "avx512 avx512_vnni x86-64-v4",
            AVX2_HOST,
            "avx512f, avx512dq, avx512vl, avx512bw, avx512_vnni, avx512cd",
        ),
        ("avx512", AVX2_HOST, "avx512f, avx512dq, avx512vl, avx512bw"),  # older records: one word
        ("avx2 x86-64-v3", AVX2_HOST, None),
        ("avx512 avx512_bf16 x86-64-v4", AVX512_HOST, None),
        ("INVALID_VEC_ISA x86-64", "fpu", None),
        ("", "", None),
    ],
)
def test_isa_requirement_against_cpu_flags(isa, flags, missing):
    got = fingerprint.isa_mismatch(isa, set(flags.split()))
    assert got == (
        None if missing is None else f"cpu_isa: built for {isa!r}, this CPU lacks {missing}"
    )


def test_unreadable_cpu_flags_fail_a_requirement():
    assert "cannot be read" in fingerprint.isa_mismatch("avx2", set())
    assert fingerprint.isa_mismatch(None, set()) is None
    assert "not a list of CPU features" in fingerprint.isa_mismatch(512, set(AVX512_HOST.split()))


@pytest.mark.parametrize(
    "isa, host, lacks",
    [
        # the edit of an installed manifest, on a host without AMX
        ("avx512 avx512_vnni amx_tile", AVX512_HOST, "amx_tile"),
        # AVX512 kernels on a host without AVX512 (a copy of /proc/cpuinfo without them)
        ("avx512 avx512_vnni x86-64-v4", AVX2_HOST, "avx512f"),
    ],
)
def test_kernels_for_a_cpu_feature_the_host_lacks_never_load(
    isa, host, lacks, tmp_path, monkeypatch
):
    from precompile_build.wheels.inspect_cmd import format_report, inspect_report

    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"cpu_isa": isa}]}))
    fake_cpu(monkeypatch, tmp_path, host)
    monkeypatch.setenv("PRECOMPILE_STRICT", "1")
    with pytest.raises(
        HostMismatchError, match=f"cpu_isa: built for {isa!r}, this CPU lacks {lacks}"
    ):
        load_packaged("fwd", package=p.name)
    assert p.execs() == 0 and not (tmp_path / "kcache").exists()  # no kernel was mapped
    text = format_report(inspect_report(str(p.data)))
    assert "this host: does not match" in text and f"- cpu_isa: built for {isa!r}" in text
    monkeypatch.delenv("PRECOMPILE_STRICT")
    with pytest.warns(HostMismatchWarning, match=f"this CPU lacks {lacks}"):
        assert load_packaged("fwd", package=p.name)() == ("fallback", None)


def _private_mounts_or_skip() -> None:
    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")


def test_a_real_cpuinfo_without_avx512_refuses_avx512_kernels(tmp_path):
    """The issue's case without the test seam: a /proc/cpuinfo copy without the avx512
    flags bind-mounted over the real one, in a private mount namespace."""
    _private_mounts_or_skip()
    p = make_package(tmp_path, {"fwd": [{"cpu_isa": "avx512 avx512_vnni x86-64-v4"}]})
    fake = tmp_path / "cpuinfo"
    fake.write_text(f"processor\t: 0\nflags\t\t: {AVX2_HOST}\n\n")
    (tmp_path / "load.py").write_text(
        textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{str(p.root)!r}, {RUNTIME!r}]
        import precompile_runtime as pr
        try:
            pr.load_packaged("fwd", package={p.name!r}, strict=True)
            print("LOADED")
        except pr.HostMismatchError as e:
            print("REFUSED", e)
        """)
    )
    env = {k: v for k, v in os.environ.items() if k != fingerprint.CPUINFO_ENV}
    env["PRECOMPILE_CACHE_DIR"] = str(tmp_path / "kcache")
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount --bind {fake} /proc/cpuinfo && {sys.executable} {tmp_path / 'load.py'}",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0 and "mount:" in proc.stderr:
        pytest.skip(f"cannot bind-mount here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert "REFUSED" in proc.stdout and "this CPU lacks avx512f" in proc.stdout, proc.stdout
    assert not (tmp_path / "kcache").exists()


def test_kernels_load_where_the_cpu_has_every_feature(tmp_path, monkeypatch):
    from precompile_build.wheels.inspect_cmd import format_report, inspect_report

    p = on_path(
        monkeypatch, make_package(tmp_path, {"fwd": [{"cpu_isa": "avx512 avx512_vnni amx_tile"}]})
    )
    fake_cpu(monkeypatch, tmp_path, AMX_HOST)
    assert "this host: matches" in format_report(inspect_report(str(p.data)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_packaged("fwd", package=p.name, strict=True)() == ("kernels", BLOB)


# ------------------------------------------------------------- noexec cache dir


def _with_source(p, source: bytes) -> None:
    """Replace target fwd's pair with ``source`` (+ a cache for it), manifest updated."""
    cache = make_pair(source)
    (p.data / "fwd.py").write_bytes(source)
    (p.data / "fwd.cache").write_bytes(cache)
    doc = p.manifest()
    v = doc["targets"]["fwd"]["variants"][0]
    v["files"] = {"source": file_entry("fwd.py", source), "cache": file_entry("fwd.cache", cache)}
    v["code_hash"] = fingerprint_sha(source)
    p.write_manifest(doc)


def fingerprint_sha(data: bytes) -> str:
    from precompile_runtime.envelope import sha256_hex

    return sha256_hex(data)


UNMAPPABLE = make_source(Path("/dev/null"), "fwd").replace(
    b"    with open(os.path.join(kernel_dir",
    b"    raise ImportError(os.path.join(kernel_dir, 'sub', 'k.so') + ': failed to map segment '\n"
    b"                      'from shared object')\n    with open(os.path.join(kernel_dir",
)


def test_noexec_kernel_dir_is_a_mismatch_with_advice(tmp_path, monkeypatch):
    """dlopen refusing the unpacked kernels (simulated: the pair's loader raises what
    glibc says on a noexec mount) is the mismatch path, with the directory and the fix."""
    p = on_path(monkeypatch, make_package(tmp_path))
    _with_source(p, UNMAPPABLE)
    with pytest.raises(CacheDirNotExecutableError) as ei:
        load_packaged("fwd", package=p.name, strict=True)
    msg = str(ei.value)
    assert isinstance(ei.value, HostMismatchError)
    # this process's own folder in the cache directory, named by code_hash
    assert f"the precompiled kernels unpacked in {tmp_path / 'kcache'}/.run-" in msg
    assert f"/{fingerprint_sha(UNMAPPABLE)} cannot be loaded" in msg
    assert "failed to map segment" in msg and "mounted noexec?" in msg
    assert "Set PRECOMPILE_CACHE_DIR to a directory on a file system mounted with exec" in msg
    with pytest.warns(HostMismatchWarning, match="Set PRECOMPILE_CACHE_DIR") as rec:
        assert load_packaged("fwd", package=p.name)() == ("fallback", None)
    assert "Using the slower fallback" in str(rec[0].message)
    with pytest.raises(CacheDirNotExecutableError):  # the cached fallback, to a strict caller
        load_packaged("fwd", package=p.name, strict=True)


def test_other_import_errors_of_a_pair_are_not_called_noexec(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path))
    _with_source(p, UNMAPPABLE.replace(b"failed to map segment", b"undefined symbol: foo"))
    with pytest.raises(ImportError, match="undefined symbol"):
        load_packaged("fwd", package=p.name)


def _extension_module() -> str | None:
    """A CPython extension module (.so) of this interpreter, to stand in for a kernel."""
    for name in ("_json", "_struct", "_bisect", "_random", "math"):
        hits = glob.glob(os.path.join(sysconfig.get_config_var("DESTSHARED") or "", f"{name}.*.so"))
        if hits:
            return hits[0]
    return None


REAL_SO_SOURCE = """\
PRECOMPILE_METADATA = {"format": "precompile-build.source", "version": 1, "engine": "frozen",
                       "target": "fwd", "device": "cpu",
                       "calling_convention": {"args": [], "kwargs": []}}
import importlib.util, os


def load(kernel_dir):
    if kernel_dir is None:
        return lambda: "fallback"
    path = os.path.join(kernel_dir, "sub", "k.so")
    name = os.path.basename(%r).split(".")[0]
    spec = importlib.util.spec_from_file_location(name, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return lambda: "kernels"
"""


def test_real_noexec_mount(tmp_path):
    """The kernel cache on a tmpfs mounted noexec (a private mount namespace: needs
    root or user namespaces), a real extension module as the kernel."""
    so = _extension_module()
    if so is None:
        pytest.skip("no extension module .so here")
    _private_mounts_or_skip()
    p = make_package(tmp_path)
    source = (REAL_SO_SOURCE % so).encode()
    cache = make_pair(source, blobs={"sub/k.so": Path(so).read_bytes()})
    (p.data / "fwd.py").write_bytes(source)
    (p.data / "fwd.cache").write_bytes(cache)
    doc = p.manifest()
    doc["targets"]["fwd"]["variants"][0].update(
        files={"source": file_entry("fwd.py", source), "cache": file_entry("fwd.cache", cache)},
        code_hash=fingerprint_sha(source),
    )
    p.write_manifest(doc)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    code = textwrap.dedent(f"""
        import sys, warnings
        sys.path[:0] = [{str(p.root)!r}, {RUNTIME!r}]
        import precompile_runtime as pr
        warnings.simplefilter("ignore")
        try:
            print("LOADED", pr.load_packaged("fwd", package={p.name!r}, strict=sys.argv[1] == "strict")())
        except pr.PrecompileLoadError as e:
            print("ERROR", type(e).__name__, e)
        """)
    (tmp_path / "load.py").write_text(code)

    def run(mount_opts: str, mode: str) -> str:
        script = (
            f"mount -t tmpfs -o {mount_opts} none {mnt} && "
            f"PRECOMPILE_CACHE_DIR={mnt}/cache {sys.executable} {tmp_path / 'load.py'} {mode}"
        )
        proc = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True)
        if "mount:" in proc.stderr and proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "LOADED kernels" in run("exec", "strict")  # the control: the same kernels load
    out = run("noexec", "strict")
    assert "ERROR CacheDirNotExecutableError" in out and "failed to map segment" in out, out
    assert "Set PRECOMPILE_CACHE_DIR to a directory on a file system mounted with exec" in out
    assert "LOADED fallback" in run("noexec", "lenient")


# --------------------------------------------------------- reinstall under a load


def _reinstall_after_manifest_read(monkeypatch, p, tmp_path, how):
    """Make the next load see its package replaced right after it read the manifest."""
    parse = loader._manifest.parse

    def parse_then_reinstall(raw, **where):
        doc = parse(raw, **where)
        monkeypatch.setattr(loader._manifest, "parse", parse)
        how(p, tmp_path)
        return doc

    monkeypatch.setattr(loader._manifest, "parse", parse_then_reinstall)


def _new_version(p, tmp_path):
    """pip wrote the new version's files: another source, cache and manifest."""
    source = make_source(tmp_path / "v2.marker", "fwd") + b"# version 2\n"
    _with_source(p, source)


def _uninstalled(p, tmp_path):
    """pip moved the old files away and has not written the new ones yet."""
    shutil.rmtree(p.data)


@pytest.mark.parametrize("how", [_new_version, _uninstalled], ids=["replaced", "removed"])
def test_a_load_racing_a_reinstall_says_retry(how, tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path))
    _reinstall_after_manifest_read(monkeypatch, p, tmp_path, how)
    with pytest.raises(PackageChangedError) as ei:
        load_packaged("fwd", package=p.name)
    msg = str(ei.value)
    assert isinstance(ei.value, IntegrityError)
    assert (
        f"package {p.name!r}, target 'fwd': the installed files changed while they were being loaded"
        in msg
    )
    assert "Retry once the installation has finished" in msg
    assert "rebuild" not in msg and "reinstall the package" not in msg
    assert p.execs() == 0
    if how is _new_version:  # the retry loads the new version
        assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)


def test_a_package_removed_under_a_load_says_retry(tmp_path, monkeypatch):
    import importlib

    p = on_path(monkeypatch, make_package(tmp_path))
    importlib.import_module(p.name)
    shutil.rmtree(p.dir)  # pip's uninstall moved the whole package away
    with pytest.raises(PackageChangedError, match="its installed files are gone .*Retry once"):
        load_packaged("fwd", package=p.name)


def test_tampering_is_still_not_called_a_race(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path))
    data = bytearray((p.data / "fwd.py").read_bytes())
    data[40] ^= 1
    (p.data / "fwd.py").write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as ei:
        load_packaged("fwd", package=p.name)
    assert type(ei.value) is IntegrityError and "reinstall the package" in str(ei.value)
    shutil.rmtree(p.data)  # a package built without captures, still installed
    with pytest.raises(TargetNotFoundError, match="rebuild the wheel"):
        load_packaged("fwd", package=p.name)


def test_new_errors_are_precompile_load_errors():
    for cls in (CacheDirNotExecutableError, PackageChangedError):
        assert issubclass(cls, PrecompileLoadError)


def test_a_zipped_package_without_data_is_not_called_a_race(tmp_path, monkeypatch):
    """A zip import's __file__ is no path on disk: not a sign of a reinstall."""
    import importlib
    import zipfile

    p = make_package(tmp_path)
    shutil.rmtree(p.data)
    zpath = tmp_path / "site.zip"
    with zipfile.ZipFile(zpath, "w") as zf:
        zf.write(p.dir / "__init__.py", f"{p.name}/__init__.py")
    shutil.rmtree(p.root)
    monkeypatch.syspath_prepend(str(zpath))
    importlib.import_module(p.name)
    with pytest.raises(TargetNotFoundError, match="rebuild the wheel") as ei:
        load_packaged("fwd", package=p.name)
    assert not isinstance(ei.value, PackageChangedError)


def test_what_was_seen_keeps_the_finding_not_the_context_or_advice():
    from precompile_runtime._pair_files import what_was_seen
    from precompile_runtime.errors import ManifestError

    ctx = "package 'pkg', target 'fwd'"
    manifest = ManifestError(
        "manifest format version 99 is newer than this precompile-runtime reads (1)",
        context=ctx,
        where="_precompiled/manifest.json",
        advice="upgrade precompile-runtime",
    )  # as the manifest reader raises it: fields, not one text
    assert what_was_seen(manifest) == (
        "_precompiled/manifest.json: manifest format version 99 is newer than this "
        "precompile-runtime reads (1)"
    )
    fields = IntegrityError(
        "sha256 check failed",
        context=ctx,
        where="_precompiled/fwd.py",
        advice="reinstall the package",
    )
    assert what_was_seen(fields) == "_precompiled/fwd.py: sha256 check failed"
