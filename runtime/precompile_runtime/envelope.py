"""The cache half of an artifact pair: an integrity envelope around blobs.

Layout (all integers little-endian)::

    8 bytes   magic  b"PCBCACHE"
    4 bytes   header length H (uint32)
    H bytes   header: UTF-8 JSON object (see below)
    ...       blobs, concatenated in header order

Header keys: ``format`` (:data:`FORMAT`), ``version`` (:data:`VERSION`), ``engine``,
``code_hash`` (sha256 hex of the exact bytes of the source half), ``fingerprint``
(host fingerprint dict), ``meta`` (engine data, JSON) and ``blobs``: a list of
``{"name", "size", "sha256"}``. No pickle: the envelope is parsed and every blob is
verified before any of its content is used, so a tampered cache runs nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .errors import IntegrityError

MAGIC = b"PCBCACHE"
FORMAT = "precompile-build.cache"
VERSION = 1
_MAX_HEADER = 16 * 1024 * 1024  # bytes; a header past this is corrupt, not big
# exactly these keys: a writer that adds one must bump VERSION (readers refuse others)
_HEADER_KEYS = {"format", "version", "engine", "code_hash", "fingerprint", "meta", "blobs"}


@dataclass
class Envelope:
    """A parsed cache: header fields plus the verified blobs (name -> bytes)."""

    engine: str
    code_hash: str
    fingerprint: dict[str, Any]
    meta: dict[str, Any] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)


def sha256_hex(data: bytes) -> str:
    """sha256 of ``data`` as 64 lowercase hex characters."""
    return hashlib.sha256(data).hexdigest()


def dumps(env: Envelope) -> bytes:
    """Serialize ``env``; blobs are written in sorted name order (reproducible)."""
    names = sorted(env.blobs)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "engine": env.engine,
        "code_hash": env.code_hash,
        "fingerprint": env.fingerprint,
        "meta": env.meta,
        "blobs": [
            {"name": n, "size": len(env.blobs[n]), "sha256": sha256_hex(env.blobs[n])}
            for n in names
        ],
    }
    raw = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(raw)), raw, *(env.blobs[n] for n in names)])


def is_envelope(data: bytes) -> bool:
    """True when ``data`` starts with this format's magic bytes."""
    return data[: len(MAGIC)] == MAGIC


def loads(
    data: bytes, *, what: str = "cache", check_blobs: bool = True, context: str | None = None
) -> Envelope:
    """Parse and verify an envelope.

    Args:
        data: the whole cache file.
        what: how to name the file in error messages (e.g. its path).
        context: the package and target it belongs to, for error messages (the
            errors' ``context``; ``what`` is their ``where``).
        check_blobs: verify each blob's sha256. Pass False only where ``data`` itself
            was just verified against a sha256 recorded when it was written (the
            manifest's, in ``load_packaged``): that covers the header and every blob,
            so hashing the blobs again proves nothing more.
    Returns:
        the :class:`Envelope`, every blob's size (and sha256) verified.
    Raises:
        IntegrityError: bad magic, truncated data, unparsable header, unknown format,
            a newer version than this runtime reads, or a blob whose size/sha256 differs.
    """
    if not is_envelope(data):
        raise IntegrityError(
            "not a precompile-build cache (bad magic bytes)", where=what, context=context
        )
    if len(data) < len(MAGIC) + 4:
        raise IntegrityError("truncated before its header", where=what, context=context)
    (hlen,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    if hlen > _MAX_HEADER or start + hlen > len(data):
        raise IntegrityError(
            f"truncated or corrupt header (length {hlen})", where=what, context=context
        )
    try:
        header = json.loads(data[start : start + hlen].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise IntegrityError(
            f"header is not valid JSON ({type(e).__name__})", where=what, context=context
        ) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise IntegrityError(f"header format is not {FORMAT!r}", where=what, context=context)
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise IntegrityError(
            f"header version {version!r} is not a format version", where=what, context=context
        )
    if version > VERSION:
        raise IntegrityError(
            f"cache format version {version!r} is newer than this runtime reads ({VERSION})",
            advice="upgrade precompile-runtime",
            where=what,
            context=context,
        )
    if set(header) != _HEADER_KEYS:
        raise IntegrityError(
            f"header keys {sorted(header)} differ from {sorted(_HEADER_KEYS)}",
            where=what,
            context=context,
        )
    blobs: dict[str, bytes] = {}
    pos = start + hlen
    try:
        for entry in header["blobs"]:
            name, size, digest = entry["name"], entry["size"], entry["sha256"]
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise IntegrityError(
                    f"blob {name!r} has a bad size {size!r}", where=what, context=context
                )
            chunk = data[pos : pos + size]
            if len(chunk) != size:
                raise IntegrityError(f"truncated in blob {name!r}", where=what, context=context)
            if check_blobs and sha256_hex(chunk) != digest:
                raise IntegrityError(
                    f"blob {name!r} fails its sha256 check", where=what, context=context
                )
            blobs[name] = chunk
            pos += size
        env = Envelope(
            engine=str(header["engine"]),
            code_hash=str(header["code_hash"]),
            fingerprint=dict(header["fingerprint"]),
            meta=dict(header.get("meta") or {}),
            blobs=blobs,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise IntegrityError(
            f"malformed header ({type(e).__name__}: {e})", where=what, context=context
        ) from None
    if pos != len(data):
        raise IntegrityError(
            f"{len(data) - pos} trailing bytes after the last blob", where=what, context=context
        )
    return env


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``path`` through a temp file beside it, fsync, rename.

    A reader sees the old file or the new one, never a part. Raises OSError on
    failure, after removing the temp file.
    """
    path = os.fspath(path)
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644 & ~_umask())  # mkstemp makes 0600; artifacts are package data
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
