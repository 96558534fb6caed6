"""A source half of another pair format or version is refused at load, with what to do
(precompile_runtime/pair_format.py)."""

from __future__ import annotations

import re
import warnings

import pytest
from _fake_packages import (
    FakePkg,
    file_entry,
    make_package,
    make_pair,
    make_source,
    on_path,
)

import precompile_runtime
from precompile_runtime import (
    HostMismatchWarning,
    PairFormatError,
    envelope,
    load_packaged,
    pair_format,
)

pytestmark = pytest.mark.usefixtures("runtime_env")


def _with_source(p: FakePkg, source: bytes, engine: str = "frozen") -> None:
    """Replace target fwd's source half (its cache and manifest entry follow it)."""
    cache = make_pair(source, engine)
    (p.data / "fwd.py").write_bytes(source)
    (p.data / "fwd.cache").write_bytes(cache)
    doc = p.manifest()
    variant = doc["targets"]["fwd"]["variants"][0]
    variant["code_hash"] = envelope.sha256_hex(source)
    variant["files"] = {
        "source": file_entry("fwd.py", source),
        "cache": file_entry("fwd.cache", cache),
    }
    p.write_manifest(doc)


@pytest.mark.parametrize(
    "version, shown, advice",
    [
        ("2", "2", "upgrade precompile-runtime (pip install -U precompile-runtime) to load it"),
        ("0", "0", "rebuild the wheel with a current precompile-build"),
        ('"1"', "'1'", "rebuild the wheel with a current precompile-build"),
    ],
)
@pytest.mark.parametrize("fallback", [False, True])
def test_a_pair_of_another_format_version_is_refused(
    tmp_path, monkeypatch, version, shown, advice, fallback
):
    """A source half of a format version this runtime does not read never serves: not
    its kernels, nor (on a host it was not built for) its fallback."""
    p = on_path(
        monkeypatch, make_package(tmp_path, {"fwd": [{"torch": "0.0.1"}]} if fallback else None)
    )
    _with_source(
        p, make_source(p.marker, "fwd").replace(b'"version": 1', f'"version": {version}'.encode())
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HostMismatchWarning)
        with pytest.raises(PairFormatError) as e:
            load_packaged("fwd", package=p.name)
    assert str(e.value) == (
        f"package {p.name!r}, target 'fwd': _precompiled/fwd.py: the pair is of format version "
        f"{shown}, and precompile-runtime "
        f"{precompile_runtime.__version__} reads version 1; {advice}"
    )


def test_a_source_of_another_format_is_refused(tmp_path, monkeypatch):
    p = on_path(monkeypatch, make_package(tmp_path))
    _with_source(p, make_source(p.marker, "fwd").replace(b'"precompile-build.source"', b'"other"'))
    with pytest.raises(
        PairFormatError,
        match=r"_precompiled/fwd.py: not a precompile-build source "
        r"half \(PRECOMPILE_METADATA format 'other', not 'precompile-build.source'\); "
        "rebuild the wheel",
    ):
        load_packaged("fwd", package=p.name)


def test_what_codegen_writes_is_what_the_runtime_reads():
    """The version a rendered source half carries is one the runtime loads, and the
    build's check of a pair (builder/pairs.py) reads it back."""
    import ast

    from precompile_build.builder.pairs import read_source_metadata
    from precompile_build.engines import codegen
    from precompile_runtime import pair_format

    text = codegen.render(
        {"engine": "eager", "target": "fwd", "device": "cpu"},
        "def _graph(self):\n    return ()\n\n\n_GRAPH_SELF = None\n",
        None,
    )
    literal = next(
        n.value
        for n in ast.parse(text).body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "PRECOMPILE_METADATA"
    )
    meta = ast.literal_eval(literal)
    assert pair_format.version_problem(meta) is None
    pair_format.check_version(meta, where="fwd.py")
    assert read_source_metadata(text.encode(), what="pair")["version"] == meta["version"]


@pytest.mark.parametrize("version", [0, -1, True, 1.0, "1", None, pair_format.READS[1] + 1])
def test_one_version_rule_for_the_build_and_the_runtime(version):
    """0, a negative, a bool (True == 1), a float, a string, none at all, a newer one:
    the runtime refuses to load them, so the build's check of a pair refuses them too."""
    from precompile_build.builder.pairs import read_source_metadata
    from precompile_build.errors import CaptureError

    meta = {"format": pair_format.FORMAT, "version": version}
    finding, _ = pair_format.version_problem(meta)
    with pytest.raises(PairFormatError) as e:
        pair_format.check_version(meta, where="fwd.py")
    assert (e.value.where, e.value.finding) == ("fwd.py", finding)
    source = f"PRECOMPILE_METADATA = {meta!r}\n".encode()
    with pytest.raises(
        CaptureError, match=re.escape(f"Failed to validate pair source: {finding}: ")
    ):
        read_source_metadata(source, what="pair source")


def test_a_newer_pair_whose_code_fails_here_is_a_format_error(tmp_path, monkeypatch):
    """A newer format's source may fail while it runs (its driver reads fields this
    format lacks): the load says to upgrade, not what the failure was."""
    p = on_path(monkeypatch, make_package(tmp_path))
    source = make_source(p.marker, "fwd").replace(b'"version": 1', b'"version": 2')
    _with_source(p, source + b'\n_IN = PRECOMPILE_METADATA["inputs_v2"]\n')
    with pytest.raises(PairFormatError, match=r"format version 2, .*upgrade precompile-runtime"):
        load_packaged("fwd", package=p.name)
    assert p.execs() == 1  # the one run of its text: nothing of it served
