"""Capture cache: reuse an artifact pair whose inputs have not changed.

An entry is ``<cache dir>/<key>/{NAME.py, NAME.cache, entry.json}``; ``key`` is the
sha256 of :func:`~.cache_keys.key_components` (capture script bytes, the package's
importable source, the target's config, the values of the environment variables it
declares, the host fingerprint, the versions of precompile-build and precompile-runtime).
What the capture imported is known only after it ran: the entry records it
(:mod:`precompile_build.process.imported`: the distributions and versions, and the files of
other imported modules, in the capture process's import context) and :func:`fetch`
reuses the entry only while they are installed as recorded, looked up in that context.
A miss says what changed since the target's previous entry
(:func:`~.cache_changes.what_changed`).
Entries are written into a temp directory and renamed into place, under a per-key
file lock (``<key>.lock``) that a build holds from lookup to store, so a second
build of the same target waits and then reuses. An entry is verified (sizes,
sha256s from entry.json, :func:`~precompile_build.builder.pairs.inspect_pair`) on a copy
taken into the build's work directory before reuse; a bad one is discarded.
The cache is an optimisation: failing to write it never fails a build.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple, Optional

import filelock

from precompile_runtime._digest import sha256_file  # one file hash for both sides
from precompile_runtime.envelope import write_atomic

from ..config.cache_settings import default_cache_dir
from ..config.settings import Settings
from ..errors import BuildError, CaptureError
from ..process import imported
from ..programs import path as program_path
from .cache_changes import what_changed
from .cache_keys import (
    CAPTURE_ENV,
    ENTRY_FORMAT,
    ENTRY_JSON,
    ENTRY_VERSION,
    cache_key,
    key_components,
)
from .pairs import PairInfo, inspect_pair

__all__ = [
    "CAPTURE_ENV",
    "ENTRY_FORMAT",
    "ENTRY_JSON",
    "ENTRY_VERSION",
    "TAG_NAME",
    "Lookup",
    "Miss",
    "UntrustedCacheError",
    "cache_key",
    "cache_root",
    "check_root",
    "clean",
    "digest_of",
    "discard",
    "fetch",
    "host_fingerprints",
    "key_components",
    "lock",
    "package_digest",
    "package_files",
    "store",
    "what_changed",
]

TAG_NAME = "CACHEDIR.TAG"
_TAG = (
    b"Signature: 8a477f597d28d172789f06886806bc55\n"
    b"# This directory is a precompile-build capture cache; "
    b"`python -m precompile_build clean` removes it.\n"
)


def cache_root(settings: Settings) -> Path:
    """The cache directory of ``settings`` (configured, or the per-user default)."""
    return settings.cache_dir if settings.cache_dir is not None else default_cache_dir()


def package_files(package_dir: Path) -> dict[str, str]:
    """sha256 of each file :func:`package_digest` covers, by relative POSIX path (an
    entry keeps them to say which changed). Raises OSError when a file cannot be read."""
    from precompile_runtime._digest import package_files as files

    return files(package_dir)


def digest_of(files: Mapping[str, str]) -> str:
    """:func:`package_digest` from :func:`package_files`'s value (one read of the tree)."""
    from precompile_runtime._digest import digest_of as digest

    return digest(dict(files))


def package_digest(package_dir: Path) -> str:
    """sha256 (64 hex characters) over every file under ``package_dir`` (path-sorted,
    relative paths and contents), except the top-level ``_precompiled/`` and any
    ``__pycache__/``. Raises OSError when a file cannot be read. (The runtime's
    :func:`precompile_runtime._digest.package_digest`: an editable install's manifest
    records it, and the loader compares it.)"""
    from precompile_runtime._digest import package_digest as digest

    return digest(package_dir)


_fp_memo: dict[tuple[Any, ...], dict[str, Any]] = {}


def _memo_key(devices: tuple[str, ...]) -> str:
    """What determines the host fingerprints, read without importing torch: the
    interpreter, the installed torch/triton versions (package metadata), the GPUs as
    nvidia-smi lists them, and the fingerprint code itself."""
    from importlib import metadata

    import precompile_runtime.fingerprint as fingerprint

    def version(dist: str) -> Optional[str]:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    gpus = None
    if "cuda" in devices:
        try:
            gpus = subprocess.run(
                ["nvidia-smi", "--query-gpu=uuid,name,compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            gpus = "no nvidia-smi"
    parts = [
        sys.executable,
        sys.version,
        list(devices),
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        [version(d) for d in ("torch", "triton", "pytorch-triton")],
        gpus,
        sha256_file(Path(fingerprint.__file__)),
        sha256_file(Path(program_path("host_fingerprints"))),
    ]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def host_fingerprints(devices: Iterable[str], memo_dir: Optional[Path] = None) -> dict[str, Any]:
    """Host fingerprint per device type, for the cache key.

    Computed in a subprocess of the build's interpreter (the one that runs the
    capture scripts), so the build process neither imports torch nor creates a CUDA
    context on a GPU the captures need. Memoised per process, and on disk under
    ``memo_dir/fingerprints/`` keyed by :func:`_memo_key`, so that a rebuild with
    nothing changed need not import torch for it (seconds on a GPU host; checking a
    reused `torch`-engine pair still does).

    Args:
        devices: device types (``cpu``, ``cuda``).
        memo_dir: the capture cache's root, or None (no disk memo).
    Returns:
        ``{device: fingerprint}``; for ``cuda`` the distinct fingerprints of every
        visible GPU (a capture may be scheduled on any of them), sorted.
    Raises:
        CaptureError: the subprocess failed (torch not importable, ...).
    """
    devices = tuple(sorted(set(devices)))
    memo = (sys.executable, devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    disk = Path(memo_dir) / "fingerprints" / f"{_memo_key(devices)}.json" if memo_dir else None
    if memo not in _fp_memo and disk is not None and disk.is_file():
        try:
            _fp_memo[memo] = json.loads(disk.read_text())
        except (OSError, ValueError):
            pass  # unreadable memo: compute again
    if memo not in _fp_memo:
        import precompile_runtime

        # The probe imports what a capture would (the same environment): the runtime's
        # folder goes on PYTHONPATH only when this process found it some other way.
        # Put there needlessly it would break pip's isolated build environment, whose
        # sitecustomize refuses a PYTHONPATH naming its own folders (its .pth files then
        # go unread: a torch found through one is missing).
        own = str(Path(precompile_runtime.__file__).parent.parent)
        env = dict(os.environ)
        if own not in sys.path:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (own, env.get("PYTHONPATH", "")) if p)
        proc = subprocess.run(
            [sys.executable, program_path("host_fingerprints"), *devices],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise CaptureError(f"Failed to compute the host fingerprint: {last}")
        lines = proc.stdout.strip().splitlines()
        if not lines:
            raise CaptureError("Failed to compute the host fingerprint: the probe printed nothing")
        raw = json.loads(lines[-1])
        _fp_memo[memo] = {
            d: sorted({json.dumps(fp, sort_keys=True) for fp in fps}) for d, fps in raw.items()
        }
        if disk is not None:
            try:
                disk.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(disk, json.dumps(_fp_memo[memo]).encode())
            except OSError:
                pass  # no memo: the next build computes it again
    return _fp_memo[memo]


def lock(root: Path, key: str) -> filelock.FileLock:
    """The file lock of entry ``key`` (``<root>/<key>.lock``; creates ``root``, raising
    OSError when it cannot)."""
    _ensure_root(root)
    return filelock.FileLock(str(root / f"{key}.lock"))


class UntrustedCacheError(OSError):
    """The capture cache directory could be changed by another user (docs/security.md)."""


def check_root(root: Path) -> None:
    """Create ``root`` (each missing folder mode 0o700) and make sure that nobody but
    this user (or root) can change it: owned by this user, not writable by group or
    others, nor any folder above it (sticky folders such as ``/tmp`` aside).

    A capture cache holds whole pairs that a build copies into its wheel on a key
    match: whoever can write it can put code into every wheel built from it.

    Raises:
        UntrustedCacheError: (an OSError) it could be changed by another user; the
            message names the path and the fix (the runner then builds without it).
        OSError: it cannot be created or stat'ed.
    """
    from precompile_runtime._safe_path import problem

    missing = []
    head = root
    while not head.is_dir() and head.parent != head:
        missing.append(head)
        head = head.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
    found = problem(str(root))
    if found is not None:
        raise UntrustedCacheError(
            f"the capture cache directory {root} is not used: {found[0]}; whoever can change "
            f"it can put code into every wheel built from it. To use it: {found[1]}; or set "
            "`cache-dir` (PRECOMPILE_BUILD_CACHE_DIR) to a directory only you can write "
            "(docs/security.md)"
        )


def _ensure_root(root: Path) -> None:
    check_root(root)
    tag = root / TAG_NAME
    if not tag.exists():
        try:
            with open(tag, "xb") as f:
                f.write(_TAG)
        except FileExistsError:
            pass


def _file_meta(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": sha256_file(path)}


Miss = Literal["no entry", "entry not trusted", "imports changed", "entry corrupt"]


class Lookup(NamedTuple):
    """What :func:`fetch` found: ``meta`` on a hit; else the kind of miss and its detail
    (what the build line shows: ``why``)."""

    meta: Optional[dict[str, Any]]
    miss: Optional[Miss] = None
    detail: str = ""

    @property
    def why(self) -> str:
        """The miss as the build's line for the target says it (``""`` on a hit)."""
        return f"{self.miss}: {self.detail}" if self.miss and self.detail else self.miss or ""


def fetch(
    root: Path,
    key: str,
    name: str,
    dest: Path,
    changes: Optional[Callable[[dict[str, Any]], list[str]]] = None,
) -> Lookup:
    """Copy entry ``key`` of target ``name`` to ``dest/NAME.{py,cache}`` and verify it.

    Call with :func:`lock` held; ``dest`` is a directory only this call writes (it
    is removed again on a miss). ``changes``: what differs from the entry's imports
    record (the runner asks in the capture's import context:
    :func:`~precompile_build.builder.script.imports_changes`); default
    :func:`~precompile_build.process.imported.changes` in this process.
    Returns a :class:`Lookup`: ``meta`` (entry.json's dict with "info": PairInfo) on a
    hit, else the miss: ``"no entry"``, ``"entry not trusted"`` (the entry may hold
    another user's files: never used, the new capture replaces it), ``"imports
    changed"`` (what the capture imported is installed in another version, or gone, or
    a project file it imported changed; the entry stays until the new capture replaces
    it) or ``"entry corrupt"`` (the corrupt entry is removed).
    """
    entry_dir = root / key
    if not (entry_dir / ENTRY_JSON).is_file():
        return Lookup(None, "no entry")
    untrusted = _entry_problem(entry_dir, name)
    if untrusted is not None:  # never used; the new capture's store() replaces it
        return Lookup(None, "entry not trusted", untrusted)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        meta = json.loads((entry_dir / ENTRY_JSON).read_text(encoding="utf-8"))
        if meta.get("format") != ENTRY_FORMAT or meta.get("key") != key:
            raise ValueError(f"{ENTRY_JSON} is not this entry's (format/key differ)")
        if not isinstance(meta.get("imports"), dict):
            raise ValueError(f"{ENTRY_JSON} records no imports")
        changed = (changes or imported.changes)(meta["imports"])
        if changed:  # the capture imported other code than is installed now: capture again
            shutil.rmtree(dest, ignore_errors=True)
            shown = ", ".join(changed[:3]) + (
                f" and {len(changed) - 3} more" if len(changed) > 3 else ""
            )
            return Lookup(None, "imports changed", shown)
        for role, suffix in (("source", ".py"), ("cache", ".cache")):
            copy = dest / f"{name}{suffix}"
            shutil.copyfile(entry_dir / f"{name}{suffix}", copy)
            got, want = _file_meta(copy), meta["files"][role]
            if got != {"size": want["size"], "sha256": want["sha256"]}:
                raise ValueError(
                    f"{copy.name}: size/sha256 {got['size']}/"
                    f"{got['sha256'][:12]} != recorded {want['size']}/"
                    f"{want['sha256'][:12]}"
                )
        meta["info"] = inspect_pair(dest / f"{name}.py", dest / f"{name}.cache")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, CaptureError) as e:
        shutil.rmtree(dest, ignore_errors=True)
        discard(entry_dir)
        return Lookup(None, "entry corrupt", f"{type(e).__name__}: {e}".replace("\n", " ")[:285])
    return Lookup(meta)


def _entry_problem(entry_dir: Path, name: str) -> Optional[str]:
    """Why entry ``entry_dir`` may hold someone else's files (a symlink, owned by
    another user, writable by group or others: the folder or one of its files), or
    None. Written by this user, its files' sha256s are then checked (:func:`fetch`)."""
    from precompile_runtime._safe_path import leaf_problem

    for path in (
        entry_dir,
        entry_dir / ENTRY_JSON,
        entry_dir / f"{name}.py",
        entry_dir / f"{name}.cache",
    ):
        try:
            found = leaf_problem(str(path), os.lstat(path))
        except FileNotFoundError:
            continue  # a missing file: fetch finds the entry corrupt
        if found is not None:
            return found[0]
    return None


def store(
    root: Path,
    key: str,
    name: str,
    source: Path,
    cache: Path,
    info: PairInfo,
    *,
    seconds: float,
    capture_device: Any,
    components: Mapping[str, Any],
    project_root: Optional[Path] = None,
    package: Optional[str] = None,
    package_files: Optional[Mapping[str, str]] = None,
) -> None:
    """Write entry ``key`` atomically (temp dir beside it, then rename; no fsync:
    :func:`fetch` checks every file's sha256, so an entry torn by a crash is
    recaptured, never used).

    Args:
        seconds: how long the capture took (wall seconds).
        capture_device: the CUDA device it ran on (index or CUDA_VISIBLE_DEVICES
            entry), None for cpu.
        components: :func:`key_components` of the entry, kept for `why` reports.
        project_root: the project built (where the build's own view of the
            environment is made when the capture recorded nothing).
        package, package_files: the package's name and :func:`package_files`, kept
            to say which files changed when a later build misses (:func:`what_changed`).
    Call with :func:`lock` held. Raises OSError when the cache cannot be written.
    """
    _ensure_root(root)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=root))
    try:
        files = {}
        for role, src in (("source", source), ("cache", cache)):
            dst = tmp / src.name
            shutil.copyfile(src, dst)
            files[role] = {"path": src.name, **_file_meta(dst)}
        imports = imported.read_record(imported.record_path(source)) or imported.environment_record(
            root=str(project_root) if project_root else None
        )
        meta = {
            "format": ENTRY_FORMAT,
            "version": ENTRY_VERSION,
            "key": key,
            "target": name,
            "engine": info.engine,
            "device": info.device,
            "imports": imports,
            "capture_seconds": round(seconds, 3),
            "capture_device": capture_device,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "created_ns": time.time_ns(),
            "package": package,
            "package_files": dict(package_files or {}),
            "files": files,
            "components": components,
        }
        (tmp / ENTRY_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True), encoding="utf-8")
        if (root / key).exists():
            discard(root / key)
        os.replace(tmp, root / key)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def discard(entry_dir: Path) -> None:
    """Remove an entry: rename it aside (atomic for readers), then delete it."""
    trash = entry_dir.with_name(f".trash-{entry_dir.name[:16]}-{os.getpid()}-{time.time_ns()}")
    try:
        os.replace(entry_dir, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def clean(root: Path) -> int:
    """Delete the capture cache at ``root``: only what this module writes (entries,
    locks, temp dirs, the fingerprint memo, the CACHEDIR.TAG), then ``root`` itself
    when left empty.

    Returns:
        the number of entries removed.
    Raises:
        BuildError: ``root`` has no CACHEDIR.TAG written by this module (it is not a
            capture cache: nothing is touched).
        OSError: ``root`` exists but cannot be listed.
    """
    if not root.is_dir():
        return 0
    tag = root / TAG_NAME
    if not tag.is_file() or tag.read_bytes() != _TAG:
        raise BuildError(
            f"{root} is not a precompile-build capture cache (no CACHEDIR.TAG of ours); "
            "nothing removed. Pass the directory the build uses (--cache-dir)"
        )
    removed = 0
    for p in root.iterdir():
        key = p.name.removesuffix(".lock")
        if not (len(key) == 64 and all(c in "0123456789abcdef" for c in key)):
            if p.is_dir() and (p.name.startswith((".tmp-", ".trash-")) or p.name == "fingerprints"):
                shutil.rmtree(p, ignore_errors=True)
            continue
        if p.is_dir():
            discard(p)
            removed += 1
        else:  # <key>.lock
            p.unlink(missing_ok=True)
    tag.unlink(missing_ok=True)
    try:
        root.rmdir()
    except OSError:
        pass  # something else lives there: keep it
    return removed
