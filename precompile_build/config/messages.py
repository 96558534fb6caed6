"""The words of a configuration error: where the bad value came from and what it is.

``fail`` is a problem in ``[tool.precompile]`` of pyproject.toml; ``invalid`` a bad
value from there (``where`` a backticked key) or from an override (a config setting or
an environment variable, named as the override's reader gives it).
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

PREFIX = "tool.precompile"


def fail(msg: str) -> ConfigError:
    """A ConfigError about pyproject.toml's ``[tool.precompile]``: ``msg`` names the key."""
    return ConfigError(f"Failed to validate `{PREFIX}` in pyproject.toml: {msg}")


def invalid(where: str, msg: str) -> ConfigError:
    """A ConfigError for an invalid value, from pyproject.toml (``where`` a backticked
    key) or an override (``where`` names it); ``msg`` says what the value must be."""
    if where.startswith(f"`{PREFIX}"):
        return fail(f"{where} {msg}")
    return ConfigError(f"Failed to read {where}: it {msg}")


def type_name(v: Any) -> str:
    """``"a boolean"``, ``"a string"``, ... for a TOML value, for messages."""
    return {
        bool: "a boolean",
        str: "a string",
        int: "an integer",
        float: "a number",
        list: "an array",
        dict: "a table",
    }.get(type(v), type(v).__name__)
