"""The capture script's environment is one table (precompile_build/config/capture_env.py):
its reference page is generated from it, the build sets what it says the build sets,
and no module spells a variable's name but the table."""

from __future__ import annotations

import ast
from pathlib import Path

from precompile_build.config import capture_env, reference

ROOT = Path(__file__).resolve().parents[1]


def test_the_reference_page_is_generated_from_the_table():
    page = ROOT / "docs" / "capture-environment.md"
    assert page.read_text(encoding="utf-8") == reference.capture_environment(), (
        "regenerate: python -m precompile_build.config.reference environment > docs/capture-environment.md"
    )
    assert len({v.name for v in capture_env.VARIABLES}) == len(capture_env.VARIABLES)


def test_no_module_spells_a_variable_but_the_table():
    """A variable's name as a string of its own (``os.environ["PRECOMPILE_..."]``) is
    read through the table's constant; messages and docstrings may name it."""
    names = {v.name for v in capture_env.VARIABLES}
    found = []
    for path in sorted((ROOT / "precompile_build").rglob("*.py")):
        if path.name in (
            "capture_env.py",
            "imported.py",
            "run_script.py",
        ):  # these run alone: checked below
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
            if isinstance(node, ast.keyword) and node.arg in names:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.arg}=")
    assert found == []


def test_the_build_sets_the_variables_the_table_says_it_sets(tmp_path, monkeypatch):
    """builder/script.py's environment for a CUDA capture with every target option set
    has each variable the table says the build sets; a CPU capture drops cuda-archs."""
    from precompile_build.builder.script import script_env
    from precompile_build.config.settings import settings_from_table

    for name in {v.name for v in capture_env.VARIABLES}:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "cap.py").write_text("")
    target = {
        "script": "cap.py",
        "tracer": "make_fx",
        "fallback": "eager",
        "cuda-graphs": True,
        "cuda-archs": ["8.0", "9.0"],
        "device": "cuda",
        "mode": "max-autotune",
    }
    s = settings_from_table(tmp_path, {"package": "pkg", "targets": {"a": target}})
    env = script_env(s, s.targets["a"], "cuda", tmp_path / "a.py", tmp_path / "a.cache", "0")
    set_here = {v.name for v in capture_env.VARIABLES if v.set_by.startswith("the build")}
    # the stats, started and capture-id variables are added by run_script, beside the log
    assert set_here - set(env) == {
        capture_env.STATS_PATH,
        capture_env.SCRIPT_STARTED,
        capture_env.CAPTURE_ID,
    }
    assert env[capture_env.TARGET] == "a" and env[capture_env.DEVICE] == "cuda"
    assert (env[capture_env.TRACER], env[capture_env.FALLBACK]) == ("make_fx", "eager")
    assert (env[capture_env.CUDA_GRAPHS], env[capture_env.CUDA_ARCHS]) == ("1", "8.0,9.0")
    assert env[capture_env.MODE] == "max-autotune"
    monkeypatch.setenv(capture_env.CUDA_ARCHS, "7.5")  # the user's own: not a CPU capture's
    assert capture_env.CUDA_ARCHS not in script_env(
        s, s.targets["a"], "cpu", tmp_path / "a.py", tmp_path / "a.cache", None
    )


def test_the_imports_record_spells_the_tables_names():
    """process/imported.py runs alone in the build's check (no package to import the
    table from), so it spells its variables; they are the table's."""
    from precompile_build.process import imported

    assert (imported.RECORD_ENV, imported.ROOT_ENV, imported.PACKAGE_ENV) == (
        capture_env.IMPORTS_PATH,
        capture_env.PROJECT_ROOT,
        capture_env.PACKAGE_DIR,
    )


def test_the_script_runner_spells_the_tables_names():
    """programs/run_script.py imports nothing of the package before the capture script
    runs, so it spells the variables it reads; they are the table's and world.py's."""
    from precompile_build.process import world
    from precompile_build.programs import run_script

    assert (run_script.STARTED_ENV, run_script.WORLD_ENV) == (
        capture_env.SCRIPT_STARTED,
        world.MODE_ENV,
    )
