"""What a CUDA variant records about its GPU architectures, for the manifest, the
build line and `inspect` (`cuda-archs`, engines/cross_arch.py). Imports no torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

FIELDS = ("compiled_for", "tuned_on", "validated_on", "left_out", "replaced", "native_elsewhere")


def variant_fields(
    fingerprint: Mapping[str, Any], meta: Optional[Mapping[str, Any]], engine: str
) -> dict[str, Any]:
    """The manifest fields of a frozen CUDA variant: ``compiled_for`` (compute
    capabilities it has kernels for), ``tuned_on`` (the GPU whose autotuning chose the
    configs), ``validated_on`` (the GPUs its kernels ran on at capture: the build GPU
    only), and, when `cuda-archs` had any, ``left_out`` ({arch: reason}) and
    ``replaced`` ({arch: {kernel: reason}}). ``{}`` for a CPU variant and for the
    other engines (no frozen kernels of ours to describe)."""
    if fingerprint.get("device_type") != "cuda" or engine != "frozen":
        return {}
    report = (meta or {}).get("cuda_archs")
    cc = fingerprint.get("compute_capability")
    if not isinstance(report, Mapping):  # built for the build GPU only
        return {"compiled_for": [cc], "tuned_on": cc, "validated_on": [cc]}
    out = {k: report.get(k) for k in ("compiled_for", "tuned_on", "validated_on")}
    for k in ("left_out", "replaced"):
        if report.get(k):
            out[k] = dict(report[k])
    return out


def build_line(meta: Optional[Mapping[str, Any]]) -> str:
    """The build summary's words for a pair's `cuda-archs` report (``""`` without one),
    e.g. ``"; compiled for sm 8.0 9.0 12.0 (tuned and validated on 9.0; left out
    8.6: kernel k: ...)"``."""
    rep = (meta or {}).get("cuda_archs")
    if not isinstance(rep, Mapping):
        return ""
    extra = [f"tuned and validated on {rep.get('tuned_on')}"]
    extra += [f"left out {a}: {why}" for a, why in sorted((rep.get("left_out") or {}).items())]
    extra += [
        f"config replaced for {a}: {', '.join(sorted(ks))}"
        for a, ks in sorted((rep.get("replaced") or {}).items())
    ]
    return f"; compiled for sm {' '.join(rep.get('compiled_for') or [])} ({'; '.join(extra)})"


def inspect_lines(variant: Mapping[str, Any]) -> list[str]:
    """`inspect`'s lines for a variant's architecture fields (none for CPU variants)."""
    if not variant.get("compiled_for"):
        return []
    lines = [
        f"    compiled for sm {' '.join(map(str, variant['compiled_for']))}; tuned on "
        f"{variant.get('tuned_on')}; validated (run) on {' '.join(map(str, variant.get('validated_on') or []))}"
    ]
    binaries = (variant.get("fingerprint") or {}).get("cuda_binaries")
    if binaries:
        lines.append(f"    binaries: {binaries}")
    lines += [
        f"    left out {a}: {why}" for a, why in sorted((variant.get("left_out") or {}).items())
    ]
    for a, ks in sorted((variant.get("replaced") or {}).items()):
        lines += [
            f"    config replaced for {a}, kernel {k}: {why}" for k, why in sorted(ks.items())
        ]
    lines += [
        f"    {a}: variant {vid} was built natively on it and is preferred there"
        for a, vid in sorted((variant.get("native_elsewhere") or {}).items())
    ]
    return lines


_SAME_HOST = ("torch", "cuda", "triton", "python", "platform", "device_type")


def mark_native_builds(doc: dict[str, Any]) -> None:
    """For `merge`: in each variant that was cross-compiled for an architecture
    another variant was built natively on (same torch, CUDA, Triton, Python and
    platform), record ``native_elsewhere: {arch: that variant's id}``. The runtime
    prefers the native variant on such a GPU (precompile_runtime.arch_select.rank);
    this says so in the manifest and in `inspect`. Changes ``doc`` in place."""
    for target in doc.get("targets", {}).values():
        variants = target.get("variants") or []
        for v in variants:
            v.pop("native_elsewhere", None)
            fp = v.get("fingerprint") or {}
            native = {}
            for arch in v.get("compiled_for") or []:
                if arch == v.get("tuned_on"):
                    continue
                for o in variants:
                    ofp = o.get("fingerprint") or {}
                    if (
                        o is not v
                        and o.get("tuned_on") == arch
                        and all(ofp.get(k) == fp.get(k) for k in _SAME_HOST)
                    ):
                        native[arch] = o["id"]
                        break
            if native:
                v["native_elsewhere"] = native
