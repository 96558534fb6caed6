"""Editable installs whose source changed since their capture.

An editable build's manifest records ``editable``: the package source directory and
its digest at capture. When the digest differs at load, the pair computes what the
old code did, so neither its kernels nor its captured graph may serve. What serves
instead is the current code of the captured function, called eagerly, where the
capture recorded an importable name for it (the cache envelope's
``meta["function"] = {"module", "qualname"}``, written by ``precompile_build.capture``
for a module-level function); otherwise the load is refused.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

from . import envelope as _envelope
from ._digest import package_digest
from .errors import StaleArtifactError

REINSTALL = "Run the editable install again (`pip install -e .`) to capture the current code."


def stale_text(ctx: str, doc: dict[str, Any]) -> str | None:
    """For an editable install's manifest: why its pair is stale, or None (not an
    editable manifest, its source tree is gone, or the source is unchanged). Other
    manifests cost nothing here; an editable one costs hashing the package source."""
    info = doc.get("editable")
    if not isinstance(info, dict) or not isinstance(info.get("package_dir"), str):
        return None
    try:
        now = package_digest(info["package_dir"])
    except OSError:
        return None  # the source tree is gone: nothing to compare with
    if now == info.get("package_sha256"):
        return None
    return (
        f"{ctx}: the package source in {info['package_dir']} changed since the "
        "editable build (`pip install -e`) captured this target, so its pair (kernels "
        "and captured graph) computes what the old code did and is not used"
    )


def recorded_function(cache: bytes) -> dict[str, str] | None:
    """The ``{"module", "qualname"}`` the capture recorded in the cache envelope, or
    None (a torch-engine pair, or a function not importable by name)."""
    if not _envelope.is_envelope(cache):
        return None
    try:
        ref = _envelope.loads(cache, check_blobs=False).meta.get("function")
    except Exception:  # the regular load reports a corrupt envelope
        return None
    ok = isinstance(ref, dict) and all(isinstance(ref.get(k), str) for k in ("module", "qualname"))
    return ref if ok else None


def current_code(stale: str, cache: bytes) -> tuple[Callable[..., Any], str]:
    """``(the captured function's current code, the warning text)`` for a stale pair.

    Args:
        stale: :func:`stale_text`'s text.
        cache: the pair's cache half (verified against the manifest).
    Returns:
        the module-level function the capture recorded, imported now (it has the
        captured calling convention and runs eagerly), and a text that says so.
    Raises:
        StaleArtifactError: the capture recorded no importable name (a lambda, a
            nested function, one defined in the capture script, a torch-engine pair)
            or it no longer imports: nothing can run the current code in its place.
    """
    ref = recorded_function(cache)
    if ref is None:
        raise StaleArtifactError(
            f"{stale}; the captured function has no importable name (a lambda, a nested "
            "function or one defined in the capture script), so its current code cannot "
            f"be called in its place. {REINSTALL}"
        )
    name = f"{ref['module']}.{ref['qualname']}"
    try:
        obj: Any = importlib.import_module(ref["module"])
        for part in ref["qualname"].split("."):
            obj = getattr(obj, part)
    except Exception as e:
        raise StaleArtifactError(
            f"{stale}; the captured function {name} does not import any more "
            f"({type(e).__name__}: {e}). {REINSTALL}"
        ) from e
    if not callable(obj):
        raise StaleArtifactError(f"{stale}; {name} is no longer callable. {REINSTALL}")
    return obj, (
        f"{stale}; calling the current {name} eagerly instead (no precompiled kernels). {REINSTALL}"
    )
