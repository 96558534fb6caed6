"""Merge wheels of one distribution+version built on different hosts into one wheel
whose manifest lists every variant of every target."""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from precompile_runtime import manifest as manifest_format

from ..builder import arch_report
from ..errors import BuildError
from .rewrite import (
    PRECOMPILED,
    Entries,
    insert_requires,
    parse_name,
    patch_wheel_info,
    read_wheel,
    requires_project,
    wheel_name,
    write_wheel,
)


def _split(path: Path, entries: Entries) -> dict[str, Any]:
    """Classify a wheel's entries: precompiled package and files, WHEEL, METADATA."""
    manifests = [
        a for a in entries if a.endswith(f"/{PRECOMPILED}/manifest.json") and a.count("/") == 2
    ]
    if len(manifests) != 1:
        raise BuildError(
            f"Failed to merge {path.name}: expected one "
            f"<package>/{PRECOMPILED}/manifest.json, found {len(manifests)}"
        )
    prefix = manifests[0][: -len("manifest.json")]
    dist_info = next(a.split("/")[0] for a in entries if a.endswith(".dist-info/WHEEL"))
    doc = manifest_format.parse(entries[manifests[0]][0], where=f"{path.name}: {manifests[0]}")
    wheel_lines = entries[f"{dist_info}/WHEEL"][0].decode().splitlines()
    meta_text = entries[f"{dist_info}/METADATA"][0].decode()
    head, sep, body = meta_text.partition("\n\n")  # headers end at the first blank line
    stripped = head.rstrip("\n")
    sep, head = head[len(stripped) :] + sep, stripped  # (no body: the final newline is kept)
    meta_lines = head.split("\n")
    return {
        "prefix": prefix,
        "doc": doc,
        "files": {a[len(prefix) :]: d for a, (d, _) in entries.items() if a.startswith(prefix)},
        "tags": [ln[4:].strip() for ln in wheel_lines if ln.startswith("Tag:")],
        "wheel_rest": [ln for ln in wheel_lines if not ln.startswith(("Tag:", "Root-Is-Purelib:"))],
        "torch_pins": sorted(ln for ln in meta_lines if requires_project(ln, "torch")),
        "meta_rest": [ln for ln in meta_lines if not requires_project(ln, "torch")],
        "meta_body": sep + body,  # the description: copied, never searched for headers
        "dist_info": dist_info,
        "others": {
            a: e
            for a, e in entries.items()
            if not a.startswith(prefix) and a not in (f"{dist_info}/WHEEL", f"{dist_info}/METADATA")
        },
    }


def _check_same(first: dict[str, Any], other: dict[str, Any], name: str) -> None:
    diffs = []
    if set(first["others"]) != set(other["others"]):
        extra = sorted(set(first["others"]) ^ set(other["others"]))
        diffs.append("file lists differ (" + ", ".join(extra[:5]) + ")")
    else:
        diffs += [
            f"{a} differs"
            for a in sorted(first["others"])
            if first["others"][a][0] != other["others"][a][0]
        ]
    if first["wheel_rest"] != other["wheel_rest"]:
        diffs.append("WHEEL differs beyond its tags")
    if first["meta_rest"] != other["meta_rest"] or first["meta_body"] != other["meta_body"]:
        diffs.append("METADATA differs beyond the torch pin")
    if first["torch_pins"] != other["torch_pins"]:
        diffs.append(
            f"torch pins differ ({first['torch_pins']} vs {other['torch_pins']}); "
            "a wheel can carry one pin: capture with one torch, or use "
            '`torch-pin = "none"`'
        )
    if first["prefix"] != other["prefix"]:
        diffs.append(f"packages differ ({first['prefix']} vs {other['prefix']})")
    if diffs:
        raise BuildError(
            f"Failed to merge {name}: it differs from the first wheel in "
            "more than its artifacts: " + "; ".join(diffs[:10])
        )


def _shipped_bytecode(files: dict[str, bytes], source: str, renamed: str) -> dict[str, bytes]:
    """The pycs a build shipped for the source half ``source`` (``NAME.<cache tag>.pyc``,
    wheels/bytecode.py), named for it as ``renamed``: each serves only the source's bytes."""
    stem, new_stem = source[:-3], renamed[:-3]
    return {
        f"{new_stem}.{n[len(stem) + 1 :]}": d
        for n, d in files.items()
        if n.startswith(stem + ".") and n.endswith(".pyc") and n.count(".") == stem.count(".") + 2
    }


def _merge_manifests(
    parts: Sequence[dict[str, Any]], names: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One manifest with all variants; colliding file names get ``.<variant id>``; each
    source half keeps the bytecode its build shipped beside it."""
    doc = copy.deepcopy(parts[0]["doc"])
    for t in doc["targets"].values():
        t["variants"] = []
    files: dict[str, bytes] = {}
    for part, wname in zip(parts, names):
        for tname, target in part["doc"]["targets"].items():
            merged = doc["targets"].setdefault(
                tname,
                {
                    "required": target.get("required", True),
                    "status": "failed",
                    "reason": target.get("reason"),
                    "variants": [],
                },
            )
            for v in target.get("variants", []):
                if any(o["id"] == v["id"] for o in merged["variants"]):
                    raise BuildError(
                        f"Failed to merge {wname}: target {tname!r} variant "
                        f"{v['id']} (same host fingerprint) is in two wheels"
                    )
                v = copy.deepcopy(v)
                for role, ext in (("source", "py"), ("cache", "cache")):
                    entry = v["files"][role]
                    data = part["files"][entry["path"]]
                    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
                        raise BuildError(
                            f"Failed to merge {wname}: {entry['path']} does "
                            "not match its manifest sha256"
                        )
                    path = entry["path"]
                    if path in files and files[path] != data:
                        path = f"{tname}.{v['id']}.{ext}"
                    files[path] = data
                    if role == "source":
                        files.update(_shipped_bytecode(part["files"], entry["path"], path))
                        for tag, pyc in (
                            v.get("bytecode") or {}
                        ).items():  # named for the renamed source
                            pyc["path"] = f"{path[:-3]}.{tag}.pyc"
                    entry["path"] = path
                merged["variants"].append(v)
                merged["status"], merged["reason"] = "ok", None
    for t in doc["targets"].values():
        if t["status"] == "failed" and not t.get("reason"):
            t["reason"] = "failed on every host"
    arch_report.mark_native_builds(
        doc
    )  # a native build of an architecture wins over a cross-compiled one
    files["manifest.json"] = manifest_format.dumps(doc)
    return doc, files


def merge_wheels(wheels: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str]) -> Path:
    """Combine ``wheels`` into one wheel in ``out_dir``.

    Args:
        wheels: two or more wheels of the same distribution and version.
        out_dir: output directory (the wheel is written atomically).
    Returns:
        the merged wheel's path. Tags: ``py3-none-any`` when every input has it,
        else decided from every variant's kernels
        (:func:`precompile_build.wheels.platform_tags.wheel_tags`).
    Raises:
        BuildError: different name/version, a difference outside ``_precompiled/``,
            the WHEEL tags and the torch pin, a variant present twice, a bad manifest.
    """
    paths = [Path(w) for w in wheels]
    if len(paths) < 2:
        raise BuildError("Failed to merge: give at least two wheels")
    parsed = [parse_name(p) for p in paths]
    key0 = (canonicalize_name(str(parsed[0]["name"])), parsed[0]["ver"])
    for p, pn in zip(paths[1:], parsed[1:]):
        if (canonicalize_name(str(pn["name"])), pn["ver"]) != key0:
            raise BuildError(
                f"Failed to merge {p.name}: it is {pn['name']} {pn['ver']}, "
                f"not {parsed[0]['name']} {parsed[0]['ver']}"
            )
    try:
        parts = [_split(p, read_wheel(p)) for p in paths]
    except manifest_format.ManifestError as e:
        raise BuildError(f"Failed to merge: {e}") from None
    for p, part in zip(paths[1:], parts[1:]):
        _check_same(parts[0], part, p.name)
    _, files = _merge_manifests(parts, [p.name for p in paths])
    tags = sorted({t for part in parts for t in part["tags"]})
    first = parts[0]
    entries: Entries = dict(first["others"])
    entries.update({first["prefix"] + n: (d, 0o644) for n, d in files.items()})
    if any(not t.endswith("-none-any") for t in tags):
        # decided again from every variant's kernels: the union of the inputs' tags
        # would claim the oldest glibc any input allows for kernels that need newer
        from .platform_tags import wheel_tags

        native = next(t for t in tags if not t.endswith("-none-any"))
        tags = wheel_tags(
            {a: d for a, (d, _) in entries.items()}, interpreter_abi=native.rsplit("-", 1)[0]
        )
    di = first["dist_info"]
    wheel_text = "\n".join(first["wheel_rest"] + ["Root-Is-Purelib: true"]) + "\n"
    entries[f"{di}/WHEEL"] = (patch_wheel_info(wheel_text, tags).encode(), 0o644)
    meta = insert_requires(first["meta_rest"], first["torch_pins"])
    entries[f"{di}/METADATA"] = (("\n".join(meta) + first["meta_body"]).encode(), 0o644)
    return write_wheel(out_dir, wheel_name(parsed[0], tags), entries)
