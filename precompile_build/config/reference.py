"""The generated reference pages: docs/settings.md, every `[tool.precompile]` key from
the table in fields.py, documented by the docstrings under the settings dataclasses'
fields; docs/capture-environment.md, the capture script's variables (capture_env.py).

``python -m precompile_build.config.reference > docs/settings.md``, ``python -m
precompile_build.config.reference environment > docs/capture-environment.md``; tests
keep each page equal to its table.
"""

from __future__ import annotations

import ast
import inspect

from . import target_names
from .capture_env import VARIABLES
from .fields import PROJECT_KEYS, TARGET_KEYS
from .settings import Settings, TargetSettings


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated field of dataclass ``cls``, by name."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    out = {}
    for stmt, nxt in zip(body, body[1:]):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return out


def reference() -> str:
    """docs/settings.md: every key, where it may be set, its override and what it does."""
    lines = [
        "# Settings reference",
        "",
        "Generated from `precompile_build/config/fields.py` (by `precompile_build/config/reference.py`) and the docstrings of "
        "`Settings` / `TargetSettings` (`python -m precompile_build.config.reference > "
        "docs/settings.md`); a test keeps them equal. Overrides: `-C precompile.KEY=VALUE` "
        "(PEP 517 config settings) and the environment variable; the environment wins over "
        "config settings, which win over pyproject.toml.",
        "",
    ]
    for title, keys, cls, prefix in (
        ("`[tool.precompile]`", PROJECT_KEYS, Settings, "tool.precompile"),
        (
            "`[tool.precompile.targets.NAME]`",
            TARGET_KEYS,
            TargetSettings,
            "tool.precompile.targets.NAME",
        ),
    ):
        docs = field_docs(cls)
        if cls is Settings:
            docs["cuda_archs"] = (
                "The default `cuda-archs` of the CUDA targets: "
                + field_docs(TargetSettings)["cuda_archs"]
            )
            docs["mode"] = (
                "The default `mode` of the targets: " + field_docs(TargetSettings)["mode"]
            )
        lines += [f"## {title}", ""]
        if cls is TargetSettings:  # the table's key (config/target_names.py)
            lines += [
                f"`NAME`, the table's key, names the target and its files: {target_names.RULE}.",
                "",
            ]
        lines += ["| key | in pyproject.toml | override | meaning |", "| --- | --- | --- | --- |"]
        for k in keys:
            where = f"`{prefix}.{k.key}`" if k.toml else "no"
            over = f"`-C precompile.{k.key}`, `{k.env}`" if k.env else "-"
            doc = docs[k.attr]
            if cls is Settings and k.key == "targets":
                doc = (
                    "The target tables (below); as an override, a comma-separated selection: " + doc
                )
            lines.append(f"| `{k.key}` | {where} | {over} | {doc.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


def capture_environment() -> str:
    """docs/capture-environment.md: every variable of capture_env.VARIABLES."""
    lines = [
        "# The capture script's environment",
        "",
        "Generated from `precompile_build/config/capture_env.py` (by "
        "`precompile_build/config/reference.py`: `python -m precompile_build.config.reference "
        "environment > docs/capture-environment.md`); a test keeps them equal.",
        "",
        "The build runs each capture script as `python SCRIPT ARGS...` in a subprocess, in "
        "the project root (its working directory), with the folder that holds the package "
        "first on `PYTHONPATH` (the script imports the library being built as it is: no "
        "`sys.path` edits needed), the target's `env` table added, and these variables set. `precompile_build.capture()` reads them, so a capture script "
        "passes no paths; run by hand, it needs `artifact_path=` and `cache_path=` (or "
        "`python -m precompile_build capture`, which sets them). The overrides of "
        "`[tool.precompile]` keys (`PRECOMPILE_SKIP`, `PRECOMPILE_TARGETS`, ...) are in "
        "[the settings reference](settings.md).",
        "",
        "| variable | holds | set by | read by |",
        "| --- | --- | --- | --- |",
    ]
    for v in VARIABLES:
        lines.append(f"| `{v.name}` | {v.value} | {v.set_by} | {v.read_by} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    print(capture_environment() if sys.argv[1:] == ["environment"] else reference(), end="")
