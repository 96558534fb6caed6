"""What a target may be called: the rule, checked when the configuration is read.

A target's name names its files on every platform the wheel may be built or
installed on (``NAME.py``, ``NAME.cache``, ``NAME.<cache tag>.pyc``, in a merged wheel
``NAME.<variant id>.cache``; the build's ``NAME.log``) and its module
(``precompile_runtime.pairs.PACKAGE.NAME``). So, before any capture runs, a name must
be ASCII letters, digits and underscores, not starting with a digit (a Python
identifier that every file system spells the same), at most :data:`MAX_LENGTH`
characters, not a dunder name (``__init__`` would make ``_precompiled/`` an importable
package whose import runs a source half outside the loader's checks), not a Windows
device name (``con``, ``nul``, ``com1``, ...: no file may be named so there, whatever
its extension), and no two names may differ only in case (one file on a file system
that ignores case, as macOS's and Windows' do by default).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Optional

MAX_LENGTH = 64
"""Characters: the longest file a target gets (``NAME.<12-hex variant id>.cpython-3XX.pyc``
in a merged wheel) stays far below every file system's 255."""

RULE = (
    f"ASCII letters, digits and underscores, not starting with a digit, at most {MAX_LENGTH} "
    "characters, not a dunder name such as `__init__`, not a Windows device name (`con`, "
    "`nul`, `com1`, ...), and no two names that differ only in case"
)
"""The rule in words (docs/settings.md, the errors)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DEVICES = {
    "con",
    "prn",
    "aux",
    "nul",
    *(f"com{i}" for i in range(10)),
    *(f"lpt{i}" for i in range(10)),
}


def problem(name: Any) -> Optional[str]:
    """Why ``name`` cannot name a target, or None.

    Args:
        name: the key of a ``[tool.precompile.targets.NAME]`` table.
    Returns:
        the words that follow "must ..." / "is ...": what is wrong and what to use
        instead; None for a valid name.
    """
    if not isinstance(name, str) or (name.isascii() and not _NAME.match(name)):
        return (
            "must be a Python identifier (letters, digits, underscores; not starting with a digit)"
        )
    if not _NAME.match(name):
        return (
            "must be ASCII (letters a-z and A-Z, digits, underscores): its files are named after it, "
            "and not every file system and installer spells other characters the same"
        )
    if len(name) > MAX_LENGTH:
        return (
            f"is {len(name)} characters long; use at most {MAX_LENGTH} (its files, such as "
            f"`NAME.<variant id>.cpython-3XX.pyc`, must fit every file system's name limit)"
        )
    if name.startswith("__") and name.endswith("__"):
        return (
            "is a dunder name, which Python gives a meaning (`__init__.py` would make `_precompiled/` "
            "an importable package); use a plain name"
        )
    if name.lower() in _DEVICES:
        return "is a Windows device name, which no file may have there; use another name"
    return None


def case_clash(names: Iterable[str]) -> Optional[tuple[str, str]]:
    """Two of ``names`` that differ only in case (the first such pair), or None."""
    seen: dict[str, str] = {}
    for name in names:
        other = seen.setdefault(name.lower(), name)
        if other != name:
            return other, name
    return None
