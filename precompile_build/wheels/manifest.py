"""Assemble `_precompiled/` contents (manifest.json, pairs and their shipped bytecode)
from capture results."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from precompile_runtime import manifest as manifest_format
from precompile_runtime._bytecode import shipped_path
from precompile_runtime.fingerprint import variant_id
from precompile_runtime.pair_format import Device, Engine, Fallback

from ..builder import arch_report
from ..builder.results import CaptureResult
from .bytecode import shipped_bytecode

MANIFEST_NAME = "manifest.json"


def _file_entry(name: str, data: bytes) -> manifest_format.FileEntry:
    return {"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _captured_at() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    stamp = int(epoch) if epoch and epoch.isdigit() else time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))


def assemble(package: str, results: Sequence[CaptureResult]) -> dict[str, bytes]:
    """The files of `<package>/_precompiled/`, by plain file name.

    Args:
        package: import package receiving the files.
        results: capture results; ``ok`` ones contribute ``NAME.py``/``NAME.cache``
            and a variant, ``failed`` ones a target with ``status: failed``.
    Returns:
        ``{"manifest.json": bytes, "NAME.py": bytes, "NAME.cache": bytes, ...}`` and each
        source half's checked-hash pyc for this interpreter, ``NAME.<cache tag>.pyc``
        (wheels/bytecode.py), listed in its variant's ``bytecode`` entry by cache tag
        (size and sha256: the loader verifies it before use, and takes it only where it
        was compiled from the verified source's bytes).
        With ``SOURCE_DATE_EPOCH`` set, ``captured_at`` comes from it and
        ``capture_seconds``, ``capture_device``, ``peak_memory`` and ``capture_breakdown``
        are left out, so the manifest is
        reproducible. ``capture_device`` is the CUDA device the capture ran on (its
        index, or its CUDA_VISIBLE_DEVICES entry such as a UUID; None: cpu); a reused
        pair keeps its original capture's device and seconds.
    Raises:
        BuildError: a source half does not byte-compile (wheels/bytecode.py).
    """
    reproducible = "SOURCE_DATE_EPOCH" in os.environ
    files: dict[str, bytes] = {}
    targets: dict[str, manifest_format.Target] = {}
    for r in results:
        entry: manifest_format.Target = {
            "required": r.required,
            "reason": r.reason,
            "variants": [],
            "status": "ok" if r.status == "ok" else "failed",
        }
        targets[r.name] = entry
        if r.status != "ok":
            continue
        assert r.info is not None and r.source_path and r.cache_path
        source, cache = r.source_path.read_bytes(), r.cache_path.read_bytes()
        src_name, cache_name = f"{r.name}.py", f"{r.name}.cache"
        files[src_name], files[cache_name] = source, cache
        entry["variants"].append(_variant(r, source, cache, reproducible))
    doc: manifest_format.Manifest = {
        "format": manifest_format.FORMAT,
        "version": manifest_format.VERSION,
        "package": package,
        "targets": targets,
    }
    shipped = shipped_bytecode({n: d for n, d in files.items() if n.endswith(".py")})
    files.update(shipped)
    tag = sys.implementation.cache_tag
    for entry in targets.values():  # every file the loader reads, in the manifest
        for v in entry["variants"]:
            pyc = shipped_path(v["files"]["source"]["path"])
            if tag and pyc in shipped:
                v["bytecode"] = {tag: _file_entry(pyc, shipped[pyc])}
    files[MANIFEST_NAME] = manifest_format.dumps(doc)
    return files


def _variant(
    r: CaptureResult, source: bytes, cache: bytes, reproducible: bool
) -> manifest_format.Variant:
    """The manifest's variant of an ``ok`` result whose pair is ``source``/``cache``
    (the build-to-build fields left out when ``reproducible``)."""
    assert r.info is not None
    src_name, cache_name = f"{r.name}.py", f"{r.name}.cache"
    fp = dict(r.info.fingerprint)
    # (the pair's engine and device: builder/pairs.py checked them)
    variant: manifest_format.Variant = {
        "id": variant_id(fp),
        "engine": cast(Engine, r.info.engine),
        "device": cast(Device, r.info.device),
        "fingerprint": fp,
        "code_hash": r.info.code_hash,
        "files": {
            "source": _file_entry(src_name, source),
            "cache": _file_entry(cache_name, cache),
        },
        "captured_at": _captured_at(),
    }
    if r.info.meta.get("fallback"):  # target `fallback = "eager"`: why not frozen
        variant["fallback"] = cast(Fallback, dict(r.info.meta["fallback"]))
    meta = r.info.meta or {}
    if meta.get("tracer"):  # frozen and eager pairs: export, export-strict or make_fx
        variant["tracer"] = meta["tracer"]
    if "assumed" in meta:  # the Python state a call checks (capturing/assumed_state.py)
        variant["checks"] = checks_count(meta["assumed"], meta.get("guards"))
    validation = meta.get("validation")
    if validation is not None:  # the numbers the capture was judged by (frozen engine)
        variant["validation"] = validation
    variant.update(arch_report.variant_fields(fp, r.info.meta, r.info.engine))  # type: ignore[typeddict-item]  # compiled_for, tuned_on, ...
    if r.distributed is not None:  # `world-size`: how the ranks were captured (builder/ranks.py)
        variant["distributed"] = dict(r.distributed)  # type: ignore[typeddict-unknown-key]
    if not reproducible:  # which GPU and how long vary from build to build
        variant["capture_device"] = r.device_index
        seconds = r.capture_seconds if r.capture_seconds is not None else r.seconds
        variant["capture_seconds"] = round(seconds, 1)
        if r.peak_memory:  # what the capture held at most (process/stats.py), in bytes
            variant["peak_memory"] = dict(r.peak_memory)
        if r.capture_breakdown:  # its seconds per step
            variant["capture_breakdown"] = dict(r.capture_breakdown)
    return variant


def mark_editable(
    files: Mapping[str, bytes], package_dir: Path, package_sha256: str
) -> dict[str, bytes]:
    """``files`` with the manifest's ``editable`` entry set: the source package
    directory (absolute) and its :func:`~precompile_runtime._digest.package_digest`
    at capture time. Only editable builds write it; the loader then compares the
    digest at load and serves no kernels of a changed source."""
    doc = manifest_format.parse(files[MANIFEST_NAME], where="assembled manifest")
    doc["editable"] = {
        "package_dir": str(Path(package_dir).resolve()),
        "package_sha256": package_sha256,
    }
    return {**files, MANIFEST_NAME: manifest_format.dumps(doc)}


def variants(files: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """Every variant listed in the manifest of an assembled file set."""
    doc = manifest_format.parse(files[MANIFEST_NAME], where="assembled manifest")
    return [v for t in doc["targets"].values() for v in t.get("variants", [])]


def write_dir_atomic(dest: str | os.PathLike[str], files: Mapping[str, bytes]) -> Path:
    """Replace directory ``dest`` with exactly ``files`` (name -> bytes), atomically.

    Writes a temp directory beside ``dest``, then renames it into place; an older
    ``dest`` is moved aside first and removed after. On failure nothing of the
    new content is left and the old directory is restored.
    Returns the path of ``dest``.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    old = None
    try:
        for name, data in sorted(files.items()):
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.rmdir(old)
            os.replace(dest, old)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not dest.exists():
            os.replace(old, dest)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def checks_count(assumed: dict[str, Any], guards: dict[str, Any] | None = None) -> dict[str, int]:
    """How much Python state a call of the pair checks, from its ``assumed`` and
    ``guards`` metadata: ``{"guards": checks of the guards Dynamo built (absent where the
    capture used the recorder only), "attributes": recorded attribute reads, "hooks":
    module and global hook entries, "globals": module-level values}``."""
    hooks = assumed.get("hooks") or {}
    counts = {"guards": len(guards["checks"])} if guards else {}
    return {
        **counts,
        "attributes": sum(len(e[3]) for e in assumed.get("reads", ())),
        "hooks": len(hooks.get("modules", ())) + len(hooks.get("global", ())),
        "globals": len(assumed.get("globals", ())),
    }
