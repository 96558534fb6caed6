"""The one table of `[tool.precompile]` keys and their overrides.

Each :class:`Key` names a TOML key (kebab-case), the :class:`~.settings.Settings` or
:class:`~.settings.TargetSettings` attribute it sets, whether pyproject.toml may set it
and the environment variable that overrides it (with ``-C precompile.KEY``). settings.py
derives the accepted keys and the overrides from it, and :func:`reference` the settings
reference in docs/settings.md from it and the attributes' docstrings (a test keeps the
two equal: regenerate with ``python -m precompile_build.settings_fields > docs/settings.md``).
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Key:
    """One key of `[tool.precompile]` or of its targets."""

    key: str
    """The kebab-case name: the TOML key and the config setting ``precompile.KEY``."""
    attr: str
    """The settings attribute it sets."""
    toml: bool = True
    """pyproject.toml may set it (False: an override only)."""
    env: Optional[str] = None
    """The environment variable that overrides it (with ``-C precompile.KEY``), or None."""


# [tool.precompile]; in this order: TOML keys and overrides are listed (and suggested)
# in it. Names the runtime also reads get a BUILD_ infix (PRECOMPILE_STRICT,
# PRECOMPILE_CACHE_DIR).
PROJECT_KEYS = (
    Key("package", "package"),
    Key("skip", "skip", toml=False, env="PRECOMPILE_SKIP"),
    Key("targets", "selected", env="PRECOMPILE_TARGETS"),
    Key("strict", "strict", toml=False, env="PRECOMPILE_BUILD_STRICT"),
    Key("verbose", "verbose", toml=False, env="PRECOMPILE_VERBOSE"),
    Key("torch-pin", "torch_pin", env="PRECOMPILE_TORCH_PIN"),
    Key("cache", "cache", env="PRECOMPILE_CACHE"),
    Key("cache-dir", "cache_dir", env="PRECOMPILE_BUILD_CACHE_DIR"),
    Key("jobs", "jobs", env="PRECOMPILE_JOBS"),
    Key("cuda-archs", "cuda_archs", env="PRECOMPILE_CUDA_ARCHS"),  # the targets' default
)
# [tool.precompile.targets.NAME]
TARGET_KEYS = (
    Key("script", "script_rel"),
    Key("args", "args"),
    Key("device", "device"),
    Key("timeout", "timeout"),
    Key("env", "env"),
    Key("required", "required"),
    Key("cache-env", "cache_env"),
    Key("fallback", "fallback"),
    Key("tracer", "tracer"),
    Key("cuda-graphs", "cuda_graphs"),
    Key("cuda-archs", "cuda_archs"),
)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated field of dataclass ``cls``, by name."""
    body = ast.parse(inspect.getsource(cls)).body[0].body  # type: ignore[attr-defined]
    out = {}
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            out[stmt.target.id] = " ".join(inspect.cleandoc(nxt.value.value).split())
    return out


def reference() -> str:
    """docs/settings.md: every key, where it may be set, its override and what it does."""
    from .settings import Settings, TargetSettings

    lines = ["# Settings reference", "",
             "Generated from `precompile_build/settings_fields.py` and the docstrings of "
             "`Settings` / `TargetSettings` (`python -m precompile_build.settings_fields > "
             "docs/settings.md`); a test keeps them equal. Overrides: `-C precompile.KEY=VALUE` "
             "(PEP 517 config settings) and the environment variable; the environment wins over "
             "config settings, which win over pyproject.toml.", ""]
    for title, keys, cls, prefix in (
            ("`[tool.precompile]`", PROJECT_KEYS, Settings, "tool.precompile"),
            ("`[tool.precompile.targets.NAME]`", TARGET_KEYS, TargetSettings, "tool.precompile.targets.NAME")):
        docs = field_docs(cls)
        if cls is Settings:
            docs["cuda_archs"] = ("The default `cuda-archs` of the CUDA targets: "
                                  + field_docs(TargetSettings)["cuda_archs"])
        lines += [f"## {title}", "", "| key | in pyproject.toml | override | meaning |",
                  "| --- | --- | --- | --- |"]
        for k in keys:
            where = f"`{prefix}.{k.key}`" if k.toml else "no"
            over = f"`-C precompile.{k.key}`, `{k.env}`" if k.env else "-"
            doc = docs[k.attr]
            if cls is Settings and k.key == "targets":
                doc = "The target tables (below); as an override, a comma-separated selection: " + doc
            lines.append(f"| `{k.key}` | {where} | {over} | {doc.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(reference(), end="")
