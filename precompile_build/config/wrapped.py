"""The `backend` and `backend-path` keys: the PEP 517 backend the project builds with,
which precompile_build.backend wraps (wrapped_backend.py imports and calls it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .messages import PREFIX, fail, type_name

DEFAULT = "setuptools.build_meta"


def parse_backend(table: Mapping[str, Any], root: Path) -> tuple[str, tuple[Path, ...]]:
    """`backend` and `backend-path` of the `[tool.precompile]` table ``table``.

    Returns:
        (the object reference as written, default ``setuptools.build_meta``; the
        `backend-path` entries as absolute paths).
    Raises:
        ConfigError: `backend` is not a ``module`` / ``module:object`` string, or a
            `backend-path` entry is not a string naming a directory inside ``root``.
    """
    spec = table.get("backend", DEFAULT)
    module, colon, attrs = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if (
        not isinstance(spec, str)
        or not all(p.isidentifier() for p in module.split("."))
        or (colon and not all(p.isidentifier() for p in attrs.split(".")))
    ):
        raise fail(
            f"`{PREFIX}.backend` must be a PEP 517 backend object reference "
            f'(`module` or `module:object`, e.g. "hatchling.build"), not {spec!r}'
        )
    raw = table.get("backend-path", [])
    if not isinstance(raw, list) or not all(
        isinstance(p, str) and p and "\0" not in p for p in raw
    ):
        raise fail(
            f"`{PREFIX}.backend-path` must be an array of directory paths relative to "
            f"the project root, not {type_name(raw)} {raw!r}"
        )
    paths = []
    for p in raw:
        try:
            path = (root / p).resolve()
        except (OSError, RuntimeError) as e:
            raise fail(f"`{PREFIX}.backend-path` entry {p!r} is not a usable path ({e})") from None
        if path != root and root not in path.parents:
            raise fail(
                f"`{PREFIX}.backend-path` entry {p!r} resolves to {path}, outside the "
                f"project root {root} (PEP 517 keeps an in-tree backend inside it)"
            )
        paths.append(path)
    return spec, tuple(paths)
