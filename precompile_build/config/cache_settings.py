"""The capture cache's settings: `cache-dir` (and the per-user default) and
`cache-max-size` (a size with its unit, or none).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from .messages import PREFIX, invalid

__all__ = [
    "DEFAULT_CACHE_MAX_SIZE",
    "default_cache_dir",
    "parse_cache_dir",
    "parse_cache_max_size",
    "resolve_cache_dir",
]

DEFAULT_CACHE_MAX_SIZE = 10 * 2**30  # bytes: `cache-max-size`'s default


def default_cache_dir() -> Path:
    """The per-user capture cache: ``platformdirs.user_cache_dir("precompile-build")``
    (``~/.cache/precompile-build`` on Linux)."""
    import platformdirs

    return Path(platformdirs.user_cache_dir("precompile-build"))


def parse_cache_dir(
    table: Mapping[str, Any], overrides: Mapping[str, tuple[Any, str]], root: Path
) -> Optional[Path]:
    value, where = table.get("cache-dir"), f"`{PREFIX}.cache-dir`"
    if "cache-dir" in overrides:
        value, where = overrides["cache-dir"]
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise invalid(where, f"must be a non-empty directory path, not {value!r}")
    return resolve_cache_dir(value, root)


def resolve_cache_dir(value: str, base: Path) -> Path:
    """A `cache-dir` value as a path: ``~`` expanded, a relative path taken from
    ``base`` (the project root for the build)."""
    path = Path(os.path.expanduser(value))
    return path if path.is_absolute() else base / path


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_cache_max_size(
    table: Mapping[str, Any], overrides: Mapping[str, tuple[Any, str]]
) -> Optional[int]:
    """`cache-max-size` in bytes (None: no bound)."""
    value, where = table.get("cache-max-size", DEFAULT_CACHE_MAX_SIZE), f"`{PREFIX}.cache-max-size`"
    if "cache-max-size" in overrides:
        value, where = overrides["cache-max-size"]
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "none":
            return None
        m = re.fullmatch(r"([0-9]{1,15}(?:\.[0-9]{1,6})?)\s*([a-z]*)", text)
        if m and m.group(2) in _SIZE_UNITS:
            value = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid(
            where,
            'must be a size ("10GiB", "512MB", bytes as a positive integer) '
            f'or "none" (no bound), not {value!r}',
        )
    return value
