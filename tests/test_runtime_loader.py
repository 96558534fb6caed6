"""Tests of precompile_runtime.load_packaged against fake installed packages
(tests/_fake_packages.py): choosing the variant for this host, strict and fallback
loads, stale editable installs, environment switches. Tampered artifacts and the
kernel cache: test_runtime_integrity.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import types
import warnings

import pytest
from _fake_packages import (
    BLOB,
    HOST,
    RUNTIME,
    FakePkg,
    file_entry,
    make_package,
    on_path,
)

from precompile_runtime import (
    HostMismatchError,
    HostMismatchWarning,
    IntegrityError,
    ManifestError,
    PrecompileLoadError,
    StaleArtifactError,
    StaleArtifactWarning,
    TargetNotFoundError,
    envelope,
    fingerprint,
    load_packaged,
)

pytestmark = pytest.mark.usefixtures("runtime_env")


# ------------------------------------------------------------------- matching


def test_exact_match_loads_kernels(pkg, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fn = load_packaged("fwd", package=pkg.name)
    assert fn() == ("kernels", BLOB)
    code_hash = pkg.manifest()["targets"]["fwd"]["variants"][0]["code_hash"]
    assert load_packaged("fwd", package=pkg.name) is fn
    assert pkg.execs() == 1
    # nothing left behind but this process's own folder (removed at exit) with the blobs
    (run,) = os.listdir(tmp_path / "kcache")
    assert run.startswith(".run-") and os.listdir(tmp_path / "kcache" / run) == [code_hash]
    assert (tmp_path / "kcache" / run / code_hash / "sub" / "k.bin").read_bytes() == BLOB


def test_second_variant_matching_is_chosen(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"torch": "0.0.1"}, {}]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_packaged("fwd", package=p.name)() == ("kernels", BLOB)


@pytest.mark.parametrize("field", fingerprint.EXACT_FIELDS)
def test_each_field_mismatch_warns_and_falls_back(field, tmp_path, monkeypatch):
    other = f"other-{field}"
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{field: other}]}))
    with pytest.warns(HostMismatchWarning) as rec:
        fn = load_packaged("fwd", package=p.name)
    assert fn() == ("fallback", None)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert repr(p.name) in msg and "'fwd'" in msg
    assert f"{field}: built for {other!r}, this host has {HOST.get(field)!r}" in msg
    assert "fallback" in msg
    assert not (tmp_path / "kcache").exists()  # no kernels unpacked for a fallback
    # once per process
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_packaged("fwd", package=p.name) is fn


def test_warning_names_every_variant_and_field(tmp_path, monkeypatch):
    p = on_path(
        monkeypatch,
        make_package(
            tmp_path, {"fwd": [{"torch": "9.9", "python": "2.7"}, {"compute_capability": "9.0"}]}
        ),
    )
    with pytest.warns(HostMismatchWarning) as rec:
        load_packaged("fwd", package=p.name)
    msg = str(rec[0].message)
    assert "variant 0" in msg and "variant 1" in msg
    assert "torch: built for '9.9'" in msg and "python: built for '2.7'" in msg
    assert "compute_capability: built for '9.0', this host has None" in msg


def _core(text: str) -> str:
    return text.split(" Using the slower fallback")[0].split(" Strict mode")[0]


def test_strict_true_raises_with_same_text(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"torch": "0.0.1"}]}))
    with pytest.raises(HostMismatchError) as ei:
        load_packaged("fwd", package=p.name, strict=True)
    assert p.execs() == 0
    with pytest.warns(HostMismatchWarning) as rec:
        load_packaged("fwd", package=p.name)
    assert _core(str(ei.value)) == _core(str(rec[0].message))
    assert "torch: built for '0.0.1'" in str(ei.value)
    # a cached fallback still refuses strict callers
    with pytest.raises(HostMismatchError):
        load_packaged("fwd", package=p.name, strict=True)


def _record_function(p: FakePkg, target: str, function: dict) -> None:
    """Put ``meta["function"]`` in a target's cache, as precompile_build.capture does
    for a module-level function, and update the manifest's size/sha256."""
    cache = p.data / f"{target}.cache"
    env = envelope.loads(cache.read_bytes())
    env.meta = dict(env.meta, function=function)
    cache.write_bytes(envelope.dumps(env))
    doc = p.manifest()
    doc["targets"][target]["variants"][0]["files"]["cache"] = file_entry(
        f"{target}.cache", cache.read_bytes()
    )
    doc["editable"] = {"package_dir": str(p.dir), "package_sha256": "0" * 64}  # not its digest now
    p.write_manifest(doc)


def test_a_stale_editable_install_serves_the_current_code_and_refuses_strict(tmp_path, monkeypatch):
    """An editable install whose source changed: the captured function's current code
    (by the name the capture recorded) serves, never the old pair; that answer, cached
    by a non-strict load, is not handed to a later strict caller, who gets the
    StaleArtifactError that a first strict load would have raised."""
    p = on_path(
        monkeypatch,
        make_package(
            tmp_path,
            extra_files={
                "ops.py": "class Steps:\n    @staticmethod\n    def fwd():\n        return 'current code'\n"
            },
        ),
    )
    _record_function(p, "fwd", {"module": f"{p.name}.ops", "qualname": "Steps.fwd"})
    with pytest.warns(
        StaleArtifactWarning,
        match=rf"changed since the editable build .*calling the "
        rf"current {p.name}.ops.Steps.fwd eagerly instead",
    ):
        assert load_packaged("fwd", package=p.name)() == "current code"
    with pytest.raises(
        StaleArtifactError,
        match=r"changed since the editable build .* Strict mode \(strict=True or PRECOMPILE_STRICT=1\): no fallback",
    ):
        load_packaged("fwd", package=p.name, strict=True)
    assert p.execs() == 0  # the stale pair's source never ran


@pytest.mark.parametrize("case", ["no name", "gone"])
def test_a_stale_editable_install_without_the_current_code_is_refused(tmp_path, monkeypatch, case):
    """No importable name recorded (a lambda, a torch-engine pair), or the recorded
    function no longer imports: StaleArtifactError without strict too, never the
    old pair's result."""
    p = on_path(monkeypatch, make_package(tmp_path))
    if case == "no name":
        doc = p.manifest()
        doc["editable"] = {"package_dir": str(p.dir), "package_sha256": "0" * 64}
        p.write_manifest(doc)
        want = r"no importable name \(a lambda"
    else:
        _record_function(p, "fwd", {"module": f"{p.name}.removed", "qualname": "fwd"})
        want = rf"the captured function {p.name}.removed.fwd does not import any more \(ModuleNotFoundError"
    with pytest.raises(StaleArtifactError, match=want + r".*Run the editable install again"):
        load_packaged("fwd", package=p.name)
    assert p.execs() == 0


def test_strict_env_raises(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"platform": "plan9"}]}))
    monkeypatch.setenv("PRECOMPILE_STRICT", "1")
    with pytest.raises(HostMismatchError, match="platform: built for 'plan9'"):
        load_packaged("fwd", package=p.name)
    # strict=False overrides the environment
    with pytest.warns(HostMismatchWarning):
        assert load_packaged("fwd", package=p.name, strict=False)() == ("fallback", None)


def test_fallback_still_verifies_source(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"torch": "0.0.1"}]}))
    src = p.data / "fwd.py"
    src.write_bytes(src.read_bytes().replace(b"fallback", b"fallbaXk"))
    with pytest.raises(IntegrityError, match="fwd.py: sha256 check failed"):
        load_packaged("fwd", package=p.name)
    assert p.execs() == 0


# --------------------------------------------------------------------- engines


def test_torch_engine_delegates_to_torch_pairs(tmp_path, monkeypatch):
    calls = []
    fake = types.ModuleType("precompile_runtime.torch_pairs")

    def load_torch_pair(source, cache, *, fallback, where):
        assert repr(p.name) in where and ("'fwd'" in where or "'bwd'" in where)
        calls.append((source, cache, fallback))
        return ("torch-pair", fallback)

    fake.load_torch_pair = load_torch_pair
    monkeypatch.setitem(sys.modules, "precompile_runtime.torch_pairs", fake)
    import precompile_runtime

    monkeypatch.setattr(precompile_runtime, "torch_pairs", fake, raising=False)
    p = on_path(
        monkeypatch,
        make_package(tmp_path, {"fwd": [{}], "bwd": [{"torch": "0.1"}]}, engine="torch"),
    )
    assert load_packaged("fwd", package=p.name) == ("torch-pair", False)
    assert calls[0][0] == (p.data / "fwd.py").read_bytes()
    assert calls[0][1] == (p.data / "fwd.cache").read_bytes()
    with pytest.warns(HostMismatchWarning, match="torch: built for '0.1'"):
        assert load_packaged("bwd", package=p.name) == ("torch-pair", True)
    assert p.execs() == 0  # torch pairs are not exec'd by us


def test_eager_engine_loads_without_kernel_dir(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, engine="eager"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_packaged("fwd", package=p.name)() == ("fallback", None)


# ------------------------------------------------------------------ not found


def test_unknown_target_names_what_exists(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{}], "train": [{}]}))
    doc = p.manifest()
    doc["targets"]["gpu"] = {
        "required": False,
        "status": "failed",
        "reason": "no CUDA",
        "variants": [],
    }
    p.write_manifest(doc)
    with pytest.raises(TargetNotFoundError) as ei:
        load_packaged("nope", package=p.name)
    msg = str(ei.value)
    assert "'nope'" in msg and "'fwd'" in msg and "'train'" in msg and "'gpu'" in msg
    with pytest.raises(TargetNotFoundError, match="no CUDA"):
        load_packaged("gpu", package=p.name)


def test_package_without_data(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path))
    shutil.rmtree(p.data)
    with pytest.raises(TargetNotFoundError, match="no _precompiled/manifest.json") as ei:
        load_packaged("fwd", package=p.name)
    assert (
        f"in {p.dir} (is this the installed package? a source checkout on sys.path shadows it)"
        in str(ei.value)
    )
    with pytest.raises(TargetNotFoundError, match="cannot be imported"):
        load_packaged("fwd", package="pcb_no_such_package_xyz")


# --------------------------------------------------------------- package default


def test_package_defaults_to_callers_top_level_package(tmp_path, monkeypatch):
    p = make_package(tmp_path)
    sub = p.dir / "models"
    sub.mkdir()
    (sub / "__init__.py").write_text("")
    (sub / "api.py").write_text(
        "from precompile_runtime import load_packaged\n\ndef get():\n    return load_packaged('fwd')\n"
    )
    on_path(monkeypatch, p)
    import importlib

    api = importlib.import_module(f"{p.name}.models.api")
    assert api.get()() == ("kernels", BLOB)


def test_main_script_without_package_is_an_error(tmp_path):
    code = textwrap.dedent(
        f"""
        import sys; sys.path.insert(0, {RUNTIME!r})
        import precompile_runtime
        try:
            precompile_runtime.load_packaged("fwd")
        except precompile_runtime.PrecompileLoadError as e:
            print("ERR", e)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("ERR") and "package=" in out


def test_import_does_not_import_torch():
    code = (
        f"import sys; sys.path.insert(0, {RUNTIME!r}); import precompile_runtime; "
        "print('torch' in sys.modules, precompile_runtime.__version__)"
    )
    for extra in ({}, {"PRECOMPILE_NO_COMPILE": "1"}):
        env = dict(os.environ, **extra)
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
        )
        assert out.stdout.split() == ["False", __import__("precompile_runtime").__version__]


def test_errors_are_precompile_load_errors():
    for cls in (HostMismatchError, IntegrityError, ManifestError, TargetNotFoundError):
        assert issubclass(cls, PrecompileLoadError)


# ------------------------------------------------------ boolean options and env vars


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "on", " on "])
def test_strict_env_accepts_true_spellings(value, tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"platform": "plan9"}]}))
    monkeypatch.setenv("PRECOMPILE_STRICT", value)
    with pytest.raises(HostMismatchError):
        load_packaged("fwd", package=p.name)


@pytest.mark.parametrize("value", ["0", "false", "No", "OFF", ""])
def test_strict_env_accepts_false_spellings(value, tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path, {"fwd": [{"platform": "plan9"}]}))
    monkeypatch.setenv("PRECOMPILE_STRICT", value)
    with pytest.warns(HostMismatchWarning):
        assert load_packaged("fwd", package=p.name)() == ("fallback", None)


@pytest.mark.parametrize("var", ["PRECOMPILE_STRICT", "PRECOMPILE_NO_COMPILE"])
def test_env_flag_other_values_are_an_error(var, pkg, monkeypatch):
    from precompile_runtime import LoadOptionError, PrecompileLoadError

    monkeypatch.setenv(var, "enabled")
    with pytest.raises(
        LoadOptionError, match=f"{var}='enabled' is not a boolean: use 1, true, yes or on"
    ) as e:
        load_packaged("fwd", package=pkg.name)
    assert isinstance(e.value, PrecompileLoadError) and isinstance(e.value, ValueError)
    assert pkg.execs() == 0


def test_guard_env_accepts_true_spellings(monkeypatch):
    from precompile_runtime import guard_active

    for value, on in (
        ("yes", True),
        ("On", True),
        ("TRUE", True),
        ("1", True),
        ("no", False),
        ("0", False),
        ("", False),
    ):
        monkeypatch.setenv("PRECOMPILE_NO_COMPILE", value)
        assert guard_active() is on, value


@pytest.mark.parametrize(
    "option, value",
    [
        ("strict", "false"),
        ("strict", 1),
        ("strict", "yes"),
        ("cuda_graphs", 1),
        ("cuda_graphs", 0),
        ("cuda_graphs", "yes"),
    ],
)
def test_strict_and_cuda_graphs_take_bools_only(option, value, pkg):
    from precompile_runtime import LoadOptionError

    with pytest.raises(
        LoadOptionError,
        match=rf"{option}={value!r}\): use None, True or False \({option} takes a bool; this is {type(value).__name__}\)",
    ):
        load_packaged("fwd", package=pkg.name, **{option: value})
    assert pkg.execs() == 0


def test_a_numpy_bool_is_named_as_such(pkg):
    """strict=numpy.True_ is refused like any non-bool, and the message names its type
    so that it does not read 'takes a bool; this is bool'."""
    import numpy as np

    from precompile_runtime import LoadOptionError

    with pytest.raises(LoadOptionError, match=r"strict takes a bool; this is numpy\.bool"):
        load_packaged("fwd", package=pkg.name, strict=np.True_)
