"""What a capture process imported: the capture cache's second key.

The capture cache's key (capture_cache.key_components) is known before a capture
runs; what the capture script imports is known only after. So a capture records it
(:func:`write_record`, called by ``precompile_build.capture`` when the build sets
``PRECOMPILE_IMPORTS_PATH``), the cache entry keeps the record, and a later build
reuses the entry only when :func:`changes` finds every recorded distribution at the
same version and every recorded file with the same bytes. A script that does not
use ``precompile_build.capture`` (torch's own API) writes no record; its entry then
records every distribution installed (:func:`environment_record`), which any
install or upgrade changes.

A record is ``{"distributions": {name: version}, "files": {path: sha256}}``:
distributions that provide a top-level module in ``sys.modules`` (names
normalised as PEP 503 does), and the files of imported modules that no
distribution provides and that are not the standard library's, site-packages' or
the compilers' caches' (a helper module next to the capture script, a directory on
PYTHONPATH).
"""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

from ..config import capture_env

RECORD_ENV = capture_env.IMPORTS_PATH


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def record(modules: Optional[Mapping[str, Any]] = None) -> dict[str, dict[str, str]]:
    """The record of ``modules`` (default ``sys.modules``); see the module docstring.
    Files that cannot be read are left out (they cannot be imported again either)."""
    from importlib import metadata

    from precompile_runtime._digest import sha256_file

    modules = dict(sys.modules if modules is None else modules)
    owners = metadata.packages_distributions()  # top-level import name -> distributions
    skipped = _not_inputs()
    dists: dict[str, str] = {}
    files: dict[str, str] = {}
    seen: set[str] = set()
    for name, module in modules.items():
        top = name.partition(".")[0]
        if top in owners:
            if top not in seen:  # thousands of torch.* modules: one look-up
                seen.add(top)
                for dist in owners[top]:
                    try:
                        dists[_normal(dist)] = metadata.version(dist)
                    except metadata.PackageNotFoundError:
                        pass
            continue
        path = getattr(module, "__file__", None)
        if not isinstance(path, str) or top in ("__main__", "__mp_main__"):  # the script: in the key
            continue
        real = os.path.realpath(path)
        if real.startswith(skipped) or not os.path.isfile(real):
            continue
        try:
            files[real] = sha256_file(real)
        except OSError:
            pass
    return {"distributions": dict(sorted(dists.items())), "files": dict(sorted(files.items()))}


def _not_inputs() -> tuple[str, ...]:
    """Directories whose modules are no input of the capture: the standard library,
    site-packages (their distributions are recorded by version), and the compilers'
    caches (Inductor's and Triton's generated kernels are what the capture made)."""
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    dirs += [p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))]
    utils = sys.modules.get("torch._inductor.runtime.runtime_utils")
    try:
        dirs.append(utils.cache_dir() if utils is not None else os.environ.get("TORCHINDUCTOR_CACHE_DIR", ""))
    except Exception:  # no cache dir: nothing of Inductor's was loaded from one
        pass
    dirs += [os.environ.get("TRITON_CACHE_DIR", ""), os.path.join(os.path.expanduser("~"), ".triton")]
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def environment_record() -> dict[str, Any]:
    """Every distribution installed where this process imports from, for a capture
    that recorded nothing."""
    from importlib import metadata

    dists: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            dists.setdefault(_normal(name), dist.version)
    return {"distributions": dict(sorted(dists.items())), "files": {}, "environment": True}


def record_path(source_path: Path) -> Path:
    """Where the build asks the capture of ``source_path`` (the pair's source half)
    to write its record: ``NAME.imports.json`` beside it."""
    return Path(source_path).with_name(Path(source_path).stem + ".imports.json")


def write_record() -> None:
    """Write :func:`record` to ``$PRECOMPILE_IMPORTS_PATH`` (set by the build; nothing
    when unset). A record that cannot be made or written is left out, never an error of
    the capture: the build then keys the entry on the whole environment."""
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    try:
        Path(path).write_text(json.dumps(record(), sort_keys=True), encoding="utf-8")
    except Exception:  # an odd module or distribution: the whole environment instead
        pass


def read_record(path: Path) -> Optional[dict[str, dict[str, str]]]:
    """The record a capture wrote at ``path``, or None (none written, or unreadable)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), dict) for k in ("distributions", "files")):
        return None
    return doc


def changes(recorded: Mapping[str, Any]) -> list[str]:
    """What differs now from ``recorded``: ``"transformers 5.17.0 -> not installed"``,
    ``"fixturedep 1.0 -> 2.0"``, ``"/…/helpers.py changed"`` (and, for an
    :func:`environment_record`, ``"newdist not installed -> 1.0"``); empty when
    nothing did."""
    from importlib import metadata

    from precompile_runtime._digest import sha256_file

    out = []
    if recorded.get("environment"):  # the whole environment: a new distribution counts too
        now_all = environment_record()["distributions"]
        out += [f"{d} not installed -> {v}" for d, v in now_all.items()
                if d not in recorded.get("distributions", {})]
    for dist, version in sorted(recorded.get("distributions", {}).items()):
        try:
            now = metadata.version(dist)
        except metadata.PackageNotFoundError:
            now = None
        if now != version:
            out.append(f"{dist} {version} -> {now or 'not installed'}")
    for path, digest in sorted(recorded.get("files", {}).items()):
        try:
            same = sha256_file(path) == digest
        except OSError:
            same = False
        if not same:
            out.append(f"{path} changed")
    return out
