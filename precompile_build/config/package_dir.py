"""The import package that receives `_precompiled/`: the `package` key, or the one
package the project's root (or its ``src/``) holds.
"""

from __future__ import annotations

from pathlib import Path

from .messages import PREFIX, fail

__all__ = ["find_package"]

_NOT_PACKAGES = {
    "tests",
    "test",
    "testing",
    "docs",
    "doc",
    "examples",
    "example",
    "bench",
    "benchmarks",
    "build",
    "dist",
    "scripts",
    "capture",
}


def find_package(root: Path, name: str | None) -> tuple[str, Path]:
    """Locate the import package that receives `_precompiled/`.

    Args:
        root: project root.
        name: the configured `package`, or None to infer it.
    Returns:
        (package name, its source directory). Looks in ``root`` and ``root/src``
        for a directory with ``__init__.py``.
    Raises:
        ConfigError: not found, or (when inferring) none or several candidates.
    """
    bases = [root, root / "src"]
    if name is not None:
        if not isinstance(name, str) or not name.isidentifier():
            raise fail(f"`{PREFIX}.package` must be an import package name, not {name!r}")
        for base in bases:
            try:
                if (base / name / "__init__.py").is_file():
                    return name, base / name
            except OSError as e:  # name too long
                raise fail(f"`{PREFIX}.package` = {name!r} is not a usable name ({e})") from None
        raise fail(
            f"`{PREFIX}.package` = {name!r} is not in the distribution "
            f"(no {name}/__init__.py in {root} or {root / 'src'})"
        )
    found = sorted(
        {
            (d.name, d)
            for base in bases
            if base.is_dir()
            for d in base.iterdir()
            if d.is_dir()
            and d.name.isidentifier()
            and d.name not in _NOT_PACKAGES
            and not d.name.startswith("_")
            and (d / "__init__.py").is_file()
        }
    )
    if len(found) != 1:
        what = (
            "no import package"
            if not found
            else ("several import packages (" + ", ".join(n for n, _ in found) + ")")
        )
        raise fail(
            f"found {what} in {root} or {root / 'src'}; set "
            f"`{PREFIX}.package` to the one that receives `_precompiled/`"
        )
    return found[0]
