"""``_precompiled/manifest.json``: its schema (the TypedDicts below) and a strict reader.

The build writes it (``precompile_build/wheels/manifest.py``, ``merge.py`` for merged
wheels, ``mark_editable`` for editable installs); :func:`parse` checks what a load
relies on and returns a plain dict (the loader reads the rest with ``.get``: a
newer writer's extra keys are no error); the build writes :class:`Manifest`, typed. :class:`Manifest` is the
whole document, :class:`Variant` one build of a target for one host. A CPU variant of
a frozen target, as JSON (``tests/test_manifest_schema.py`` parses this example and
checks it against :class:`Manifest`)::

    {
      "format": "precompile-build.manifest",
      "version": 1,
      "package": "tinylm",
      "targets": {
        "forward": {
          "required": true,
          "status": "ok",
          "reason": null,
          "variants": [
            {
              "id": "3f2a9c0d11aa",
              "engine": "frozen",
              "device": "cpu",
              "fingerprint": {"torch": "2.13.0+cpu", "cuda": null, "hip": null, "triton": null,
                              "python": "3.11", "platform": "linux-x86_64", "device_type": "cpu",
                              "compute_capability": null, "cpu_isa": "avx2 x86-64-v3"},
              "code_hash": "9c1185a5c5e9fc54612808977ee8f548b2258d31a2d3e6f1b34a6e4bc8b0a111",
              "files": {
                "source": {"path": "forward.py", "size": 1234,
                           "sha256": "9c1185a5c5e9fc54612808977ee8f548b2258d31a2d3e6f1b34a6e4bc8b0a111"},
                "cache": {"path": "forward.cache", "size": 5678,
                          "sha256": "0b5e4d3c2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d"}
              },
              "bytecode": {"cpython-311": {"path": "forward.cpython-311.pyc", "size": 901,
                           "sha256": "5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d0b"}},
              "captured_at": "2026-11-29T16:00:00Z",
              "capture_device": null,
              "capture_seconds": 55.0,
              "peak_memory": {"host_bytes": 1288490188},
              "capture_breakdown": {"setup": 9.8, "trace": 5.1, "eager_call": 0.4, "compile": 30.2,
                                    "first_run": 3.0, "validate": 4.1},
              "validation": {"reference": "float64", "fallback_ops": [], "cases": []}
            }
          ]
        }
      }
    }

A failed optional target has ``"status": "failed"``, its ``reason`` and no variants.
File paths are plain names inside ``_precompiled/`` (no ``/``, ``\\``, ``..``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal, Optional, TypedDict, Union

from .errors import ManifestError
from .pair_format import ENGINES, Device, Engine, Fallback

FORMAT = "precompile-build.manifest"
VERSION = 1
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class FileEntry(TypedDict):
    """One half of a pair inside ``_precompiled/``."""

    path: str
    """A plain file name (:func:`safe_file_name`)."""
    size: int
    """Bytes."""
    sha256: str
    """sha256 hex of the file."""


class VariantFiles(TypedDict):
    source: FileEntry
    """The source half (``NAME.py``)."""
    cache: FileEntry
    """The cache half (``NAME.cache``)."""


class _VariantRequired(TypedDict):
    id: str
    """:func:`precompile_runtime.fingerprint.variant_id` of the fingerprint."""
    engine: Engine
    """The engine that made the pair."""
    device: Device
    """What it serves on."""
    fingerprint: dict[str, Any]
    """The capture host's fingerprint (:mod:`precompile_runtime.fingerprint`)."""
    code_hash: str
    """sha256 hex of the source half (its cache half is bound to it)."""
    files: VariantFiles
    """The two halves."""
    captured_at: str
    """UTC, ``YYYY-MM-DDTHH:MM:SSZ`` (from ``SOURCE_DATE_EPOCH`` when set)."""


class Variant(_VariantRequired, total=False):
    """One build of a target, for the hosts its fingerprint matches. The capture's
    device, seconds and peaks are left out of reproducible builds (``SOURCE_DATE_EPOCH``)."""

    capture_device: Union[int, str, None]
    """The CUDA device the capture ran on (index, or its CUDA_VISIBLE_DEVICES entry
    such as a UUID); None for a CPU capture."""
    capture_seconds: float
    """The capture script's run, seconds."""
    peak_memory: dict[str, Any]
    """Bytes: ``host_bytes`` (the capture's peak RSS); CUDA: ``gpu_bytes``,
    ``eager_gpu_bytes`` (the eager call's), per step ``gpu_steps``."""
    capture_breakdown: dict[str, float]
    """Seconds per step: ``setup`` (the script's, before its capture), ``trace``,
    ``eager_call``, ``compile``, ``first_run``, ``validate``."""
    fallback: Fallback
    """The target's ``fallback = "eager"`` was used: why not frozen."""
    bytecode: dict[str, FileEntry]
    """Per ``sys.implementation.cache_tag``, the source half's checked-hash pyc the build
    shipped beside it (``NAME.<cache tag>.pyc``); the loader reads no shipped pyc the
    manifest does not list, and refuses one whose size or sha256 differs."""
    compiled_for: list[str]
    """Frozen CUDA variants: the compute capabilities it has kernels for."""
    tuned_on: str
    """The GPU whose autotuning chose the configs."""
    validated_on: list[str]
    """The GPUs its kernels ran on at capture."""
    left_out: dict[str, str]
    """`cuda-archs` entries dropped, and why."""
    replaced: dict[str, dict[str, str]]
    """Per architecture, kernels whose config was swapped for one that fits, and why."""
    native_elsewhere: dict[str, str]
    """After ``merge``: architecture -> the id of a variant built on that GPU."""
    tracer: str
    """Frozen and eager pairs: what traced the call (``export``, ``export-strict``, ``make_fx``)."""
    checks: dict[str, int]
    """How much Python state each call checks (``attributes``, ``hooks``, ``globals``:
    what the trace assumed, capturing/assumed_state.py); absent for torch pairs."""
    validation: dict[str, Any]
    """Frozen engine: how the capture judged its kernels (``reference``,
    ``fallback_ops``, ``rule``, ``cases``, ``eager_call``); nothing that loads reads it."""


class Target(TypedDict):
    required: bool
    """A required target's failed capture failed the build; this one's did not."""
    status: Literal["ok", "failed"]
    """``failed``: an optional target left out (no variants)."""
    reason: Optional[str]
    """Why it failed, when it did."""
    variants: list[Variant]
    """Its builds, one per host kind (several after ``merge``)."""


class Editable(TypedDict):
    """An editable install's source (``mark_editable``), to tell a stale pair."""

    package_dir: str
    """The package's source directory, absolute."""
    package_sha256: str
    """Its digest at capture (:func:`precompile_runtime._digest.package_digest`)."""


class _ManifestRequired(TypedDict):
    format: str
    """:data:`FORMAT`."""
    version: int
    """:data:`VERSION` (a newer one is refused)."""
    package: str
    """The import package that carries ``_precompiled/``."""
    targets: dict[str, Target]
    """Target name -> its entry."""


class Manifest(_ManifestRequired, total=False):
    """The whole ``manifest.json``."""

    editable: Editable
    """Only in editable installs."""


def safe_file_name(name: object) -> bool:
    """True when ``name`` is a plain file name that stays inside ``_precompiled/``."""
    return isinstance(name, str) and bool(_SAFE_NAME.match(name)) and ".." not in name


def parse(data: bytes, *, where: str, context: str | None = None) -> dict[str, Any]:
    """Parse and validate a manifest.

    Args:
        data: the bytes of manifest.json.
        where: how to name it in messages (its path, and with no ``context`` the package).
        context: the package (``package 'pkg'``), or None.
    Returns:
        the manifest dict, structurally valid.
    Raises:
        ManifestError: not JSON, wrong format, newer version, or any field of the
            wrong type; a file path that is not a plain name in ``_precompiled/``. Its
            ``context`` and ``where`` (the file, and the target and variant within it)
            locate the problem, its ``finding`` says what it is, its ``advice`` what to
            do where there is one.
    """

    def fail(finding: str, advice: str | None = None) -> ManifestError:
        return ManifestError(finding, context=context, where=where, advice=advice)

    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise fail(f"manifest is not valid JSON ({type(e).__name__}: {e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise fail(f"not a precompile-build manifest (format != {FORMAT!r})")
    version = doc.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise fail("`version` must be an integer")
    if version > VERSION:
        raise fail(
            f"manifest format version {version} is newer than this precompile-runtime "
            f"reads ({VERSION})",
            advice="upgrade precompile-runtime",
        )
    targets = doc.get("targets")
    if not isinstance(targets, dict):
        raise fail("`targets` must be an object")
    for name, target in targets.items():
        _check_target(name, target, where, context)
    return doc


def _check_target(name: str, target: Any, where: str, context: str | None) -> None:
    def fail(at: str, finding: str) -> ManifestError:
        return ManifestError(finding, context=context, where=f"{where}: {at}" if at else where)

    at = f"target {name!r}"
    if not isinstance(target, dict):
        raise fail("", f"{at} must be an object")
    if target.get("status", "ok") not in ("ok", "failed"):
        raise fail(at, "`status` must be 'ok' or 'failed'")
    variants = target.get("variants", [])
    if not isinstance(variants, list):
        raise fail(at, "`variants` must be a list")
    for i, v in enumerate(variants):
        vat = f"{at} variant {i}"
        if not isinstance(v, dict):
            raise fail("", f"{vat} must be an object")
        if v.get("engine") not in ENGINES:
            raise fail(vat, f"unknown engine {v.get('engine')!r}")
        if not isinstance(v.get("fingerprint"), dict):
            raise fail(vat, "`fingerprint` must be an object")
        if not isinstance(v.get("code_hash"), str) or not _HEX64.match(v["code_hash"]):
            raise fail(vat, "`code_hash` must be 64 hex characters")
        if "validation" in v and not isinstance(v["validation"], dict):
            raise fail(vat, "`validation` must be an object")
        if "tracer" in v and not isinstance(v["tracer"], str):
            raise fail(vat, "`tracer` must be a string")
        if "checks" in v and not (
            isinstance(v["checks"], dict) and all(isinstance(n, int) for n in v["checks"].values())
        ):
            raise fail(vat, "`checks` must be an object of counts")
        for key in ("compiled_for", "validated_on"):
            if key in v and not (
                isinstance(v[key], list) and all(isinstance(a, str) for a in v[key])
            ):
                raise fail(vat, f"`{key}` must be a list of compute capabilities (strings)")
        for key in (
            "left_out",
            "replaced",
            "native_elsewhere",
            "peak_memory",
            "capture_breakdown",
            "distributed",
        ):
            if key in v and not isinstance(v[key], dict):
                raise fail(vat, f"`{key}` must be an object")
        files = v.get("files")
        if not isinstance(files, dict) or set(files) != {"source", "cache"}:
            raise fail(vat, "`files` must have exactly `source` and `cache`")
        shipped = v.get("bytecode", {})
        if not isinstance(shipped, dict):
            raise fail(vat, "`bytecode` must be an object (cache tag -> file)")
        for role, entry in [*files.items(), *((f"bytecode.{t}", e) for t, e in shipped.items())]:
            if not isinstance(entry, dict):
                raise fail(vat, f"files.{role} must be an object")
            if not safe_file_name(entry.get("path")):
                raise fail(
                    vat,
                    f"files.{role}.path {entry.get('path')!r} is not a plain file "
                    "name inside _precompiled/ (path traversal refused)",
                )
            size = entry.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise fail(vat, f"files.{role}.size must be a non-negative integer")
            if not isinstance(entry.get("sha256"), str) or not _HEX64.match(entry["sha256"]):
                raise fail(vat, f"files.{role}.sha256 must be 64 hex characters")


def dumps(doc: Mapping[str, Any]) -> bytes:
    """Canonical bytes of a manifest: sorted keys, 2-space indent, trailing newline."""
    return (json.dumps(doc, sort_keys=True, indent=2) + "\n").encode("utf-8")
