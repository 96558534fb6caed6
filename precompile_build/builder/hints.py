"""What a failed capture script's reason adds when the cause is a known set-up mistake:
a module the build environment lacks (an isolated build installs only
`build-system.requires`), or a file beside the script named like a module it imports
(the script's folder is first on its ``sys.path``, so the import finds that file)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Optional

_MISSING = re.compile(r"^ModuleNotFoundError: No module named '([^'.]+)[^']*'")


def missing_module(error: Optional[str]) -> Optional[str]:
    """The hint for ``error`` (the script's exception line, ``Type: message``) when it
    is a ModuleNotFoundError, else None."""
    m = _MISSING.match(error or "")
    if m is None:
        return None
    name = m.group(1)
    return (
        f"`{name}` is not installed where the build runs: an isolated build (`python -m "
        "build`, `pip wheel .`, `pip install .`) installs only `build-system.requires` "
        f"of pyproject.toml, so add {name}'s distribution there (pinned to the version "
        "the artifacts are for), or build with --no-isolation where it is installed"
    )


def shadowing_files(script: Path) -> list[str]:
    """The ``.py`` files in the script's folder (the script too) named like a module
    that is importable elsewhere (the standard library, or installed where the build
    runs): an ``import`` of that name in the script's process finds the file instead."""
    out = []
    for path in sorted(script.parent.glob("*.py")):
        name = path.stem
        if name == "__init__" or not name.isidentifier():
            continue
        if name in getattr(sys, "stdlib_module_names", ()) or name in sys.builtin_module_names:
            out.append(path.name)
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin != str(path):
            out.append(path.name)
    return out


def shadowing(script: Path) -> Optional[str]:
    """The hint for a failed script with :func:`shadowing_files` beside it, else None."""
    files = shadowing_files(script)
    if not files:
        return None
    names = ", ".join(f"{script.parent.name}/{f}" for f in files)
    modules = ", ".join(f"`{Path(f).stem}`" for f in files)
    return (
        f"{names} is named like the module {modules}: the script's folder comes first "
        "on its sys.path, so `import` of that name (by the script or by a library it "
        "imports, torch included) finds this file instead; rename it"
    )


def hints(error: Optional[str], script: Path) -> str:
    """``"; hint"`` for each known mistake behind a failed script (``""`` for none)."""
    return "".join(f"; {h}" for h in (missing_module(error), shadowing(script)) if h)
