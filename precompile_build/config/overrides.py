"""Overrides of `[tool.precompile]`: PEP 517 config settings with the ``precompile.``
prefix and ``PRECOMPILE_*`` environment variables (the environment wins), each kept with
where it came from; and a `targets` selection read against the declared targets.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from .fields import PROJECT_KEYS
from .messages import PREFIX

__all__ = ["LIST_OVERRIDES", "OVERRIDES", "as_bool", "collect_overrides", "select_targets"]

OVERRIDES = {k.key: k.env for k in PROJECT_KEYS if k.env}
# Override keys that take a list: repeating them (`-C precompile.targets=a -C
# precompile.targets=b`) selects the union; any other key given twice must agree.
LIST_OVERRIDES = ("targets", "cuda-archs")


def as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(
        f"Failed to read override {key}: {value!r} is not a boolean "
        "(use true/false, 1/0, yes/no, on/off)"
    )


def _repeated(raw_key: str, key: str, values: list[Any]) -> Any:
    """The value of a config setting given several times (``-C K=a -C K=b`` reaches
    the backend as ``{K: ["a", "b"]}``): the union for a list-valued key
    (:data:`LIST_OVERRIDES`), the one value for a scalar key given with one value.

    Raises:
        ConfigError: no value, or a scalar key given different values.
    """
    if not values:
        raise ConfigError(f"Failed to read config settings: `{raw_key}` has no value")
    if key in LIST_OVERRIDES:  # each value may itself be a comma-separated list
        return ",".join(str(v) for v in values)
    if len({str(v) for v in values}) > 1:
        raise ConfigError(
            f"Failed to read config settings: `{raw_key}` was given {len(values)} times "
            f"({', '.join(map(repr, values))}) but takes one value; pass it once"
        )
    return values[0]


def collect_overrides(
    config_settings: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> dict[str, tuple[Any, str]]:
    """Overrides by key, each as ``(raw value, where it came from)``.

    Environment variables win over config settings. Config settings keys outside
    the ``precompile.`` prefix are left to setuptools.

    Raises:
        ConfigError: an unknown ``precompile.*`` key (with a suggestion), or both
            `skip` and `targets` set by the same source (conflicting).
    """
    environ = os.environ if environ is None else environ
    out: dict[str, tuple[Any, str]] = {}
    by_source: dict[str, set[str]] = {}
    for raw_key, value in (config_settings or {}).items():
        if not str(raw_key).startswith("precompile."):
            continue
        key = str(raw_key)[len("precompile.") :]
        if key not in OVERRIDES:
            close = difflib.get_close_matches(key, list(OVERRIDES), n=1)
            hint = (
                f"; did you mean `precompile.{close[0]}`?"
                if close
                else ("; valid keys: " + ", ".join(f"precompile.{k}" for k in OVERRIDES))
            )
            raise ConfigError(f"Failed to read config settings: unknown key `{raw_key}`{hint}")
        if isinstance(value, list):  # pip and build pass a repeated -C key as a list
            value = _repeated(str(raw_key), key, value)
        out[key] = (value, f"config setting `{raw_key}`")
        by_source.setdefault("config settings", set()).add(key)
    for key, var in OVERRIDES.items():
        if var in environ:
            out[key] = (environ[var], f"environment variable {var}")
            by_source.setdefault("environment", set()).add(key)
    for source, keys in by_source.items():
        if {"skip", "targets"} <= keys and as_bool(out["skip"][0], out["skip"][1]):
            raise ConfigError(
                f"Failed to read overrides: conflicting {source}: "
                "`skip` is true and `targets` selects targets; set one"
            )
    return out


def select_targets(targets: Mapping[str, Any], value: str, where: str) -> tuple[str, ...]:
    """The targets a comma-separated selection ``value`` names, in pyproject order.

    Args:
        targets: the declared targets, by name.
        value: ``"a,b"``.
        where: what gave it, for messages (``config setting `precompile.targets```,
            ``environment variable PRECOMPILE_TARGETS``, ``--targets``).
    Raises:
        ConfigError: it selects no target, or names one that is not declared (with
            the closest declared name).
    """
    names = [n.strip() for n in value.split(",") if n.strip()]
    if not names:
        raise ConfigError(
            f"Failed to read {where}: it selects no target; use skip to build without captures"
        )
    for n in names:
        if n not in targets:
            close = difflib.get_close_matches(n, list(targets), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"Failed to read {where}: no target {n!r} in `{PREFIX}.targets`{hint}"
            )
    return tuple(n for n in targets if n in names)
