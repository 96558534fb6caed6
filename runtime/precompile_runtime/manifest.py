"""``_precompiled/manifest.json``: the schema, and a strict reader.

Schema (format ``precompile-build.manifest``, version 1)::

    {
      "format": "precompile-build.manifest",
      "version": 1,
      "package": "tinylm",
      "targets": {
        "forward": {
          "required": true,
          "status": "ok",              # or "failed": optional target left out
          "reason": null,              # why it failed, when it did
          "variants": [
            {
              "id": "3f2a9c0d11aa",    # fingerprint.variant_id(fingerprint)
              "engine": "frozen",      # frozen | torch | eager
              "device": "cpu",
              "fingerprint": {...},
              "code_hash": "<sha256 of the source file>",
              "files": {
                "source": {"path": "forward.py", "size": 1234, "sha256": "..."},
                "cache":  {"path": "forward.cache", "size": 5678, "sha256": "..."}
              },
              "capture_seconds": 55.0,    # the script's run; absent in reproducible builds
              "captured_at": "2026-11-29T16:00:00Z",
              "capture_device": 0,     # CUDA device it ran on (index or UUID); null for cpu
              "peak_memory": {"host_bytes": 1288490188,  # the capture's peak RSS; absent
                              "gpu_bytes": 17179869184,  # in reproducible builds; GPU: CUDA
                              "eager_gpu_bytes": 16106127360},  # frozen captures (and eager's call)
              "capture_breakdown": {"setup": 9.8,  # seconds; the script's, before its capture
                                    "trace": 5.1, "eager_call": 0.4, "compile": 30.2,  # the
                                    "first_run": 3.0, "validate": 4.1},  # frozen engine's steps
              "fallback": {"from": "frozen", "reason": "..."}  # only when `fallback = "eager"` was used
              "compiled_for": ["8.0", "9.0", "12.0"],  # frozen CUDA variants: GPUs it has kernels for
              "tuned_on": "9.0",       # the GPU whose autotuning chose the configs
              "validated_on": ["9.0"], # the GPUs its kernels ran on at capture
              "left_out": {"8.6": "kernel k: ..."},   # `cuda-archs` entries dropped, and why
              "replaced": {"12.0": {"k": "..."}},     # configs swapped for one that fits
              "native_elsewhere": {"8.0": "<id>"},    # merge: a variant built on that GPU
              "distributed": {         # `world-size` targets: one pair for every rank
                "world_size": 2, "mesh": {"shape": [2], "dim_names": ["tp"]},
                "mode": "real",        # every rank captured (real collectives); "fake": rank 0 alone
                "backend": "gloo", "ranks_captured": 2,
                "validated": true},    # false: compile-only at this world size
              "validation": {          # frozen engine: how the capture judged its kernels
                "reference": "float64",  # the traced graph run in this dtype
                "fallback_ops": [],    # ops run in a narrower dtype (no kernel in the reference dtype)
                "rule": "frozen_error <= multiple * eager_error + floor (...)",
                "cases": [{"case": "the example inputs", "values": 3,
                           "worst": {"value": "output 0", "eager_error": 0.0021,
                                     "frozen_error": 0.0024, "multiple": 3.0, "floor": 0.0078,
                                     "max_abs_diff": 0.0625, "max_abs_value": 5.25}}],
                "eager_call": {"outcome": "ok", "difference": 0.0, "allowed": 0.0149, ...}
              }
            }
          ]
        }
      }
    }

File paths are plain names inside ``_precompiled/`` (no ``/``, ``\\``, ``..``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ManifestError

FORMAT = "precompile-build.manifest"
VERSION = 1
ENGINES = ("frozen", "torch", "eager")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def safe_file_name(name: object) -> bool:
    """True when ``name`` is a plain file name that stays inside ``_precompiled/``."""
    return isinstance(name, str) and bool(_SAFE_NAME.match(name)) and ".." not in name


def parse(data: bytes, *, where: str) -> dict[str, Any]:
    """Parse and validate a manifest.

    Args:
        data: the bytes of manifest.json.
        where: how to name it in messages (package and path).
    Returns:
        the manifest dict, structurally valid.
    Raises:
        ManifestError: not JSON, wrong format, newer version, or any field of the
            wrong type; a file path that is not a plain name in ``_precompiled/``.
    """
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ManifestError(f"{where}: manifest is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f"{where}: not a precompile-build manifest (format != {FORMAT!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise ManifestError(f"{where}: `version` must be an integer")
    if version > VERSION:
        raise ManifestError(
            f"{where}: manifest format version {version} is newer than this "
            f"precompile-runtime reads ({VERSION}); upgrade precompile-runtime"
        )
    targets = doc.get("targets")
    if not isinstance(targets, dict):
        raise ManifestError(f"{where}: `targets` must be an object")
    for name, target in targets.items():
        _check_target(name, target, where)
    return doc


def _check_target(name: str, target: Any, where: str) -> None:
    ctx = f"{where}: target {name!r}"
    if not isinstance(target, dict):
        raise ManifestError(f"{ctx} must be an object")
    if target.get("status", "ok") not in ("ok", "failed"):
        raise ManifestError(f"{ctx}: `status` must be 'ok' or 'failed'")
    variants = target.get("variants", [])
    if not isinstance(variants, list):
        raise ManifestError(f"{ctx}: `variants` must be a list")
    for i, v in enumerate(variants):
        vctx = f"{ctx} variant {i}"
        if not isinstance(v, dict):
            raise ManifestError(f"{vctx} must be an object")
        if v.get("engine") not in ENGINES:
            raise ManifestError(f"{vctx}: unknown engine {v.get('engine')!r}")
        if not isinstance(v.get("fingerprint"), dict):
            raise ManifestError(f"{vctx}: `fingerprint` must be an object")
        if not isinstance(v.get("code_hash"), str) or not _HEX64.match(v["code_hash"]):
            raise ManifestError(f"{vctx}: `code_hash` must be 64 hex characters")
        if "validation" in v and not isinstance(v["validation"], dict):
            raise ManifestError(f"{vctx}: `validation` must be an object")
        for key in ("compiled_for", "validated_on"):
            if key in v and not (isinstance(v[key], list) and all(isinstance(a, str) for a in v[key])):
                raise ManifestError(f"{vctx}: `{key}` must be a list of compute capabilities (strings)")
        for key in ("left_out", "replaced", "native_elsewhere", "peak_memory", "capture_breakdown", "distributed"):
            if key in v and not isinstance(v[key], dict):
                raise ManifestError(f"{vctx}: `{key}` must be an object")
        files = v.get("files")
        if not isinstance(files, dict) or set(files) != {"source", "cache"}:
            raise ManifestError(f"{vctx}: `files` must have exactly `source` and `cache`")
        for role, entry in files.items():
            if not isinstance(entry, dict):
                raise ManifestError(f"{vctx}: files.{role} must be an object")
            if not safe_file_name(entry.get("path")):
                raise ManifestError(
                    f"{vctx}: files.{role}.path {entry.get('path')!r} is not a plain file "
                    "name inside _precompiled/ (path traversal refused)"
                )
            size = entry.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise ManifestError(f"{vctx}: files.{role}.size must be a non-negative integer")
            if not isinstance(entry.get("sha256"), str) or not _HEX64.match(entry["sha256"]):
                raise ManifestError(f"{vctx}: files.{role}.sha256 must be 64 hex characters")


def dumps(doc: dict[str, Any]) -> bytes:
    """Canonical bytes of a manifest: sorted keys, 2-space indent, trailing newline."""
    return (json.dumps(doc, sort_keys=True, indent=2) + "\n").encode("utf-8")
