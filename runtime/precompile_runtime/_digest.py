"""sha256 of a package's source tree: the capture cache key's ``package_sha256``,
and what an editable install's manifest records to notice a changed source at load."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_SKIP_DIRS = ("__pycache__",)


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 hex digest of a file's bytes, read in 1 MiB chunks. Raises OSError."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_files(package_dir: str | os.PathLike[str]) -> dict[str, str]:
    """sha256 of every file under ``package_dir`` by its relative POSIX path, except the
    top-level ``_precompiled/`` and any ``__pycache__/`` or ``.pyc`` (a dangling symlink
    imports nothing: left out). Raises OSError when a file cannot be read."""
    package_dir = Path(package_dir)
    files = []
    for base, dirs, names in os.walk(package_dir):
        rel_base = Path(base).relative_to(package_dir)
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _SKIP_DIRS and not (rel_base == Path(".") and d == "_precompiled")
        )
        files += [(rel_base / n).as_posix() for n in names if not n.endswith(".pyc")]
    return {
        rel: sha256_file(package_dir / rel)
        for rel in sorted(files)
        if (package_dir / rel).is_file()
    }


def digest_of(files: dict[str, str]) -> str:
    """:func:`package_digest` of the files :func:`package_files` gave."""
    h = hashlib.sha256()
    for rel in sorted(files):
        h.update(f"{rel}\0{files[rel]}\n".encode())
    return h.hexdigest()


def package_digest(package_dir: str | os.PathLike[str]) -> str:
    """sha256 (64 hex characters) over every file of :func:`package_files` (path-sorted,
    relative paths and contents). Raises OSError when a file cannot be read."""
    return digest_of(package_files(package_dir))
