"""Reading the runtime's boolean environment variables (``PRECOMPILE_STRICT``,
``PRECOMPILE_NO_COMPILE``) the way the build side reads its own: one rule for all."""

from __future__ import annotations

import os

from .errors import LoadOptionError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off", "")


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is on.

    On: ``1``, ``true``, ``yes``, ``on``; off: unset, empty, ``0``, ``false``, ``no``,
    ``off`` (any case, surrounding spaces ignored).

    Raises:
        LoadOptionError: (a PrecompileLoadError and a ValueError) any other value; the
            message names the variable and the values it accepts (a typo must not
            silently mean off).
    """
    raw = os.environ.get(name)
    if raw is None:
        return False
    text = raw.strip().lower()
    if text in TRUE:
        return True
    if text in FALSE:
        return False
    raise LoadOptionError(
        f"environment variable {name}={raw!r} is not a boolean: use 1, true, yes or on "
        "to turn it on; 0, false, no, off or empty (or unset it) to turn it off"
    )
