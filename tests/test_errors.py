"""Errors carry their context as fields and format their own message; code that
catches one reads the fields (precompile_build.errors, precompile_runtime.errors)."""

from __future__ import annotations

import pickle

import pytest

from precompile_build.errors import (
    CaptureError,
    CompilerFailed,
    ScriptFailed,
    in_target,
    warn_at_caller,
)
from precompile_runtime.errors import IntegrityError, PrecompileLoadError


def test_a_capture_error_formats_its_target_prefix():
    e = CaptureError("the function returned a str", target="fwd")
    assert str(e) == "target 'fwd': the function returned a str"
    assert (e.target, e.detail, e.where) == ("fwd", "the function returned a str", None)
    k = CaptureError("has 2 launchers", target="fwd", where="Triton kernel 'k0'")
    assert str(k) == "target 'fwd', Triton kernel 'k0': has 2 launchers"
    assert str(CaptureError("no target yet")) == "no target yet"
    assert in_target("fwd", "x") == "target 'fwd': x"


def test_for_target_names_the_target_once():
    inner = CaptureError("an argument is a str")
    outer = inner.for_target("fwd")
    assert type(outer) is CaptureError and str(outer) == "target 'fwd': an argument is a str"
    assert outer.for_target("other") is outer  # a target already named stays


@pytest.mark.parametrize(
    "err",
    [
        CaptureError("d", target="t", where="w"),
        CompilerFailed("Inductor failed", target="t", traced=("graph",), real={"outputs": []}),
        ScriptFailed("exited with status 1", target="t", log_tail="\nlog", seconds=1.5),
    ],
)
def test_fields_survive_pickle(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err) and vars(back) == vars(err)


def test_subclasses_keep_their_data():
    c = CompilerFailed("Inductor failed: boom", target="t", traced="T", real="R")
    assert str(c) == "target 't': Inductor failed: boom" and (c.traced, c.real) == ("T", "R")
    assert isinstance(c.for_target("u"), CompilerFailed)
    s = ScriptFailed("exited with status 1", target="t", log_tail="\ntail", seconds=2.0)
    assert str(s) == "Capture of target 't' failed: exited with status 1\ntail" and s.seconds == 2.0
    assert isinstance(s, CaptureError)


def test_a_warning_about_a_target_has_the_same_prefix():
    with pytest.warns(UserWarning) as got:
        warn_at_caller("a parameter is marked dynamic", target="fwd")
    assert str(got[0].message) == "target 'fwd': a parameter is marked dynamic"


def test_a_load_error_formats_its_parts_and_keeps_them():
    e = IntegrityError(
        "size check failed: 3 vs 4",
        context="package 'p', target 'f'",
        where="_precompiled/f.py",
        advice="reinstall the package",
    )
    assert (
        str(e)
        == "package 'p', target 'f': _precompiled/f.py: size check failed: 3 vs 4; reinstall the package"
    )
    assert (e.finding, e.where, e.advice) == (
        "size check failed: 3 vs 4",
        "_precompiled/f.py",
        "reinstall the package",
    )
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is IntegrityError and str(back) == str(e) and back.where == e.where
    assert str(PrecompileLoadError("one message")) == "one message"


def test_the_runtime_raises_its_errors_with_their_fields(tmp_path, monkeypatch):
    """The manifest reader's, the loader's and the pair format's raises keep where they
    are and what to do as fields, the message made of them (the text stays as it was)."""
    import json

    from _fake_packages import make_package, on_path

    from precompile_runtime import (
        ManifestError,
        PairFormatError,
        TargetNotFoundError,
        load_packaged,
    )
    from precompile_runtime import manifest as manifest_format
    from precompile_runtime.pair_format import check_version

    doc = {"format": manifest_format.FORMAT, "version": 9, "targets": {}}
    with pytest.raises(ManifestError) as e:
        manifest_format.parse(
            json.dumps(doc).encode(), where="_precompiled/manifest.json", context="package 'p'"
        )
    assert (e.value.context, e.value.where, e.value.advice) == (
        "package 'p'",
        "_precompiled/manifest.json",
        "upgrade precompile-runtime",
    )
    assert str(e.value) == (
        "package 'p': _precompiled/manifest.json: manifest format version 9 is newer than "
        "this precompile-runtime reads (1); upgrade precompile-runtime"
    )
    doc = {
        "format": manifest_format.FORMAT,
        "version": 1,
        "targets": {"t": {"variants": [{"engine": "jit"}]}},
    }
    with pytest.raises(ManifestError) as e:
        manifest_format.parse(json.dumps(doc).encode(), where="m")
    assert (e.value.where, e.value.finding) == ("m: target 't' variant 0", "unknown engine 'jit'")

    monkeypatch.setenv("PRECOMPILE_CACHE_DIR", str(tmp_path / "kcache"))
    p = on_path(monkeypatch, make_package(tmp_path))
    with pytest.raises(TargetNotFoundError) as e:
        load_packaged("nope", package=p.name)
    assert (e.value.context, e.value.finding) == (
        f"package {p.name!r}, target 'nope'",
        "no such target",
    )
    assert e.value.advice == "the package has 'fwd'"
    assert pickle.loads(pickle.dumps(e.value)).advice == e.value.advice

    with pytest.raises(PairFormatError) as e:
        check_version({"format": "other"}, where="fwd.py")
    assert (e.value.where, e.value.advice) == ("fwd.py", "rebuild the wheel")
