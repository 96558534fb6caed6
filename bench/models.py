"""The public-model matrix as a table: transformers and timm models, side by side.

    python bench/models.py [--cases bert_embed,resnet18_eval] [--out bench/results/models.md]

Builds tests/packages/modelzoo into a wheel with the real backend (one capture per
target; capture seconds and artifact bytes come from the wheel's manifest), installs
it, then measures per model, each mechanism in its own fresh process with empty
compiler caches:

  eager          first call (model built, inputs made: the same start for every row)
  compile        torch.compile (default mode), cold: its first call compiles
  load_packaged  precompile_runtime.load_packaged + first call, PRECOMPILE_NO_COMPILE=1

and, in each process after its first call, the steady-state latency (median of 30
calls after 5 warm-up calls, synchronized). ``max_abs_err`` is the largest
difference of load_packaged's result to eager's and to torch.compile's (the first
tensor of the result). The table for this host's device replaces that device's
section of --out; the other device's section is kept. Training steps (the *_train
cases) are timed like the others: each call runs forward, backward and the
gradient accumulation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ZOO = ROOT / "tests" / "packages" / "modelzoo"
MECHANISMS = ("eager", "compile", "load_packaged")


# ---- worker: a fresh process per (case, mechanism), prints one JSON line ---------------


def worker(mech: str, name: str, device: str, out_path: str) -> dict:
    import modelzoo
    import torch

    case = modelzoo.CASES[name]
    model, inputs = modelzoo.example(name, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    if mech == "eager":
        fn = case.fn
    elif mech == "compile":
        fn = torch.compile(case.fn)
    else:
        import precompile_runtime

        fn = precompile_runtime.load_packaged(name, package="modelzoo", strict=True)
    result = fn(model, *inputs)
    sync()
    first = time.perf_counter() - t0
    first_tensor = _first_tensor(result)
    torch.save(first_tensor.detach().cpu() if first_tensor is not None else None, out_path)
    for _ in range(5):
        fn(model, *inputs)
    times = []
    for _ in range(30):
        sync()
        t = time.perf_counter()
        fn(model, *inputs)
        sync()
        times.append(time.perf_counter() - t)
    return {"first_s": first, "steady_ms": statistics.median(times) * 1e3}


def _first_tensor(value):
    import torch

    if isinstance(value, torch.Tensor):
        return value
    if hasattr(value, "keys") and hasattr(value, "values"):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


# ---- driver ------------------------------------------------------------------------------


def _run_worker(mech, name, device, site, tmp) -> dict:
    out = tmp / f"{name}-{mech}.pt"
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "runtime"), str(ZOO)]),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor-{name}-{mech}"),
        TRITON_CACHE_DIR=str(tmp / f"triton-{name}-{mech}"),
        PRECOMPILE_CACHE_DIR=str(tmp / f"kernels-{name}"),
    )
    if mech == "load_packaged":
        env["PRECOMPILE_NO_COMPILE"] = "1"
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", mech, name, device, str(out)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        return {
            "error": proc.stderr.strip().splitlines()[-1]
            if proc.stderr.strip()
            else f"exit {proc.returncode}"
        }
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]), out=str(out))


def _build(tmp: Path, cases: list[str]) -> tuple[Path, dict]:
    project = tmp / "modelzoo"
    shutil.copytree(
        ZOO,
        project,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "_precompiled", "__pycache__"),
    )
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor-build"),
        PRECOMPILE_BUILD_CACHE_DIR=str(tmp / "capture-cache"),
        PRECOMPILE_TARGETS=",".join(cases),
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--wheel",
            "--outdir",
            str(tmp / "dist"),
            str(project),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    wheel = next((tmp / "dist").glob("modelzoo-*.whl"))
    site = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    manifest = json.loads((site / "modelzoo" / "_precompiled" / "manifest.json").read_text())
    return site, manifest


def _variant(manifest: dict, name: str) -> dict:
    return manifest["targets"][name]["variants"][0]


def _sizes(variant: dict) -> tuple[int, int]:
    return variant["files"]["source"]["size"], variant["files"]["cache"]["size"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--worker", nargs=4, metavar=("MECH", "CASE", "DEVICE", "OUT"), help=argparse.SUPPRESS
    )
    ap.add_argument("--cases", default=None, help="comma-separated cases (default: all)")
    ap.add_argument("--out", default=str(HERE / "results" / "models.md"))
    args = ap.parse_args()
    if args.worker:
        mech, name, device, out = args.worker
        print(json.dumps(worker(mech, name, device, out)))
        return

    import torch

    sys.path.insert(0, str(ZOO))
    import modelzoo

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = args.cases.split(",") if args.cases else list(modelzoo.CASES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-models-") as d:
        tmp = Path(d)
        t = time.perf_counter()
        site, manifest = _build(tmp, cases)
        print(f"built the wheel in {time.perf_counter() - t:.1f} s", flush=True)
        for name in cases:
            v = _variant(manifest, name)
            src, cache = _sizes(v)
            res = {m: _run_worker(m, name, device, site, tmp) for m in MECHANISMS}
            row = {
                "case": name,
                "capture_s": v.get("capture_seconds"),
                "source_bytes": src,
                "cache_bytes": cache,
                **{
                    f"{m}_{k}": res[m].get(k)
                    for m in MECHANISMS
                    for k in ("first_s", "steady_ms", "error")
                },
            }
            ref = {m: torch.load(res[m]["out"]) for m in MECHANISMS if "out" in res[m]}
            if "load_packaged" in ref and ref["load_packaged"] is not None:
                for other in ("eager", "compile"):
                    if other in ref:
                        row[f"err_vs_{other}"] = (
                            (ref["load_packaged"].float() - ref[other].float()).abs().max().item()
                        )
            rows.append(row)
            print(json.dumps(row), flush=True)
    _write(Path(args.out), device, torch.__version__, rows)


def _fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def _write(path: Path, device: str, torch_version: str, rows: list[dict]) -> None:
    import platform

    gpu = ""
    if device == "cuda":
        import torch

        gpu = f", {torch.cuda.get_device_name()}"
    lines = [
        f"## {device}",
        "",
        f"`python bench/models.py` on {platform.machine()}{gpu}, torch {torch_version}, "
        f"{time.strftime('%Y-%m-%d')}. First call: seconds from the model built to the first result "
        "(load included for load_packaged; compile included for torch.compile, cold caches); "
        "steady: median ms per call; ratios: load_packaged / the other.",
        "",
        "| model | capture s | source KiB | cache KiB | first call: eager / compile / load_packaged (s) "
        "| load_packaged first / eager first | steady ms: eager / compile / load_packaged "
        "| steady load_packaged / compile | max abs err vs eager / vs compile |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        errors = [f"{m}: {r[f'{m}_error']}" for m in MECHANISMS if r.get(f"{m}_error")]
        if errors:
            lines.append(
                f"| {r['case']} | " + " ; ".join(errors).replace("|", "/") + " | | | | | | | |"
            )
            continue
        ratio_first = r["load_packaged_first_s"] / r["eager_first_s"]
        ratio_steady = r["load_packaged_steady_ms"] / r["compile_steady_ms"]
        lines.append(
            f"| {r['case']} | {_fmt(r['capture_s'], '.1f')} | {r['source_bytes'] / 1024:.0f} | {r['cache_bytes'] / 1024:.0f} "
            f"| {r['eager_first_s']:.3f} / {r['compile_first_s']:.2f} / {r['load_packaged_first_s']:.3f} "
            f"| {ratio_first:.2f}x | {r['eager_steady_ms']:.3f} / {r['compile_steady_ms']:.3f} / "
            f"{r['load_packaged_steady_ms']:.3f} | {ratio_steady:.2f}x "
            f"| {_fmt(r.get('err_vs_eager'), '.2e')} / {_fmt(r.get('err_vs_compile'), '.2e')} |"
        )
    section = "\n".join(lines) + "\n"
    text = (
        path.read_text()
        if path.exists()
        else (
            "# The public-model matrix: capture, load, first call, steady state\n\n"
            "Made by `python bench/models.py` (one section per device; each run replaces its device's).\n\n"
        )
    )
    pattern = re.compile(rf"^## {device}\n.*?(?=^## |\Z)", re.S | re.M)
    text = (
        pattern.sub(lambda _: section + "\n", text)
        if pattern.search(text)
        else text.rstrip("\n") + "\n\n" + section
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
