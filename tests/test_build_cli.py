"""python -m precompile_build: capture, inspect, merge; exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from _build_helpers import (
    PYC,
    build,
    check_record,
    make_project,
    manifest_of,
    metadata_lines,
    read_member,
    target_toml,
    wheel_names,
)

from precompile_build.cli import main

pytestmark = pytest.mark.usefixtures("build_env")


def _wheel(tmp_path, monkeypatch, tag, mode="ok", edit=None):
    root = make_project(tmp_path / tag, target_toml(mode=mode))
    if edit:
        edit(root)
    return build(root, monkeypatch, out=tmp_path / f"dist-{tag}")


def test_capture_writes_pairs_and_manifest(tmp_path, monkeypatch, capsys):
    root = make_project(tmp_path, target_toml("a") + target_toml("b"))
    out = tmp_path / "out"
    assert main(["capture", "--project", str(root), "--targets", "a", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["a.cache", "a.py", "a" + PYC, "manifest.json"]
    )
    assert main(["inspect", str(out)]) == 0
    assert "target a (required): 1 variant(s)" in capsys.readouterr().out


def test_inspect_text_and_json(tmp_path, monkeypatch, capsys):
    whl = _wheel(tmp_path, monkeypatch, "a")
    assert main(["inspect", str(whl)]) == 0
    text = capsys.readouterr().out
    assert "simplepkg/_precompiled/manifest.json (package simplepkg)" in text
    assert "target double (required): 1 variant(s)" in text
    assert "eager on cpu" in text and "this host: matches" in text
    assert "double.py 185 B" in text
    assert main(["inspect", str(whl), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    (v,) = rep["targets"]["double"]["variants"]
    assert v["matches_host"] is True and v["mismatches"] == []
    assert v["engine"] == "eager" and v["size"] > 185


def test_inspect_reports_every_mismatch(tmp_path, monkeypatch, capsys):
    whl = _wheel(tmp_path, monkeypatch, "b", mode="cuda-fp")
    assert main(["inspect", str(whl)]) == 0
    text = capsys.readouterr().out
    assert "this host: does not match" in text
    assert "device_type: built for 'cuda', this host has 'cuda'" not in text
    assert "compute_capability: built for '9.0', this host has None" in text


def test_merge_two_hosts(tmp_path, monkeypatch, capsys):
    a = _wheel(tmp_path, monkeypatch, "a")
    b = _wheel(tmp_path, monkeypatch, "b", mode="cuda-fp")
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "merged")]) == 0
    (out,) = (tmp_path / "merged").iterdir()
    assert out.name == "simplepkg-0.1.0-py3-none-any.whl"
    check_record(out)
    m = manifest_of(out)
    va, vb = m["targets"]["double"]["variants"]
    assert va["fingerprint"]["device_type"] == "cpu"
    assert vb["fingerprint"]["device_type"] == "cuda"
    # identical source halves are stored once; differing caches get the variant id
    assert va["files"]["source"]["path"] == vb["files"]["source"]["path"] == "double.py"
    assert va["files"]["cache"]["path"] == "double.cache"
    assert vb["files"]["cache"]["path"] == f"double.{vb['id']}.cache"
    assert (
        va["bytecode"][sys.implementation.cache_tag]["path"] == "double" + PYC
    )  # listed, as built
    assert va["bytecode"] == vb["bytecode"]
    pc = [n for n in wheel_names(out) if "_precompiled" in n]
    assert pc == sorted(
        f"simplepkg/_precompiled/{n}"
        for n in (
            "double.py",
            "double" + PYC,
            "double.cache",
            f"double.{vb['id']}.cache",
            "manifest.json",
        )
    )
    assert metadata_lines(out, "Requires-Dist") == metadata_lines(a, "Requires-Dist")
    capsys.readouterr()
    assert main(["inspect", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert [v["matches_host"] for v in rep["targets"]["double"]["variants"]] == [True, False]


def _with_readme(root):
    (root / "README.md").write_text("# simplepkg\n\nInstall it.\nRequires-Dist: torch==9.9\n")
    py = root / "pyproject.toml"
    py.write_text(
        py.read_text().replace(
            'requires-python = ">=3.9"', 'requires-python = ">=3.9"\nreadme = "README.md"'
        )
    )


def test_merge_keeps_the_description_as_it_is(tmp_path, monkeypatch):
    """Only METADATA's headers are read and patched: a description line that looks like a
    header (here a README's `Requires-Dist: torch==9.9`) stays in the description."""
    a = _wheel(tmp_path, monkeypatch, "a", edit=_with_readme)
    b = _wheel(tmp_path, monkeypatch, "b", mode="cuda-fp", edit=_with_readme)
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "merged")]) == 0
    (out,) = (tmp_path / "merged").iterdir()
    check_record(out)
    body = read_member(out, ".dist-info/METADATA").decode().split("\n\n", 1)[1]
    assert body == read_member(a, ".dist-info/METADATA").decode().split("\n\n", 1)[1]
    assert "Requires-Dist: torch==9.9" in body
    assert metadata_lines(out, "Requires-Dist") == metadata_lines(a, "Requires-Dist")


def test_merge_platform_tag_wins(tmp_path, monkeypatch):
    from _build_helpers import manylinux_tag

    a = _wheel(tmp_path, monkeypatch, "a")
    b = _wheel(tmp_path, monkeypatch, "b", mode="frozen-cuda-fp")
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "m")]) == 0
    (out,) = (tmp_path / "m").iterdir()
    assert out.name == f"simplepkg-0.1.0-{manylinux_tag()}.whl"
    check_record(out)


def _bump_version(root):
    py = root / "pyproject.toml"
    py.write_text(py.read_text().replace('version = "0.1.0"', 'version = "0.2.0"'))


def _edit_code(root):
    (root / "simplepkg" / "__init__.py").write_text("X = 1\n")


@pytest.mark.parametrize(
    "edit, mode, match",
    [
        (_bump_version, "cuda-fp", "it is simplepkg 0.2.0, not simplepkg 0.1.0"),
        (_edit_code, "cuda-fp", "simplepkg/__init__.py differs"),
        (None, "ok", "variant .* is in two wheels"),
    ],
)
def test_merge_refuses(tmp_path, monkeypatch, capsys, edit, mode, match):
    a = _wheel(tmp_path, monkeypatch, "a")
    b = _wheel(tmp_path, monkeypatch, "b", mode=mode, edit=edit)
    capsys.readouterr()
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "m")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: Failed to merge") and len(err.splitlines()) == 1
    import re

    assert re.search(match, err)
    assert not (tmp_path / "m").exists() or list((tmp_path / "m").iterdir()) == []


def test_exit_codes(tmp_path, capsys):
    root = make_project(tmp_path, '[tool.precompile.targets.a]\nscirpt = "x.py"\n')
    assert main(["capture", "--project", str(root)]) == 2
    assert capsys.readouterr().err.startswith("error: Failed to validate `tool.precompile`")
    assert main(["inspect", str(tmp_path / "missing.whl")]) == 1
    assert capsys.readouterr().err.startswith("error: Failed to inspect")
    proc = subprocess.run(
        [sys.executable, "-m", "precompile_build", "bogus"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
    proc = subprocess.run(
        [sys.executable, "-m", "precompile_build", "inspect", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: Failed to inspect")


def test_ci_workflow_merge_job_on_wheels_of_three_hosts(tmp_path, monkeypatch):
    """The merge job of docs/github-actions-wheels.yml (its BEGIN/END merge-check
    block, run as written) on wheels built with three fingerprints: a CPU host and
    two GPU architectures."""
    import os
    import shutil
    import textwrap
    from pathlib import Path

    pytest.importorskip("twine")
    repo = Path(__file__).resolve().parents[1]
    text = (repo / "docs" / "github-actions-wheels.yml").read_text()
    block = text.split("# BEGIN merge-check\n")[1].split("# END merge-check")[0]
    script = textwrap.dedent(block)
    parts = tmp_path / "job" / "parts"
    parts.mkdir(parents=True)
    monkeypatch.setenv("PRECOMPILE_CACHE", "off")  # the fixture's fingerprint is no key part

    def readme(root):  # twine check --strict wants a description
        py = root / "pyproject.toml"
        py.write_text(
            py.read_text().replace(
                'requires-python = ">=3.9"\n',
                'requires-python = ">=3.9"\n'
                'readme = {text = "A fixture.", content-type = "text/markdown"}\n',
            )
        )

    cpu = _wheel(tmp_path, monkeypatch, "cpu", mode="frozen", edit=readme)
    sm90 = _wheel(tmp_path, monkeypatch, "sm90", mode="frozen-cuda-fp", edit=readme)
    fp = json.loads(os.environ["FIXTURE_FINGERPRINT"])
    fp.update(device_type="cuda", compute_capability="8.0", gpu_name="Fixture A100")
    monkeypatch.setenv("FIXTURE_FINGERPRINT", json.dumps(fp))
    sm80 = _wheel(tmp_path, monkeypatch, "sm80", mode="frozen", edit=readme)
    for name, w in (("cpu", cpu), ("sm90", sm90), ("sm80", sm80)):
        (parts / f"wheel-{name}").mkdir()  # download-artifact: one folder per artifact
        shutil.copy(w, parts / f"wheel-{name}" / w.name)  # (the names may be equal)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bindir / "python").chmod(0o755)
    env = dict(
        os.environ,
        PATH=f"{bindir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=os.pathsep.join([str(repo), str(repo / "runtime")]),
    )
    proc = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path / "job",
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "double: 3 variants for torch" in proc.stdout
    (merged,) = (tmp_path / "job" / "dist").iterdir()
    check_record(merged)
    variants = manifest_of(merged)["targets"]["double"]["variants"]
    assert sorted(
        (v["fingerprint"]["device_type"], v["fingerprint"].get("compute_capability") or "")
        for v in variants
    ) == [("cpu", ""), ("cuda", "8.0"), ("cuda", "9.0")]
    assert "manylinux_" in merged.name


_GATED = """
import torch

import precompile_build


class Gated(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.doubled = torch.nn.Linear(4, 4), True

    def forward(self, x):
        return self.lin(x) * (2 if self.doubled else 1)


m = Gated().eval()
m.lin.register_forward_hook(lambda mod, args, out: out + 1)
with torch.no_grad(), precompile_build.capture(lambda model, x: model(x), engine="eager",
                                               tracer="{tracer}") as f:
    f(m, torch.randn(2, 4))
"""


@pytest.mark.parametrize("tracer", ["export", "make_fx"])
def test_manifest_and_inspect_name_the_tracer_and_the_checks(tmp_path, capsys, tracer):
    """The variant says what traced it and how much Python state each call checks: the
    module's flag (``doubled``), the hook that ran, and the settings the trace read."""
    root = make_project(
        tmp_path, '[tool.precompile.targets.gated]\nscript = "captures/gated.py"\ndevice = "cpu"\n'
    )
    (root / "captures").mkdir()
    (root / "captures" / "gated.py").write_text(_GATED.replace("{tracer}", tracer))
    out = tmp_path / "out"
    assert main(["capture", "--project", str(root), "--out", str(out)]) == 0, (
        capsys.readouterr().err
    )
    (v,) = json.loads((out / "manifest.json").read_text())["targets"]["gated"]["variants"]
    assert v["tracer"] == tracer
    assert (
        v["checks"]["hooks"] == 1 and v["checks"]["attributes"] >= 1 and v["checks"]["globals"] == 0
    )
    assert v["checks"]["guards"] >= 1  # the guards Dynamo built (capturing/dynamo_guards.py)
    capsys.readouterr()
    assert main(["inspect", str(out)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "traced with" in ln)

    def n(key, word):  # "1 hook", "2 attributes" (was "1 hooks", "1 attributes")
        return f"{v['checks'][key]} {word}" + ("" if v["checks"][key] == 1 else "s")

    assert line.strip() == (
        f"traced with {tracer}; each call checks {n('guards', 'guard')}, "
        f"{n('attributes', 'attribute')}, 1 hook the trace assumed"
    )


def test_merge_names_a_renamed_source_halfs_shipped_bytecode_for_it():
    from precompile_build.wheels.merge import _shipped_bytecode

    files = {
        "double.py": b"src",
        "double" + PYC: b"pyc",
        "double.cpython-399.pyc": b"other python",
        "double.v2.cpython-311.pyc": b"another variant's",
        "doubles" + PYC: b"another target's",
    }
    assert _shipped_bytecode(files, "double.py", "double.abc.py") == {
        "double.abc" + PYC: b"pyc",
        "double.abc.cpython-399.pyc": b"other python",
    }
    assert _shipped_bytecode(files, "double.py", "double.py") == {
        "double" + PYC: b"pyc",
        "double.cpython-399.pyc": b"other python",
    }
