"""The files of one variant: read and checked against the manifest (size, sha256,
code_hash), the source half run as a module; and a load that failed told apart from
an installation that changed while it was read (:class:`PackageChangedError`).
"""

from __future__ import annotations

import linecache
import os
import sys
import types
from typing import Any

from . import _bytecode
from . import envelope as _envelope
from . import manifest as _manifest
from .errors import IntegrityError, ManifestError, PackageChangedError, PrecompileLoadError

__all__ = [
    "DATA_DIR",
    "exec_source",
    "raise_if_changed",
    "raise_if_package_gone",
    "read_pair",
    "shown_dir",
    "what_was_seen",
]

DATA_DIR = "_precompiled"


def shown_dir(package: str, data: Any) -> str:
    """The folder searched for ``_precompiled/``: the package's ``__file__`` folder."""
    path = getattr(sys.modules.get(package), "__file__", None)
    return os.path.dirname(path) if path else str(data.parent) if hasattr(data, "parent") else "?"


def raise_if_package_gone(package: str) -> None:
    """An imported package whose files are gone is being uninstalled or reinstalled."""
    from importlib.machinery import SourceFileLoader, SourcelessFileLoader

    module = sys.modules.get(package)
    path = getattr(module, "__file__", None)
    on_disk = isinstance(
        getattr(module, "__loader__", None), (SourceFileLoader, SourcelessFileLoader)
    )
    if path and on_disk and not os.path.exists(path):  # (a zip's __file__ is no path)
        raise PackageChangedError(
            f"package {package!r}: its installed files are gone ({path} no longer exists) "
            "while its precompiled targets were being loaded: it is being uninstalled or "
            "reinstalled. Retry once the installation has finished (in a new process if "
            "the package was upgraded)"
        )


def raise_if_changed(
    ctx: str, data: Any, raw: bytes, error: PrecompileLoadError, again: Any = None
) -> None:
    """Raise :class:`PackageChangedError` when the installed files changed while they
    were being loaded: the manifest now differs from ``raw`` (what this load read),
    or ``again`` (re-reading the pair) no longer fails the same way."""
    try:
        changed = (data / "manifest.json").read_bytes() != raw
    except OSError:
        changed = True  # it was there a moment ago
    if not changed and again is not None:
        try:
            again()
            changed = True
        except PrecompileLoadError as e:
            changed = _fields(e) != _fields(error)
    if changed:
        raise PackageChangedError(
            f"{ctx}: the installed files changed while they were being loaded (a pip install "
            f"of the package running at the same time?); nothing from them ran. Retry once "
            f"the installation has finished (in a new process if the package was upgraded). "
            f"What was seen: {what_was_seen(error)}"
        ) from None


def _fields(error: PrecompileLoadError) -> tuple[object, ...]:
    """What identifies a load error's finding: its type and fields (not its text)."""
    return (type(error), error.finding, error.context, error.where, error.advice)


def what_was_seen(error: PrecompileLoadError) -> str:
    """The finding of ``error`` and where, from its fields, without its context and its
    advice (which assumes the files stay as they are)."""
    return ": ".join(p for p in (error.where, error.finding) if p)


def read_pair(data: Any, ctx: str, variant: dict[str, Any]) -> tuple[bytes, bytes, str]:
    """(source, cache, sha256 of the source = its code_hash), both files checked
    against the manifest's size, sha256 and code_hash."""
    out, digests = [], []
    for role in ("source", "cache"):
        entry = variant["files"][role]
        rel = entry["path"]
        if not _manifest.safe_file_name(rel):  # parse() refuses these; belt and braces
            raise ManifestError(
                f"{role} path {rel!r} leaves {DATA_DIR}/ (path traversal refused)", context=ctx
            )
        shown = f"{DATA_DIR}/{rel}"
        try:
            blob = (data / rel).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError, KeyError):
            raise IntegrityError(
                "existence check failed: the manifest lists it, the package does not have it",
                advice="reinstall the package",
                context=ctx,
                where=shown,
            ) from None
        except OSError as e:
            raise IntegrityError(f"cannot be read ({e})", context=ctx, where=shown) from None
        if len(blob) != entry["size"]:
            raise IntegrityError(
                f"size check failed: the manifest says {entry['size']} bytes, the file has {len(blob)}",
                advice="the file is truncated or was replaced, reinstall the package",
                context=ctx,
                where=shown,
            )
        digest = _envelope.sha256_hex(blob)
        if digest != entry["sha256"]:
            raise IntegrityError(
                f"sha256 check failed: the manifest says {entry['sha256']}, the file has {digest}",
                advice="the file was modified, reinstall the package",
                context=ctx,
                where=shown,
            )
        out.append(blob)
        digests.append(digest)
    (source, cache), src_hash = out, digests[0]
    if variant["code_hash"] != src_hash:
        raise IntegrityError(
            f"code_hash check failed: the manifest records code_hash {variant['code_hash']}, the source "
            f"has {src_hash}",
            context=ctx,
            where=f"{DATA_DIR}/{variant['files']['source']['path']}",
        )
    return source, cache, src_hash


def exec_source(
    package: str,
    name: str,
    rel: str,
    source: bytes,
    path: Any,
    check_format: Any = None,
    shipped: bytes | None = None,
) -> types.ModuleType:
    """Run a verified source half as the module ``precompile_runtime.pairs.PACKAGE.NAME``.
    Where it raises after defining ``PRECOMPILE_METADATA``, ``check_format(meta)`` runs
    first: a pair of another format version fails with PairFormatError, not with the
    error its unreadable metadata caused. ``shipped``: the verified bytes of the pyc the
    build shipped beside it (_bytecode.shipped_bytes), or None."""
    filename = f"{package}/{DATA_DIR}/{rel}"
    modname = f"precompile_runtime.pairs.{package}.{name}"
    code = _bytecode.source_code(path, source, filename, shipped)
    module = types.ModuleType(modname)
    module.__file__ = filename
    text = source.decode("utf-8", errors="replace")
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    sys.modules[modname] = module  # dataclasses, pickle, fx look modules up by name
    try:
        exec(code, module.__dict__)
    except BaseException:
        sys.modules.pop(modname, None)
        if check_format is not None and "PRECOMPILE_METADATA" in module.__dict__:
            check_format(module.__dict__["PRECOMPILE_METADATA"])
        raise
    return module
