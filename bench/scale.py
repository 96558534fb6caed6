"""How the frozen engine scales with depth: GPT-style stacks of 2, 8 and 24 layers.

    python bench/scale.py --device cuda                      # d=2048, bf16, 4 x 256 tokens
    python bench/scale.py --device cpu                       # small analogues (d=64, 2 x 32)
    python bench/scale.py --device cuda --repeat-builds 10 --layers 24

Table mode, per layer count, each step in a fresh process with empty Inductor,
Triton and precompile-runtime caches:

  capture      ``precompile_build.capture(..., engine="frozen")`` of the forward pass
               (what a build's capture script runs): seconds, source and cache bytes,
               and the validation numbers the pair records (the worst value's frozen
               and eager error against the fp64 reference, the multiple allowed, the
               eager-call comparison's outcome)
  load         ``load_packaged`` from a package directory holding the pair and its
               manifest: load seconds, first call, time to first result, max |loaded -
               eager| on the same inputs
  eager        time to the first eager result
  compile      time to the first ``torch.compile`` result, cold (empty caches)

"first result" is measured from "model and inputs exist" to the first result
(synchronized). The source half's growth per layer (bytes/layer between the smallest
and the largest stack) and Python's compile() time of the source are reported, with
an extrapolation to 80 layers. Writes scale_<device>.md and .json under --out.

``--llama --sizes 0.5b,1b,3b,8b`` (CUDA): transformers Llama-shaped bf16 models at real
size instead, with the capture's GPU peak against its eager call's; see scale_llama.py.

``--repeat-builds N``: N captures of each ``--layers`` stack in a row, each in a fresh
process with empty caches (as N clean builds run them), spread over the visible GPUs
(one capture per GPU at a time); one line per build, exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(ROOT), str(ROOT / "runtime")]  # this checkout's precompile_build/runtime
PACKAGE = "scalebench"

CONFIGS = {  # the stacks on the GPU host; small analogues on CPU
    "cuda": dict(layers=[2, 8, 24], d=2048, heads=16, batch=4, seq=256, dtype="bfloat16"),
    "cpu": dict(layers=[2, 4, 8], d=64, heads=4, batch=2, seq=32, dtype="bfloat16"),
}


# ---- the model (also imported by the workers) ---------------------------------------


def build(layers: int, d: int, heads: int, batch: int, seq: int, dtype: str, device: str):
    """(model, x): a pre-norm GPT-style stack (causal attention + 4d MLP), eval, on
    ``device`` in ``dtype``, weights seeded; x: (batch, seq, d) hidden states."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(nn.functional.gelu(self.fc(self.ln2(x))))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return self.ln_f(x)

    torch.manual_seed(0)
    with torch.device(device):  # initialised on the device: seconds, not minutes, at 1.2B
        model = Stack().to(getattr(torch, dtype)).eval()
        x = torch.randn(batch, seq, d, dtype=getattr(torch, dtype))
    return model, x


def forward(model, x):
    return model(x)


# ---- workers: each runs in a fresh process and prints one JSON line ------------------


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def worker(mode: str, cfg: dict, layers: int, device: str, work: Path) -> dict:
    t0 = time.perf_counter()
    import torch

    model, x = build(layers, cfg["d"], cfg["heads"], cfg["batch"], cfg["seq"], cfg["dtype"], device)
    _sync(device)
    ready = time.perf_counter()
    out: dict = {"mode": mode, "layers": layers, "import_and_setup_s": ready - t0}
    name = f"L{layers}"
    if mode == "capture":
        import precompile_build
        from precompile_build.builder.pairs import read_source_metadata

        with (
            torch.no_grad(),
            precompile_build.capture(
                forward,
                engine="frozen",
                target=name,
                artifact_path=work / f"{name}.py",
                cache_path=work / f"{name}.cache",
            ) as f,
        ):
            f(model, x)
        _sync(device)
        out["capture_s"] = time.perf_counter() - ready
        src = (work / f"{name}.py").read_bytes()
        out["source_bytes"], out["cache_bytes"] = len(src), (work / f"{name}.cache").stat().st_size
        c0 = time.perf_counter()
        compile(src, f"{name}.py", "exec")
        out["source_compile_s"] = time.perf_counter() - c0
        out["validation"] = read_source_metadata(src, what=name).get("validation")
        return out
    with torch.no_grad():
        if mode == "eager":
            y = forward(model, x)
        elif mode == "compile":
            y = torch.compile(forward)(model, x)
        elif mode == "load":
            import precompile_runtime

            fn = precompile_runtime.load_packaged(name, package=PACKAGE, strict=True)
            _sync(device)
            out["load_s"] = time.perf_counter() - ready
            c0 = time.perf_counter()
            y = fn(model, x)
            _sync(device)
            out["first_call_s"] = time.perf_counter() - c0
        else:
            raise SystemExit(f"unknown mode {mode}")
        _sync(device)
        out["first_result_s"] = time.perf_counter() - ready
        if mode == "load":
            want = forward(model, x)
            out["max_abs_vs_eager"] = float((y.float() - want.float()).abs().max())
            out["max_abs_value"] = float(want.float().abs().max())
    return out


# ---- driver -----------------------------------------------------------------------------


def _env(work: Path, gpu: str | None = None) -> dict:
    env = dict(os.environ)
    caches = Path(tempfile.mkdtemp(prefix="caches-", dir=work))  # empty caches per process
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
        TRITON_CACHE_DIR=str(caches / "triton"),
        PRECOMPILE_CACHE_DIR=str(caches / "kernels"),
        PYTHONPATH=os.pathsep.join(
            p
            for p in (
                str(work / "site"),
                str(ROOT),
                str(ROOT / "runtime"),
                env.get("PYTHONPATH", ""),
            )
            if p
        ),
    )
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    return env


def run_worker(
    mode: str, cfg: dict, layers: int, device: str, work: Path, gpu: str | None = None
) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        "--device",
        device,
        "--config",
        json.dumps(cfg),
        "--layers",
        str(layers),
        "--work",
        str(work),
    ]
    p = subprocess.run(cmd, env=_env(work, gpu), capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "layers": layers, "error": (p.stderr or p.stdout)[-1500:]}
    return json.loads(lines[-1][len("RESULT ") :])


def _package(work: Path, names: list[str]) -> None:
    """work/site/scalebench/_precompiled/: the pairs and their manifest, as a wheel has them."""
    from precompile_build.builder.pairs import inspect_pair
    from precompile_build.builder.runner import CaptureResult
    from precompile_build.wheels.manifest import assemble, write_dir_atomic

    results = []
    for n in names:
        src, cache = work / f"{n}.py", work / f"{n}.cache"
        info = inspect_pair(src, cache)
        results.append(
            CaptureResult(n, "ok", True, info.device, source_path=src, cache_path=cache, info=info)
        )
    pkg = work / "site" / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    write_dir_atomic(pkg / "_precompiled", assemble(PACKAGE, results))


def _worst(val: dict | None) -> str:
    if not val or not val.get("cases"):
        return "-"
    w = val["cases"][0]["worst"]
    return f"{w['frozen_error']:.3g} / {w['eager_error']:.3g} / {w['multiple']:g}"


def table(device: str, cfg: dict, work: Path, out_dir: Path) -> None:
    rows = []
    for n in cfg["layers"]:
        cap = run_worker("capture", cfg, n, device, work)
        print(f"L{n} capture: {json.dumps(cap)[:300]}", flush=True)
        rows.append({"layers": n, "capture": cap})
    ok = [r["layers"] for r in rows if "error" not in r["capture"]]
    _package(work, [f"L{n}" for n in ok])
    for r in rows:
        n = r["layers"]
        for mode in ("load", "eager", "compile") if n in ok else ("eager", "compile"):
            r[mode] = run_worker(mode, cfg, n, device, work)
            print(f"L{n} {mode}: {json.dumps(r[mode])[:300]}", flush=True)
    _write(device, cfg, rows, out_dir)


def _fmt(v, unit=""):
    return "-" if v is None else (f"{v:.2f}{unit}" if isinstance(v, float) else f"{v}{unit}")


def _write(device: str, cfg: dict, rows: list, out_dir: Path) -> None:
    import platform

    import torch

    out_dir.mkdir(parents=True, exist_ok=True)
    doc = {
        "device": device,
        "config": cfg,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
        "rows": rows,
    }
    (out_dir / f"scale_{device}.json").write_text(json.dumps(doc, indent=2) + "\n")
    caps = [r for r in rows if "error" not in r["capture"]]
    lines = [
        f"# Scale: frozen engine, GPT-style stacks ({device})",
        "",
        f"Produced by `python bench/scale.py --device {device}` (torch {torch.__version__}, "
        f"{doc['gpu'] or platform.processor() or 'cpu'}): d={cfg['d']}, {cfg['heads']} heads, "
        f"{cfg['dtype']}, {cfg['batch']} x {cfg['seq']} tokens. Each figure is one fresh process with "
        'empty Inductor/Triton/precompile-runtime caches. First result: seconds from "model and '
        'inputs exist" to the first synchronized result.',
        "",
        "| layers | capture s | source | cache | load s | first result: load_packaged / eager / "
        "torch.compile cold (s) | max abs loaded - eager (values up to) | validation: frozen err / "
        "eager err / multiple | eager call |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        c, ld, e, cc = r["capture"], r.get("load", {}), r.get("eager", {}), r.get("compile", {})
        if "error" in c:
            lines.append(
                f"| {r['layers']} | FAILED: {c['error'].splitlines()[-1][:150]} | | | | | | | |"
            )
            continue
        val = c.get("validation") or {}
        lines.append(
            f"| {r['layers']} | {c['capture_s']:.1f} | {c['source_bytes'] / 1024:.0f} KiB | "
            f"{c['cache_bytes'] / 1024:.0f} KiB | {_fmt(ld.get('load_s'))} | {_fmt(ld.get('first_result_s'))} / "
            f"{_fmt(e.get('first_result_s'))} / {_fmt(cc.get('first_result_s'))} | "
            f"{_fmt(ld.get('max_abs_vs_eager'))} ({_fmt(ld.get('max_abs_value'))}) | {_worst(val)} | "
            f"{(val.get('eager_call') or {}).get('outcome', '-')} |"
        )
    if len(caps) >= 2:
        a, b = caps[0], caps[-1]
        dl = b["layers"] - a["layers"]
        per = (b["capture"]["source_bytes"] - a["capture"]["source_bytes"]) / dl
        per_cache = (b["capture"]["cache_bytes"] - a["capture"]["cache_bytes"]) / dl
        per_s = (b["capture"]["source_compile_s"] - a["capture"]["source_compile_s"]) / dl
        at80 = b["capture"]["source_bytes"] + per * (80 - b["layers"])
        s80 = b["capture"]["source_compile_s"] + per_s * (80 - b["layers"])
        lines += [
            "",
            f"Source half: {per / 1024:.1f} KiB per layer (cache half {per_cache / 1024:.1f} KiB per "
            f"layer) between {a['layers']} and {b['layers']} layers; Python's compile() of the "
            f"source {per_s * 1000:.1f} ms per layer. Extrapolated to 80 layers: source "
            f"{at80 / 1024:.0f} KiB, compile() {s80:.2f} s (part of load seconds, paid once per "
            "process).",
        ]
    (out_dir / f"scale_{device}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def repeat_builds(device: str, cfg: dict, work: Path, n: int) -> int:
    gpus = [None]
    if device == "cuda":
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = (
            [g.strip() for g in visible.split(",") if g.strip()]
            if visible
            else [str(i) for i in range(torch.cuda.device_count())]
        ) or [None]
    jobs = [(layers, i) for layers in cfg["layers"] for i in range(n)]
    failed = 0
    free = list(gpus)
    import threading

    lock = threading.Condition()

    def one(job):
        nonlocal failed
        layers, i = job
        with lock:
            while not free:
                lock.wait()
            gpu = free.pop(0)
        try:
            d = work / f"build-L{layers}-{i}"
            d.mkdir()
            start = time.monotonic()
            r = run_worker("capture", cfg, layers, device, d, gpu)
            wall = time.monotonic() - start
        finally:
            with lock:
                free.append(gpu)
                lock.notify()
        where = f"cuda:{gpu}" if gpu is not None else device
        if "error" in r:
            failed += 1
            last = [ln for ln in r["error"].splitlines() if ln.strip()][-1:] or ["?"]
            line = f"build {i + 1}/{n} L{layers} on {where}: FAILED after {wall:.0f} s: {last[0][:400]}"
        else:
            val = r.get("validation") or {}
            line = (
                f"build {i + 1}/{n} L{layers} on {where}: ok, capture {r['capture_s']:.1f} s, "
                f"source {r['source_bytes'] / 1024:.0f} KiB, cache {r['cache_bytes'] / 1024:.0f} KiB, "
                f"frozen/eager err/multiple {_worst(val)}, reference {val.get('reference')}"
                f"{' (fallback ' + ','.join(val['fallback_ops']) + ')' if val.get('fallback_ops') else ''}, "
                f"eager call {(val.get('eager_call') or {}).get('outcome')}"
            )
        print(line, flush=True)

    with ThreadPoolExecutor(max_workers=len(gpus)) as pool:
        list(pool.map(one, jobs))
    print(f"{len(jobs) - failed}/{len(jobs)} builds succeeded", flush=True)
    return 1 if failed else 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--llama" in argv:  # the real-size Llama bench (scale_llama.py), CUDA only
        from scale_llama import main as llama

        return llama([a for a in argv if a not in ("--llama", "--device", "cuda")])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default=None)
    p.add_argument(
        "--layers", default=None, help="comma-separated layer counts (default: per device)"
    )
    p.add_argument("--repeat-builds", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--config", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        r = worker(a.worker, json.loads(a.config), int(a.layers), a.device, Path(a.work))
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = dict(CONFIGS[a.device])
    if a.layers:
        cfg["layers"] = [int(v) for v in a.layers.split(",")]
    with tempfile.TemporaryDirectory(prefix="precompile-scale-") as tmp:
        work = Path(tmp)
        if a.repeat_builds:
            return repeat_builds(a.device, cfg, work, a.repeat_builds)
        table(a.device, cfg, work, Path(a.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
