"""What changed since a target's last capture: the key components of a missed key
compared with the newest entry of the same target, said by name (never values).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from .cache_keys import ENTRY_JSON

__all__ = ["what_changed"]


_COMPONENT_NAMES = {
    "script_sha256": "the script",
    "package_sha256": "the package's files",
    "target": "the target's",
    "cache_env": "the cache-env variables",
    "fingerprint": "the host fingerprint",
    "cpu_flags": "the CPU flags",
    "tool_code_sha256": "precompile-build's code",
    "precompile_build": "precompile-build's version",
    "precompile_runtime": "precompile-runtime's version",
    "format": "the entry format",
    "version": "the entry format",
}


def _newest_entry(
    root: Path, target: Mapping[str, Any], package: Optional[str]
) -> Optional[dict[str, Any]]:
    """entry.json of the newest entry in ``root`` of the same target (name, script,
    device) of ``package``, or None."""
    best: Optional[dict[str, Any]] = None
    try:
        listing = list(root.iterdir())
    except OSError:
        return None
    for d in listing:
        try:
            meta = json.loads((d / ENTRY_JSON).read_text(encoding="utf-8"))
            old_target = meta["components"]["target"]
            if (
                old_target["name"],
                old_target["script"],
                old_target["device"],
                meta.get("package"),
            ) != (target.get("name"), target.get("script"), target.get("device"), package):
                continue
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if best is None or meta.get("created_ns", 0) > best.get("created_ns", 0):
            best = meta
    return best


def _detail(
    k: str,
    best: Mapping[str, Any],
    components: Mapping[str, Any],
    package: Optional[str],
    package_files: Optional[Mapping[str, str]],
) -> str:
    """What to say after component ``k``'s name: the script's path, the package files
    that changed, the target keys or cache-env names that differ (names, never values)."""
    old = best["components"]
    target = components.get("target", {})
    what = ""
    if k == "script_sha256":
        what += f" {target.get('script')}"
    elif (
        k == "package_sha256"
        and isinstance(best.get("package_files"), dict)
        and package_files is not None
    ):
        was, now = best["package_files"], package_files
        pre = f"{package}/" if package else ""
        files = (
            [f"{pre}{f} changed" for f in sorted(now) if f in was and was[f] != now[f]]
            + [f"{pre}{f} added" for f in sorted(now) if f not in was]
            + [f"{pre}{f} removed" for f in sorted(was) if f not in now]
        )
        if files:
            what += (
                " ("
                + ", ".join(files[:3])
                + (f" and {len(files) - 3} more" if len(files) > 3 else "")
                + ")"
            )
    elif k == "target" and isinstance(old.get(k), dict):
        keys = sorted(n for n in set(old[k]) | set(target) if old[k].get(n) != target.get(n))
        what += " " + ", ".join(keys)
    elif k == "cache_env" and isinstance(old.get(k), dict):
        now_env = components.get(k) or {}
        what += (
            " ("
            + ", ".join(
                sorted(n for n in set(old[k]) | set(now_env) if old[k].get(n) != now_env.get(n))
            )
            + ")"
        )
    return what


def what_changed(
    root: Path,
    components: Mapping[str, Any],
    package: Optional[str] = None,
    package_files: Optional[Mapping[str, str]] = None,
) -> Optional[str]:
    """What differs between ``components`` and the newest entry in ``root`` of the same
    target (name, script, device) of package ``package``: ``"the script
    capture/pair.py"``, ``"the package's files (simplepkg/helpers.py changed)"``,
    ``"the target's args"``, ``"the cache-env variables (FIXTURE_KNOB)"`` (names,
    never values), joined after ``"changed since the last capture (key 1a2b3c4d5e6f…): "``;
    None when there is no such entry or nothing readable differs.
    Reads every entry's entry.json (only on a miss: a capture follows)."""
    target = components.get("target", {})
    best = _newest_entry(root, target, package)
    if best is None:
        return None
    old = best["components"]
    parts = []
    for k in sorted(
        set(old) | set(components),
        key=lambda k: (
            list(_COMPONENT_NAMES).index(k) if k in _COMPONENT_NAMES else len(_COMPONENT_NAMES)
        ),
    ):
        if old.get(k) == components.get(k):
            continue
        what = _COMPONENT_NAMES.get(k, k) + _detail(k, best, components, package, package_files)
        if what not in parts:
            parts.append(what)
    if not parts:
        return None
    return f"changed since the last capture (key {str(best.get('key', '?'))[:12]}…): " + ", ".join(
        parts
    )
