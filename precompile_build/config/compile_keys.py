"""The keys that say what a target's kernels are compiled for: `mode` (torch.compile's
mode names, choices.MODES) and `cuda-archs` (the compute capabilities besides the build
GPU's), read from pyproject.toml, the overrides and a capture's options.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from .choices import MODES
from .messages import invalid, type_name

# Compute capabilities `cuda-archs` accepts: those Triton compiles for that have
# a shared-memory limit in engines/cross_arch.py (SHARED_PER_BLOCK).
CUDA_ARCHS = ("7.5", "8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "10.3", "11.0", "12.0", "12.1")


def parse_mode(value: Any, where: str) -> str:
    """A `mode` value (:data:`~.choices.MODES`).

    Args:
        value: from pyproject.toml or an override (a string).
        where: the key (backticked, pyproject.toml) or the override it came from.
    Returns:
        the mode, stripped.
    Raises:
        ConfigError: not one of the modes (the message names the key, the valid
            values and the closest one).
    """
    text = value.strip() if isinstance(value, str) else value
    if text not in MODES:
        close = difflib.get_close_matches(str(text), MODES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise invalid(where, f"must be one of {', '.join(map(repr, MODES))}, not {value!r}{hint}")
    return text


def parse_cuda_archs(value: Any, where: str) -> tuple[str, ...]:
    """A `cuda-archs` value as a sorted tuple of compute capabilities.

    Args:
        value: from pyproject.toml an array of strings (``["8.0", "9.0"]``); from an
            override a comma-separated string (``"8.0,9.0"``), ``sm_80`` also accepted.
        where: the key (backticked, pyproject.toml) or the override it came from.
    Returns:
        e.g. ``("8.0", "9.0")``: duplicates dropped, sorted by capability.
    Raises:
        ConfigError: not a list of strings, or an entry that is not one of
            :data:`CUDA_ARCHS` (the message names the key and the valid values).
    """
    if isinstance(value, str) and not where.startswith("`"):
        items: Any = [v.strip() for v in value.split(",") if v.strip()]
    else:
        items = value
    if not isinstance(items, list):
        raise invalid(
            where,
            f"must be an array of compute capabilities as strings "
            f'(e.g. ["8.0", "9.0"]), not {type_name(value)}',
        )
    bad = [v for v in items if not isinstance(v, str)]
    if bad:
        raise invalid(
            where,
            f'must be an array of strings such as "8.0", not {bad[0]!r} '
            f"({type_name(bad[0])}): quote each compute capability",
        )
    out = []
    for item in items:
        text = item.strip()
        m = re.fullmatch(r"sm_?([0-9]{1,2})([0-9])", text)
        if m:  # sm_80 -> 8.0
            text = f"{m.group(1)}.{m.group(2)}"
        if text not in CUDA_ARCHS:
            close = difflib.get_close_matches(text, CUDA_ARCHS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise invalid(
                where,
                f"has {item!r}{hint}, which is not a compute capability "
                f"this build compiles for; use some of {', '.join(CUDA_ARCHS)}",
            )
        out.append(text)
    return tuple(sorted(set(out), key=lambda a: tuple(int(p) for p in a.split("."))))
