"""One process, one version: which installed files each package's loads came from.

The first load from a package that succeeds records its manifest's sha256 (which covers every pair
file's sha256) and where it was read; every later ``load_packaged`` of that package
compares the manifest as installed now (one ``os.stat`` where the file's signature is
unchanged, else a re-read and hash) and refuses with :class:`PackageChangedError`
where it differs: after an upgrade in place, or the package imported again from
another install, targets loaded before keep serving the old files, and loading more
would serve two versions in one process.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

from .errors import PackageChangedError

_lock = threading.Lock()
_first: dict[str, tuple[str, str]] = {}  # package -> (manifest location, sha256) of its first load
_seen: dict[str, tuple[tuple[int, ...], str]] = {}  # location -> (stat signature, sha256)


def _signature(location: str) -> tuple[int, ...] | None:
    try:
        st = os.stat(location)
    except (OSError, ValueError):  # a zipped package: no path to stat
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def current(manifest: Any) -> tuple[str, str] | None:
    """The manifest as installed now.

    Args:
        manifest: the ``manifest.json`` Traversable (a path, or a file in a zip).
    Returns:
        ``(location, sha256 hex of its bytes)``, or None when it cannot be read (the
        load that follows says why).
    """
    location = str(manifest)
    sig = _signature(location)
    if sig is not None:
        seen = _seen.get(location)
        if seen is not None and seen[0] == sig:
            return location, seen[1]
    try:
        raw = manifest.read_bytes()
    except OSError:
        return None
    digest = hashlib.sha256(raw).hexdigest()
    if sig is not None:
        _seen[location] = (sig, digest)
    return location, digest


def of_bytes(manifest: Any, raw: bytes) -> tuple[str, str]:
    """``(location, sha256)`` of ``raw``, the bytes just read from ``manifest``; not
    hashed again where the file's signature is the one :func:`current` hashed."""
    location = str(manifest)
    sig = _signature(location)
    seen = _seen.get(location)
    if sig is not None and seen is not None and seen[0] == sig:
        return location, seen[1]
    return location, hashlib.sha256(raw).hexdigest()


def check(package: str, installed: tuple[str, str], *, record: bool = False) -> None:
    """Check that ``installed`` is the version of ``package`` this process serves;
    with ``record``, make it that version where none is yet (after a load succeeded:
    a first load that failed, a reinstall racing it, records nothing).

    Args:
        package: the import package.
        installed: ``(manifest location, sha256)`` as :func:`current` gives it.
        record: set it as the package's version when none is recorded.
    Raises:
        PackageChangedError: the package's manifest differs from the one this process
            loaded from (an upgrade or reinstall in place, another install of the
            package imported); the message names both.
    """
    with _lock:
        first = _first.setdefault(package, installed) if record else _first.get(package, installed)
    if first[1] == installed[1]:
        return
    where = (
        f"at {first[0]}"
        if first[0] == installed[0]
        else f"at {first[0]}, now another install at {installed[0]}"
    )
    raise PackageChangedError(
        f"package {package!r}: its installed precompiled files changed since this process "
        f"loaded from them (manifest sha256 {first[1][:16]}…, now {installed[1][:16]}…, {where}: "
        "an upgrade or reinstall in place, or the package imported from another install). "
        "Targets loaded before keep serving the old version; loading from the new one would "
        "serve two versions in one process. Restart the process to serve the new version"
    )
