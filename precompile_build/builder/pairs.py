"""Validate an artifact pair written by a capture and read what it records."""

from __future__ import annotations

import ast
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from precompile_runtime import envelope
from precompile_runtime.errors import PrecompileLoadError
from precompile_runtime.pair_format import SOURCE_ENGINES, version_problem

from ..errors import CaptureError

OUR_ENGINES = SOURCE_ENGINES


@dataclass(frozen=True)
class PairInfo:
    """What a valid pair records."""

    engine: str
    """`frozen`, `eager` or `torch`."""
    code_hash: str
    """sha256 hex of the source half."""
    fingerprint: Mapping[str, Any]
    """Host fingerprint the cache was captured on."""
    device: str
    """`cpu` or `cuda`."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """The source's PRECOMPILE_METADATA (our engines) or the engine's own data."""


def read_source_metadata(source: bytes, *, what: str) -> dict[str, Any]:
    """``PRECOMPILE_METADATA`` of a source half, read with ``ast.literal_eval``.

    The file is parsed, never executed. Raises CaptureError when it does not parse,
    lacks a top-level ``PRECOMPILE_METADATA = {...}`` literal, or has a format or
    version the runtime would refuse to load (``pair_format.version_problem``).
    """
    try:
        tree = ast.parse(source, filename=what)
    except (SyntaxError, ValueError) as e:
        raise CaptureError(f"Failed to validate {what}: not valid Python ({e})") from None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id == "PRECOMPILE_METADATA"
        ):
            try:
                meta = ast.literal_eval(node.value)
            except ValueError:
                break
            if not isinstance(meta, dict):
                break
            problem = version_problem(meta)  # the runtime's rule: what it would refuse to load
            if problem is not None:
                raise CaptureError(
                    f"Failed to validate {what}: {problem[0]}: the capture "
                    "script imported another precompile-build or precompile-runtime "
                    "than the build's; run it with the build's Python"
                )
            return meta
    raise CaptureError(
        f"Failed to validate {what}: no top-level `PRECOMPILE_METADATA = {{...}}` dict literal"
    )


def inspect_pair_bytes(source: bytes, cache: bytes, *, what: str = "pair") -> PairInfo:
    """Validate a pair given as bytes; see :func:`inspect_pair`."""
    if not envelope.is_envelope(cache):
        return _inspect_torch(source, cache, what)
    try:
        env = envelope.loads(cache, what=f"{what} cache")
    except PrecompileLoadError as e:
        raise CaptureError(f"Failed to validate {what}: {e}") from None
    if env.engine not in OUR_ENGINES:
        raise CaptureError(
            f"Failed to validate {what}: cache engine {env.engine!r} "
            f"is not one of {', '.join(OUR_ENGINES)}"
        )
    meta = read_source_metadata(source, what=f"{what} source")
    actual = hashlib.sha256(source).hexdigest()
    if env.code_hash != actual:
        raise CaptureError(
            f"Failed to validate {what}: code_hash mismatch: the cache "
            f"records {env.code_hash[:16]}..., the source hashes to "
            f"{actual[:16]}...; both halves must come from one capture"
        )
    if meta.get("engine") != env.engine:
        raise CaptureError(
            f"Failed to validate {what}: source says engine "
            f"{meta.get('engine')!r}, cache says {env.engine!r}"
        )
    device = meta.get("device") or env.fingerprint.get("device_type") or "cpu"
    return PairInfo(env.engine, actual, dict(env.fingerprint), str(device), meta)


def _inspect_torch(source: bytes, cache: bytes, what: str) -> PairInfo:
    try:
        from ..engines.torch_engine import inspect_torch_pair
    except ImportError:
        raise CaptureError(
            f"Failed to validate {what}: the cache is not a recognised "
            "pair format (no precompile-build envelope, and the torch "
            "engine is not available to read torch's)"
        ) from None
    try:
        info = inspect_torch_pair(source, cache)
    except CaptureError:
        raise
    except Exception as e:  # noqa: BLE001 - a torch-format parse error
        raise CaptureError(
            f"Failed to validate {what}: not a recognised pair format ({type(e).__name__}: {e})"
        ) from None
    if isinstance(info, PairInfo):
        return info
    return PairInfo(
        engine=info.get("engine", "torch"),
        code_hash=info["code_hash"],
        fingerprint=dict(info["fingerprint"]),
        device=info.get("device") or info["fingerprint"].get("device_type", "cpu"),
        meta=dict(info.get("meta") or {}),
    )


def inspect_pair(
    source_path: str | os.PathLike[str], cache_path: str | os.PathLike[str]
) -> PairInfo:
    """Validate the pair at ``source_path`` / ``cache_path`` and describe it.

    Our engines: the cache is an envelope whose code_hash must equal the sha256 of
    the source, and the source's PRECOMPILE_METADATA must agree on the engine.
    Torch pairs are delegated to ``engines.torch_engine.inspect_torch_pair``.

    Returns:
        :class:`PairInfo`.
    Raises:
        CaptureError: a file is unreadable, or any check fails; the message says which.
    """
    what = f"pair {os.fspath(source_path)} + {os.path.basename(cache_path)}"
    try:
        with open(source_path, "rb") as f:
            source = f.read()
        with open(cache_path, "rb") as f:
            cache = f.read()
    except OSError as e:
        raise CaptureError(f"Failed to read {what}: {e}") from None
    return inspect_pair_bytes(source, cache, what=what)
