"""The manifest's schema is the TypedDicts of precompile_runtime/manifest.py: its
documented example is valid JSON the reader accepts and the schema describes, and what
the build writes (assemble, mark_editable) keeps to it (tests/test_capture_stats.py
checks a manifest with the capture's peaks and seconds too)."""

from __future__ import annotations

import json

import pytest
from typeguard import TypeCheckError, check_type

from precompile_runtime import manifest


def _example() -> dict:
    doc = manifest.__doc__ or ""
    return json.loads(doc.split("::\n\n", 1)[1].split("\n\nA failed", 1)[0])


def test_the_documented_example_is_a_manifest():
    example = _example()
    assert manifest.parse(json.dumps(example).encode(), where="example") == example
    check_type(example, manifest.Manifest)


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["targets"]["forward"].update(status="skipped"),
        lambda d: d["targets"]["forward"]["variants"][0].update(engine="inductor"),
        lambda d: d["targets"]["forward"]["variants"][0].pop("files"),
        lambda d: d.update(editable={"package_dir": "/src"}),  # without its digest
    ],
)
def test_the_schema_refuses_what_it_does_not_describe(change):
    doc = _example()
    change(doc)
    with pytest.raises(TypeCheckError):
        check_type(doc, manifest.Manifest)


def test_what_the_build_writes_is_a_manifest(tmp_path, monkeypatch):
    """An assembled manifest of an ok and a failed target, and its editable form."""
    import hashlib

    from precompile_build.builder.pairs import PairInfo
    from precompile_build.builder.runner import CaptureResult
    from precompile_build.wheels.manifest import MANIFEST_NAME, assemble, mark_editable

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    src, cache = tmp_path / "fwd.py", tmp_path / "fwd.cache"
    src.write_bytes(b"PRECOMPILE_METADATA = {}\n")
    cache.write_bytes(b"cache")
    info = PairInfo(
        "eager", hashlib.sha256(src.read_bytes()).hexdigest(), {"device_type": "cpu"}, "cpu", {}
    )
    results = [
        CaptureResult(
            "fwd", "ok", True, "cpu", info=info, source_path=src, cache_path=cache, seconds=1.25
        ),
        CaptureResult("opt", "failed", False, "cpu", reason="exited with status 3"),
    ]
    files = assemble("pkg", results)
    doc = json.loads(files[MANIFEST_NAME])
    check_type(doc, manifest.Manifest)
    assert doc["targets"]["opt"] == {
        "required": False,
        "status": "failed",
        "reason": "exited with status 3",
        "variants": [],
    }
    editable = json.loads(mark_editable(files, tmp_path, "0" * 64)[MANIFEST_NAME])
    check_type(editable, manifest.Manifest)
    assert editable["editable"] == {
        "package_dir": str(tmp_path.resolve()),
        "package_sha256": "0" * 64,
    }
