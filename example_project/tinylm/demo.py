"""``python -m tinylm.demo``: run every precompiled target shipped with this install
on real inputs and compare it with eager.

For each target tinylm knows (:data:`CHECKS`):

- the host cannot run it (a CUDA-only target, or only CUDA variants, and no CUDA
  here): one ``skip`` line with the reason;
- the host could run it but the manifest lacks it (absent, left out as a failed
  optional capture, or without variants): ``MISSING``, exit 1;
- otherwise: ``precompile_runtime.load_packaged(name)`` (timed), run on
  :func:`tinylm.example_batch` with a fresh ``build_model(seed=0)``, compared with the
  same function run eagerly on a second fresh model. One line: name, engine (from the
  manifest variant this host uses), max abs error, load seconds, ``ok``/``MISMATCH``.

Exit status: 0 when every runnable target matches eager, 1 on any mismatch, load
error or missing target, 2 when the package carries no manifest at all.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from . import steps
from .data import example_batch
from .model import build_model

PACKAGE = "tinylm"

# (atol, rtol) per device; fp32 throughout.
TOLERANCE = {"cpu": (1e-4, 1e-4), "cuda": (1e-3, 1e-3)}

Compared = list[tuple[str, torch.Tensor, torch.Tensor]]  # (label, artifact, eager)


def _check_forward(fn: Callable, device: str) -> Compared:
    ids, _ = example_batch(device)
    got = fn(build_model(0, device=device), ids)
    want = steps.forward(build_model(0, device=device), ids)
    return [("logits", got, want)]


def _check_train_step(fn: Callable, device: str) -> Compared:
    """Two steps on each side, so gradients must *accumulate* like eager."""
    ids, targets = example_batch(device)
    m_art, m_ref = build_model(0, device=device), build_model(0, device=device)
    out: Compared = []
    for i in range(2):
        out.append((f"loss[{i}]", fn(m_art, ids, targets), steps.train_step(m_ref, ids, targets)))
    for (name, p_art), (_, p_ref) in zip(m_art.named_parameters(), m_ref.named_parameters()):
        if p_art.grad is None:
            raise AssertionError(f"{name}.grad is None after the artifact's train_step")
        out.append((f"{name}.grad", p_art.grad, p_ref.grad))
    return out


def _check_triton_rmsnorm(fn: Callable, device: str) -> Compared:
    ids, _ = example_batch(device)
    model = build_model(0, device=device)
    return [("rmsnorm", fn(model, ids), steps.triton_rmsnorm_reference(model, ids))]


@dataclass(frozen=True)
class Check:
    cuda_only: bool
    run: Callable[[Callable, str], Compared]


CHECKS: dict[str, Check] = {
    "forward": Check(cuda_only=False, run=_check_forward),
    "train_step": Check(cuda_only=False, run=_check_train_step),
    "triton_rmsnorm": Check(cuda_only=True, run=_check_triton_rmsnorm),
}


def read_manifest(package: str = PACKAGE) -> dict[str, Any] | None:
    """The parsed ``<package>/_precompiled/manifest.json``, or None when absent."""
    from importlib.resources import files

    res = files(package).joinpath("_precompiled").joinpath("manifest.json")
    if not res.is_file():
        return None
    from precompile_runtime import manifest

    return manifest.parse(res.read_bytes(), where=f"{package}/_precompiled/manifest.json")


def _mismatches(variant: dict[str, Any]) -> list[str]:
    """Why ``variant`` does not match this host (empty: it matches)."""
    from precompile_runtime import fingerprint

    host = fingerprint.host_fingerprint(variant["device"])
    return fingerprint.mismatches(variant["fingerprint"], host)


def choose_variant(variants: list[dict[str, Any]], cuda: bool) -> tuple[dict[str, Any] | None, str]:
    """The variant this host will use, and a note.

    Returns ``(variant, "")`` for a variant matching this host, ``(variant,
    "fallback: ...")`` when the device can run here but no fingerprint matches
    (load_packaged then warns and falls back), ``(None, reason)`` when none can run.
    """
    runnable = [
        v for v in variants if v.get("device") == "cpu" or (cuda and v.get("device") == "cuda")
    ]
    if not runnable:
        devices = sorted({str(v.get("device")) for v in variants})
        return None, f"built for {', '.join(devices)} only and this host has no CUDA"
    for v in runnable:
        if not _mismatches(v):
            return v, ""
    return runnable[0], "fallback: " + "; ".join(_mismatches(runnable[0]))


def _compare(pairs: Compared, device: str) -> tuple[float, list[str]]:
    """Max abs error over all pairs, and a line per pair outside tolerance."""
    atol, rtol = TOLERANCE["cuda" if device.startswith("cuda") else "cpu"]
    worst, bad = 0.0, []
    for label, got, want in pairs:
        if not isinstance(got, torch.Tensor):
            bad.append(f"{label}: artifact returned {type(got).__name__}, expected a tensor")
            continue
        if got.shape != want.shape or got.dtype != want.dtype:
            bad.append(
                f"{label}: artifact gave {tuple(got.shape)} {got.dtype}, "
                f"eager {tuple(want.shape)} {want.dtype}"
            )
            continue
        got, want = got.detach().float().cpu(), want.detach().float().cpu()
        err = (got - want).abs().max().item() if got.numel() else 0.0
        worst = max(worst, err)
        if not torch.allclose(got, want, atol=atol, rtol=rtol):
            bad.append(f"{label}: max abs error {err:.3e} > atol={atol:g}, rtol={rtol:g}")
    return worst, bad


def run_demo(
    manifest: dict[str, Any],
    load: Callable[[str], Callable],
    *,
    cuda: bool | None = None,
    out: Callable[[str], None] = print,
) -> int:
    """Run every known target the host can run; 0 when all match eager, else 1."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    targets = manifest.get("targets", {})
    failed = ran = matched = 0
    for name, check in CHECKS.items():
        entry = targets.get(name)
        if check.cuda_only and not cuda:
            out(f"{name:<16} skip: needs CUDA, this host has none")
            continue
        if entry is None or entry.get("status", "ok") != "ok" or not entry.get("variants"):
            why = (
                "not in the manifest"
                if entry is None
                else (
                    f"left out at build time ({entry.get('reason') or 'no variants'})"
                    if entry.get("status", "ok") != "ok"
                    else "has no variants"
                )
            )
            out(f"{name:<16} MISSING: this host can run it but it is {why}")
            failed += 1
            continue
        variant, note = choose_variant(entry["variants"], cuda)
        if variant is None:
            out(f"{name:<16} skip: {note}")
            continue
        device = "cuda" if variant["device"] == "cuda" else "cpu"
        engine = variant["engine"] + (" (fallback)" if note else "")
        try:
            t0 = time.perf_counter()
            fn = load(name)
            load_s = time.perf_counter() - t0
            err, bad = _compare(check.run(fn, device), device)
        except Exception as e:  # noqa: BLE001 - one broken target must not hide the others
            out(f"{name:<16} engine={engine:<8} ERROR {type(e).__name__}: {e}")
            failed += 1
            continue
        ran += 1
        status = "ok" if not bad else "MISMATCH"
        out(
            f"{name:<16} engine={engine:<8} device={device:<4} max_abs_err={err:.2e} "
            f"load={load_s:.3f}s {status}"
        )
        for line in ([note] if note else []) + bad:
            out(f"    {line}")
        failed += bool(bad)
        matched += not bad
    for name in sorted(set(targets) - set(CHECKS)):
        out(f"{name:<16} skip: tinylm.demo has no eager check for this target")
    out(
        f"tinylm.demo: {matched} of {ran} loaded targets match eager"
        + (f"; {failed} failed" if failed else "")
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tinylm.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse fallbacks: load_packaged(strict=True) (also PRECOMPILE_STRICT=1)",
    )
    args = parser.parse_args(argv)
    try:
        from precompile_runtime import load_packaged
    except ImportError as e:
        print(f"tinylm.demo: precompile-runtime is not installed ({e})", file=sys.stderr)
        return 2
    manifest = read_manifest()
    if manifest is None:
        print(
            f"tinylm.demo: {PACKAGE}/_precompiled/manifest.json not found: this tinylm "
            "was not built with precompile_build.backend (or captures were skipped)",
            file=sys.stderr,
        )
        return 2
    strict = True if args.strict else None
    return run_demo(manifest, lambda name: load_packaged(name, package=PACKAGE, strict=strict))


if __name__ == "__main__":
    sys.exit(main())
