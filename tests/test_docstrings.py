"""Public functions and dataclasses of the build side say what they take and give
(the project's rule: argument and return shapes, units, errors raised and when)."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

FUNCTIONS = [
    ("precompile_build.validation.numerics", "judge"),
    ("precompile_build.capturing.graph_attrs", "constant_specs"),
    ("precompile_build.wheels.platform_tags", "kernel_files"),
    ("precompile_build.wheels.platform_tags", "decide_platform"),
    ("precompile_build.capturing.tracing", "run_real_call"),
    ("precompile_build.capturing.collectives", "group_ranks"),
    ("precompile_build.backend", "static_dependencies_gap"),
]
DATACLASSES = [
    ("precompile_build.validation.numerics", "Verdict"),
    ("precompile_build.capturing.tracers", "Traced"),
    ("precompile_build.config.settings", "TargetSettings"),
    ("precompile_build.config.settings", "Settings"),
]


@pytest.mark.parametrize("module, name", FUNCTIONS)
def test_function_docstring_gives_arguments_returns_and_errors(module, name):
    doc = inspect.getdoc(getattr(importlib.import_module(module), name)) or ""
    for section in ("Args:", "Returns:", "Raises:"):
        assert section in doc, f"{module}.{name}: no {section!r} section"


@pytest.mark.parametrize("module, name", DATACLASSES)
def test_every_dataclass_field_has_a_docstring(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert inspect.getdoc(cls)
    body = ast.parse(inspect.getsource(cls)).body[0].body
    missing = [
        stmt.target.id
        for stmt, nxt in zip(body, body[1:] + [None])
        if isinstance(stmt, ast.AnnAssign)
        and not (
            isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        )
    ]
    assert missing == [], f"{module}.{name}: fields without a docstring: {missing}"
