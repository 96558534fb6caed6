"""What a capture process imported: the capture cache's second key.

The capture cache's key (capture_cache.key_components) is known before a capture
runs; what the capture script imports is known only after. So a capture records it
(:func:`write_record`, called by ``precompile_build.capture`` when the build sets
``PRECOMPILE_IMPORTS_PATH``), the cache entry keeps the record, and a later build
reuses the entry only when :func:`changes` finds every recorded distribution at the
same version and every recorded file with the same bytes. A script that does not
use ``precompile_build.capture`` (torch's own API) records, when it ends, every
distribution installed where it imports from (:func:`environment_record`, written by
the build's script runner), which any install or upgrade changes.

A record is ``{"distributions": {name: version}, "files": {path: sha256},
"project_files": {relative path: sha256}, "path": [[base, relative], ...]}``:

- distributions that provide a top-level module in ``sys.modules`` (names normalised
  as PEP 503 does), except the project's own and editable installs: a module loaded
  from the project's package (``PRECOMPILE_PACKAGE_DIR``) is keyed by that package's
  content (``package_sha256``), never by the version in the metadata setuptools writes
  into the project root (``NAME.egg-info``), which an edit of the code without a
  version bump leaves as it was; the modules of another editable install
  (``pip install -e ../lib``) are recorded by their files, for the same reason;
- ``project_files``: the files of other modules loaded from inside the project root
  (``PRECOMPILE_PROJECT_ROOT``; a helper module beside the script), relative to it,
  so that a build of another copy of the project (an sdist unpacked elsewhere)
  compares the same files;
- ``files``: the files of imported modules outside the project that no distribution
  provides and that are not the standard library's, site-packages', the compilers'
  caches' or the interpreter's start-up hooks' (a directory on PYTHONPATH);
- ``path``: the capture process's ``sys.path``, each entry relative to the project
  root, ``sys.prefix`` or ``sys.base_prefix`` where it lies inside one
  (``["root", "captures"]``), else ``["abs", path]``: what the script itself put
  there (``sys.path.insert(0, <project root>)``) is found again.

The record is compared in the import context it was made in: the build runs
programs/check_imports.py in a process started as the capture would be now (same
interpreter, environment, working directory, the script's folder first), which
merges the record's ``path`` with its own and calls :func:`changes` there. The build's
own process sees other things (not the project root and its egg-info, not what a
target's ``env`` adds) and would call them "not installed".
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import sysconfig
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Optional

# The names of config/capture_env.py's table, spelled here: the build's check runs this
# file alone, with no package to import from (programs/check_imports.py); a test keeps them equal
RECORD_ENV = "PRECOMPILE_IMPORTS_PATH"
ROOT_ENV = "PRECOMPILE_PROJECT_ROOT"
PACKAGE_ENV = "PRECOMPILE_PACKAGE_DIR"
# Imported by the interpreter's start-up (site), not by the script: pip's isolated build
# environment has a sitecustomize.py of its own in a new temp directory each build.
_STARTUP_MODULES = ("sitecustomize", "usercustomize")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256_file(path: str) -> str:
    # precompile_runtime._digest's, here again: programs/check_imports.py runs this file alone
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _under(path: str, base: Optional[str]) -> bool:
    return bool(base) and (path == base or path.startswith(str(base).rstrip(os.sep) + os.sep))


def _real(path: Optional[str]) -> Optional[str]:
    return os.path.realpath(path) if path else None


def _bases(root: Optional[str]) -> list[tuple[str, str]]:
    """What a path entry is kept relative to: longest first, so a venv inside the
    project root is the interpreter's, not the project's."""
    bases = [
        ("root", _real(root)),
        ("prefix", _real(sys.prefix)),
        ("base_prefix", _real(sys.base_prefix)),
    ]
    return sorted(((k, v) for k, v in bases if v), key=lambda kv: -len(kv[1]))


def portable_path(entries: Iterable[str], root: Optional[str]) -> list[list[str]]:
    """``sys.path`` entries as ``[base, relative]`` pairs (see the module docstring)."""
    bases = _bases(root)
    out = []
    for entry in entries:
        real = os.path.realpath(entry or os.curdir)
        for kind, base in bases:
            if _under(real, base):
                out.append([kind, os.path.relpath(real, base)])
                break
        else:
            out.append(["abs", real])
    return out


def rebased_path(portable: Iterable[Any], root: Optional[str]) -> list[str]:
    """:func:`portable_path`'s pairs as paths of this process and project ``root``;
    pairs of an unknown kind, or relative to a root not given, are left out."""
    bases = dict(_bases(root))
    out = []
    for item in portable:
        if not (
            isinstance(item, (list, tuple))
            and len(item) == 2
            and all(isinstance(x, str) for x in item)
        ):
            continue
        kind, rel = item
        if kind == "abs":
            out.append(rel)
        elif kind in bases:
            out.append(os.path.normpath(os.path.join(bases[kind], rel)))
    return out


def _context() -> tuple[Optional[str], Optional[str]]:
    """The project root and package directory the build gave this capture process."""
    return _real(os.environ.get(ROOT_ENV)), _real(os.environ.get(PACKAGE_ENV))


def _dist_location(dist: Any) -> Optional[str]:
    """The folder a distribution's metadata lies in (the sys.path entry), or None."""
    try:
        return os.path.realpath(str(dist.locate_file("")))
    except Exception:  # noqa: BLE001 - a distribution of an odd finder: no location
        return None


def _project_own(location: Optional[str], root: Optional[str]) -> bool:
    """Metadata in the project root (setuptools' ``NAME.egg-info``) that is not an
    interpreter's (a venv inside the project): the project's own distribution."""
    if location is None or not _under(location, root):
        return False
    return not any(_under(location, _real(p)) for p in (sys.prefix, sys.base_prefix))


def record(
    modules: Optional[Mapping[str, Any]] = None,
    *,
    root: Optional[str] = None,
    package_dir: Optional[str] = None,
) -> dict[str, Any]:
    """The record of ``modules`` (default ``sys.modules``); see the module docstring.

    Args:
        root, package_dir: the project root and its package's folder (default: the
            ``PRECOMPILE_PROJECT_ROOT`` / ``PRECOMPILE_PACKAGE_DIR`` the build sets;
            unset: nothing is taken as the project's).
    Files that cannot be read are left out (they cannot be imported again either)."""
    from importlib import metadata

    env_root, env_pkg = _context()
    root, package_dir = _real(root) or env_root, _real(package_dir) or env_pkg
    modules = dict(sys.modules if modules is None else modules)
    owners = metadata.packages_distributions()  # top-level import name -> distributions
    skipped = _not_inputs()
    dists: dict[str, str] = {}
    files: dict[str, str] = {}
    project: dict[str, str] = {}
    seen: set[str] = set()
    editable: set[str] = set()
    for name, module in modules.items():
        top = name.partition(".")[0]
        try:
            path = getattr(module, "__file__", None)
        except Exception:  # noqa: BLE001 - a lazy module that fails on attribute access: no file
            path = None
        real = os.path.realpath(path) if isinstance(path, str) else None
        in_project = real is not None and _under(real, root) and not real.startswith(skipped)
        if in_project and _under(real, package_dir):  # type: ignore[arg-type]
            continue  # the project's package: its content is the key (package_sha256)
        if top in owners and not in_project:
            if top not in seen:  # thousands of torch.* modules: one look-up
                seen.add(top)
                for dist in owners[top]:
                    found = _first_dist(dist, None, root)
                    if found is not None and _editable(found):
                        editable.add(top)
                    elif found is not None:
                        dists[_normal(dist)] = found.version
            if top not in editable:
                continue  # installed: its version stands for its files
            # an editable install (pip install -e ../lib): its code is edited in place with
            # no new version, so its files are recorded below, by content
        if real is None or top in (
            "__main__",
            "__mp_main__",
            *_STARTUP_MODULES,
        ):  # the script: in the key
            continue
        if real.startswith(skipped) or not os.path.isfile(real):
            continue
        try:
            digest = _sha256_file(real)
        except OSError:
            continue
        if in_project:
            project[os.path.relpath(real, root)] = digest
        else:
            files[real] = digest
    return {
        "distributions": dict(sorted(dists.items())),
        "files": dict(sorted(files.items())),
        "project_files": dict(sorted(project.items())),
        "path": portable_path(sys.path, root),
    }


def _not_inputs() -> tuple[str, ...]:
    """Directories whose modules are no input of the capture: the standard library,
    site-packages (their distributions are recorded by version), and the compilers'
    caches (Inductor's and Triton's generated kernels are what the capture made)."""
    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    dirs += [p for p in sys.path if p.rstrip(os.sep).endswith(("site-packages", "dist-packages"))]
    utils = sys.modules.get("torch._inductor.runtime.runtime_utils")
    try:
        dirs.append(
            utils.cache_dir()
            if utils is not None
            else os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")
        )
    except Exception:  # noqa: BLE001 - no cache dir: nothing of Inductor's was loaded from one
        pass
    dirs += [
        os.environ.get("TRITON_CACHE_DIR", ""),
        os.path.join(os.path.expanduser("~"), ".triton"),
    ]
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


def _first_dist(dist: str, path: Optional[list[str]], root: Optional[str]) -> Any:
    """Distribution ``dist`` as an import on ``path`` (default ``sys.path``) would find it
    first, the project's own left out; None when there is none."""
    from importlib import metadata

    found = (
        metadata.distributions(name=dist)
        if path is None
        else metadata.distributions(name=dist, path=path)
    )
    return next((d for d in found if not _project_own(_dist_location(d), root)), None)


def _version_on(dist: str, path: Optional[list[str]], root: Optional[str]) -> Optional[str]:
    """The version of :func:`_first_dist`, or None."""
    found = _first_dist(dist, path, root)
    return None if found is None else found.version


def _editable(dist: Any) -> bool:
    """Whether ``dist`` is an editable install (PEP 610's direct_url.json, which pip and
    uv write for ``pip install -e``: ``{"dir_info": {"editable": true}}``)."""
    try:
        info = json.loads(dist.read_text("direct_url.json") or "null")
    except Exception:  # noqa: BLE001 - unreadable or not JSON: an ordinary install
        return False
    return (
        isinstance(info, dict)
        and isinstance(info.get("dir_info"), dict)
        and info["dir_info"].get("editable") is True
    )


def _installed(path: Optional[list[str]], root: Optional[str]) -> dict[str, str]:
    """Every distribution on ``path`` (default ``sys.path``) but the project's own:
    normalised name -> version of the first found, as an import would find it."""
    from importlib import metadata

    dists: dict[str, str] = {}
    found = metadata.distributions() if path is None else metadata.distributions(path=path)
    for dist in found:
        name = dist.metadata["Name"]
        if name and _normal(name) not in dists and not _project_own(_dist_location(dist), root):
            dists[_normal(name)] = dist.version
    return dists


def environment_record(*, root: Optional[str] = None) -> dict[str, Any]:
    """Every distribution installed where this process imports from (the project's
    own left out: its package is keyed by content), for a capture that recorded
    nothing; with this process's ``sys.path`` as the record's ``path``."""
    root = _real(root) or _context()[0]
    return {
        "distributions": dict(sorted(_installed(None, root).items())),
        "files": {},
        "project_files": {},
        "path": portable_path(sys.path, root),
        "environment": True,
    }


def record_path(source_path: Path) -> Path:
    """Where the build asks the capture of ``source_path`` (the pair's source half)
    to write its record: ``NAME.imports.json`` beside it."""
    return Path(source_path).with_name(Path(source_path).stem + ".imports.json")


def write_record(*, environment: bool = False) -> None:
    """Write :func:`record` (with ``environment``: :func:`environment_record`, and only
    where no record was written yet: the script runner's, for a script that did not
    capture through ``precompile_build.capture``) to ``$PRECOMPILE_IMPORTS_PATH`` (set
    by the build; nothing when unset). A record that cannot be made or written is left
    out, never an error of the capture: the build then keys the entry on its own view
    of the whole environment."""
    path = os.environ.get(RECORD_ENV)
    if not path or (environment and os.path.exists(path)):
        return
    try:
        doc = environment_record() if environment else record()
        Path(path).write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
    except Exception:  # noqa: BLE001 - an odd module or distribution: the whole environment instead
        pass


def read_record(path: Path) -> Optional[dict[str, Any]]:
    """The record a capture wrote at ``path``, or None (none written, or unreadable)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    keys = ("distributions", "files", "project_files")
    if (
        not isinstance(doc, dict)
        or not all(isinstance(doc.get(k), dict) for k in keys)
        or not isinstance(doc.get("path"), list)
    ):
        return None
    return doc


def _merged_path(recorded: list[str], here: list[str]) -> list[str]:
    """The record's path entries that exist, in their order (what the script added, at
    the front as ``sys.path.insert`` put it or at the end as setuptools appends its
    ``_vendor``), with each entry of this process's ``here`` that the record lacks (a
    new temp build environment standing for one gone) after the entry it follows here."""
    out = list(dict.fromkeys(p for p in recorded if os.path.exists(p)))
    prev: Optional[str] = None
    for p in dict.fromkeys(os.path.realpath(p or os.curdir) for p in here):
        if p not in out:
            out.insert(out.index(prev) + 1 if prev is not None else 0, p)
        prev = p
    return out


def changes(
    recorded: Mapping[str, Any], root: Optional[os.PathLike[str] | str] = None
) -> list[str]:
    """What differs now from ``recorded``, looked up on the record's ``path`` (rebased
    on project ``root``) merged with this process's ``sys.path`` (:func:`_merged_path`):
    ``"transformers 5.17.0 -> not installed"``, ``"fixturedep 1.0 -> 2.0"``,
    ``"capture/helpers.py changed"`` (a project file, relative to ``root``),
    ``"/…/helpers.py changed"`` (and, for an :func:`environment_record`,
    ``"newdist not installed -> 1.0"``); empty when nothing did. Called in a process
    with the capture's import context (programs/check_imports.py)."""
    real_root = _real(os.fspath(root)) if root is not None else None
    path = _merged_path(rebased_path(recorded.get("path") or [], real_root), sys.path)
    out = []
    if recorded.get("environment"):  # the whole environment: a new distribution counts too
        out += [
            f"{d} not installed -> {v}"
            for d, v in _installed(path, real_root).items()
            if d not in recorded.get("distributions", {})
        ]
    for dist, version in sorted(recorded.get("distributions", {}).items()):
        now = _version_on(dist, path, real_root)
        if now != version:
            out.append(f"{dist} {version} -> {now or 'not installed'}")
    files = [(p, p, d) for p, d in recorded.get("files", {}).items()]
    if real_root is not None:
        files += [
            (rel, os.path.join(real_root, rel), d)
            for rel, d in recorded.get("project_files", {}).items()
        ]
    elif recorded.get("project_files"):
        out.append("the project's files (no project root to compare them in)")
    for shown, where, digest in sorted(files):
        try:
            same = _sha256_file(where) == digest
        except OSError:
            same = False
        if not same:
            out.append(f"{shown} changed")
    return out
