"""Publishable wheels (issue 16): no torch in the build, the build summary, honest
metadata, the platform tag, editable installs that never go stale, file modes."""

from __future__ import annotations

import sys

import pytest

from _build_helpers import (_clean_env, build, check_record, host_fp_json,  # noqa: F401
                            make_project, manifest_of, metadata_lines, read_member,
                            target_toml, wheel_names)
from precompile_build.errors import CaptureError


# -- issue 16 case 4: no torch where the build runs ---------------------------------

def test_no_torch_in_the_build_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # what find_spec sees without torch
    root = make_project(tmp_path)
    with pytest.raises(CaptureError, match=r"torch is not installed where the build runs "
                       r".*`build-system.requires`.*--no-isolation"):
        build(root, monkeypatch)
    assert not (tmp_path / "dist").exists() or list((tmp_path / "dist").iterdir()) == []


def test_failed_fingerprint_turns_the_cache_off_not_a_key_error(tmp_path, monkeypatch, capfd):
    from precompile_build import capture_cache

    def broken(*a, **k):
        raise CaptureError("Failed to compute the host fingerprint: No module named 'torch'")

    monkeypatch.setattr(capture_cache, "host_fingerprints", broken)
    whl = build(make_project(tmp_path), monkeypatch)
    assert "double.cache" in " ".join(wheel_names(whl))
    assert "capture cache unavailable for this build" in capfd.readouterr().err


# -- issue 16 case 5: which torch the artifacts are for -----------------------------

def test_summary_names_the_torch_the_artifacts_are_for(tmp_path, monkeypatch, capfd):
    import json
    import os

    fp = json.loads(os.environ["FIXTURE_FINGERPRINT"])
    build(make_project(tmp_path), monkeypatch)
    err = capfd.readouterr().err
    line = [ln for ln in err.splitlines() if "the artifacts are for" in ln]
    assert line == [f"precompile: the artifacts are for torch {fp['torch']}, CUDA "
                    f"{fp['cuda'] or 'none'}, Triton {fp['triton'] or 'none'}, Python "
                    f"{fp['python']}, {fp['platform']} (another torch: pin it in "
                    "`build-system.requires`, or build with --no-isolation where it is "
                    "installed)"]
