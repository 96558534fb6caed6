"""Describe the precompiled artifacts of a wheel, a directory or an installed package,
and whether each variant matches this host."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable, Optional

from precompile_runtime import fingerprint as fpmod
from precompile_runtime import manifest as manifest_format

from ..builder import arch_report
from ..errors import BuildError
from .rewrite import PRECOMPILED, read_wheel


def _find_manifest(where: str) -> tuple[str, bytes]:
    path = Path(where)
    if path.is_file() and path.suffix == ".whl":
        entries = read_wheel(path)
        hits = sorted(a for a in entries if a.endswith(f"{PRECOMPILED}/manifest.json"))
        if not hits:
            raise BuildError(
                f"Failed to inspect {where}: the wheel has no <package>/{PRECOMPILED}/manifest.json"
            )
        return f"{path.name}:{hits[0]}", entries[hits[0]][0]
    if path.is_dir():
        for cand in (path / "manifest.json", path / PRECOMPILED / "manifest.json"):
            if cand.is_file():
                return str(cand), cand.read_bytes()
        raise BuildError(
            f"Failed to inspect {where}: no manifest.json or {PRECOMPILED}/manifest.json in it"
        )
    if not path.exists() and where.isidentifier():
        spec = importlib.util.find_spec(where)
        locs = list(spec.submodule_search_locations or []) if spec else []
        for loc in locs:
            cand = Path(loc) / PRECOMPILED / "manifest.json"
            if cand.is_file():
                return str(cand), cand.read_bytes()
        raise BuildError(
            f"Failed to inspect {where}: no installed package with {PRECOMPILED}/manifest.json"
        )
    if not path.exists():
        raise BuildError(
            f"Failed to inspect {where}: no such file or directory (and no "
            "installed package of that name)"
        )
    raise BuildError(
        f"Failed to inspect {where}: not a wheel (.whl), a directory or an installed package"
    )


def _host(device_type: str, cache: dict[str, Optional[dict[str, Any]]]) -> Optional[dict[str, Any]]:
    if device_type not in cache:
        try:
            cache[device_type] = fpmod.host_fingerprint(device_type)
        except Exception:  # noqa: BLE001 - no torch here: nothing can match
            cache[device_type] = None
    return cache[device_type]


def inspect_report(
    where: str, host: Optional[Callable[[str], Optional[dict[str, Any]]]] = None
) -> dict[str, Any]:
    """A JSON-ready description of the artifacts at ``where``.

    Args:
        where: a ``.whl``, a directory holding ``manifest.json`` (or
            ``_precompiled/manifest.json``), or an importable package name.
        host: device type -> this host's fingerprint (default: ``host_fingerprint``).
    Returns:
        ``{"source", "package", "targets": {name: {"status", "required", "reason",
        "variants": [{"id", "engine", "device", "fingerprint", "code_hash",
        "files", "fallback" (None, or {"from", "reason"}), "validation", "tracer",
        "checks", "distributed", "capture_seconds", "capture_breakdown", "peak_memory", "compiled_for",
        "tuned_on", "validated_on", "left_out", "replaced", "size", "matches_host",
        "mismatches"}]}}}``
        (``validation``: the capture's numbers, None for pairs without kernels;
        ``tracer``: what traced the call and ``checks``: ``{"attributes", "hooks",
        "globals"}`` counts of the Python state each call checks, None for torch pairs;
        ``distributed``: a `world-size` target's ranks (builder/ranks.py ``record``),
        None for others;
        ``capture_seconds``, ``capture_breakdown`` (seconds per step) and ``peak_memory``
        (bytes: ``host_bytes``, ``gpu_bytes``, ``eager_gpu_bytes``): None in reproducible
        builds; ``compiled_for`` ... ``replaced``: CUDA variants, None where not recorded).
    Raises:
        BuildError / ManifestError: nothing to inspect, or an invalid manifest.
    """
    source, data = _find_manifest(where)
    doc = manifest_format.parse(data, where=source)
    cache: dict[str, Optional[dict[str, Any]]] = {}
    host = host or (lambda d: _host(d, cache))
    targets = {}
    for name, t in doc["targets"].items():
        out = []
        for v in t.get("variants", []):
            dev = v["fingerprint"].get("device_type") or v.get("device") or "cpu"
            here = host(dev)
            mism = (
                fpmod.mismatches(v["fingerprint"], here)
                if here is not None
                else ["torch: not importable on this host"]
            )
            out.append(
                {
                    **{
                        k: v.get(k)
                        for k in (
                            "id",
                            "engine",
                            "device",
                            "fingerprint",
                            "code_hash",
                            "files",
                            "fallback",
                            "validation",
                            "tracer",
                            "checks",
                            "distributed",
                            "capture_seconds",
                            "capture_breakdown",
                            "peak_memory",
                            *arch_report.FIELDS,
                        )
                    },
                    "size": sum(f["size"] for f in v["files"].values()),
                    "matches_host": not mism,
                    "mismatches": mism,
                }
            )
        targets[name] = {
            "status": t.get("status", "ok"),
            "required": t.get("required"),
            "reason": t.get("reason"),
            "variants": out,
        }
    return {"source": source, "package": doc.get("package"), "targets": targets}


def format_report(report: dict[str, Any]) -> str:
    """Human-readable text of :func:`inspect_report`'s result."""
    lines = [f"{report['source']} (package {report['package']})"]
    for name, t in report["targets"].items():
        req = "required" if t["required"] else "optional"
        if t["status"] != "ok":  # an optional target is left out on purpose (the build warned)
            what = "FAILED at build" if t["required"] else "left out of the wheel at build"
            lines.append(f"target {name} ({req}): {what}: {t['reason']}")
            continue
        lines.append(f"target {name} ({req}): {len(t['variants'])} variant(s)")
        for v in t["variants"]:
            sizes = ", ".join(f"{f['path']} {f['size']} B" for f in v["files"].values())
            lines.append(
                f"  variant {v['id']}: {v['engine']} on {fpmod.describe(v['fingerprint'])}"
            )
            if v.get("fallback"):
                lines.append(
                    f"    fallback from {v['fallback'].get('from')}: {v['fallback'].get('reason')}"
                )
            lines.append(f"    files: {sizes}")
            if v.get("tracer") or v.get("checks"):
                c = v.get("checks") or {}
                order = ["guards", "attributes", "hooks", "globals"]
                checked = (
                    ", ".join(
                        f"{c[k]} {k[:-1] if c[k] == 1 and k.endswith('s') else k}"
                        for k in sorted(
                            c,
                            key=lambda k: (k not in order, order.index(k) if k in order else 0, k),
                        )
                        if c[k]
                    )
                    or "no Python state"
                )
                how = (
                    "" if "guards" in c or not c else " (recorder only: options guards='recorded')"
                )
                lines.append(
                    f"    traced with {v.get('tracer') or '?'}; each call checks {checked} "
                    f"the trace assumed{how}"
                )
            if v.get("capture_seconds") is not None or v.get("peak_memory"):
                from ..builder.progress import human_size
                from ..process.stats import describe, describe_breakdown

                took = f"{v['capture_seconds']:g} s" if v.get("capture_seconds") is not None else ""
                steps = describe_breakdown(v.get("capture_breakdown"))
                memory = describe(v.get("peak_memory"), human_size)
                lines.append(
                    "    capture: "
                    + "; ".join(x for x in (took + (f" ({steps})" if steps else ""), memory) if x)
                )
            if v.get("distributed"):
                from ..builder.ranks import describe as describe_world

                lines.append(f"    tensor-parallel: {describe_world(v['distributed'])}")
            lines += _validation_lines(v.get("validation"))
            lines += arch_report.inspect_lines(v)
            if v["matches_host"]:
                lines.append("    this host: matches")
            else:
                lines.append("    this host: does not match")
                lines += [f"      - {m}" for m in v["mismatches"]]
    return "\n".join(lines)


def _validation_lines(val: Optional[dict[str, Any]]) -> list[str]:
    """The capture's validation numbers (frozen engine), one line per case checked."""
    if not val:
        return []
    if val.get("skipped"):
        return [f"    not validated: {val['skipped']}"]
    ref = val.get("reference", "?")
    if val.get("fallback_ops"):
        ref += f" (except {', '.join(val['fallback_ops'])})"
    lines = [
        f"    validated against a {ref} reference of the traced graph:"
        if "checked" not in val
        else f"    validated: {val['checked']}"
    ]
    if val.get("spilled_to_cpu"):
        lines.append("      (the reference ran partly on the CPU: the GPU could not hold it)")
    for case in val.get("cases", []):
        w = case.get("worst")
        if not w:
            lines.append(f"      {case.get('case')}: no floating values")
            continue
        if "multiple" not in w:  # no reference: the elementwise check's numbers
            lines.append(
                f"      {case.get('case')}: worst {w['value']}: max |frozen - graph| {w['max_abs_diff']:.3g}"
            )
            continue
        allowed = w["multiple"] * w["eager_error"] + w["floor"]
        lines.append(
            f"      {case.get('case')}: worst {w['value']}: frozen error {w['frozen_error']:.3g}, "
            f"eager {w['eager_error']:.3g}, allowed {w['multiple']:g} x eager + "
            f"{w['floor']:.3g} = {allowed:.3g}"
            + (
                " (within 1e-4 of eager elementwise)"
                if w.get("accepted_by") == "elementwise"
                else ""
            )
        )
    eager = val.get("eager_call")
    if eager:
        text = f"      vs the eager call: {eager.get('outcome')}"
        if "difference" in eager:
            text += f" (difference {eager['difference']}, allowed {eager['allowed']}, {eager.get('value')})"
        lines.append(text)
    return lines
