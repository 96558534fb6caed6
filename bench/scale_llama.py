"""Real-size scale bench: Llama-shaped bf16 models on one GPU.

    python bench/scale.py --device cuda --llama --sizes 1b
    python bench/scale.py --device cuda --llama --sizes 8b --modes capture,load,eager
    python bench/scale.py --device cuda --llama --sizes 3b --modes capture --cap-gib 24 --tag cap24

transformers' ``LlamaForCausalLM`` with random weights made on the GPU in bf16, shaped
like Llama 3 (sizes below), one target ``forward(model, ids) -> logits`` for a prompt
of 1 x 128 tokens. Each mode runs in a fresh process with empty Inductor, Triton and
precompile-runtime caches:

  capture   ``precompile_build.capture(..., engine="frozen")``: seconds (and per step:
            trace, eager call, Inductor compile, first run, validation); the GPU peak
            of the capture and of its own eager call (capture_stats.cuda_peaks) and their
            ratio; source and cache bytes; what validation checked (reference, worst
            value, eager call). ``--cap-gib N``: under
            ``torch.cuda.set_per_process_memory_fraction(N GiB / total)``
  load      ``load_packaged`` with ``PRECOMPILE_NO_COMPILE=1`` (the serving guard):
            first result, steady ms, max |loaded - eager|, and the compiler modules
            (torch._inductor, torch._dynamo, triton) the load imported
  eager     first result, GPU peak of the call, steady ms
  compile   ``torch.compile`` cold: first result, steady ms
  profile   (not by default) cProfile of load + first call: the top functions by
            cumulative seconds, in the JSON only (where the first result goes)
  wheel     (not by default; instead of ``capture``) the way users ship it: a project
            with the target built by ``python -m build --no-isolation --wheel`` (the
            capture runs in the build backend), the wheel installed with pip
            (``--target``, byte-compiled as pip does); ``load``/``profile`` then load
            the installed package. Build seconds and the manifest's figures for the
            target (``capture_seconds``, ``peak_memory``, validation)

First result: seconds from "model and inputs exist" to the first synchronized
result; a mode given more than once (``--modes wheel,eager,load,eager,load``) runs
again in a fresh process each time, interleaved with the others, and its first result
is the median of its runs (``first_result_runs``: the first process after a build is
slower for every mechanism on a busy host). Each worker also reports its peak RSS (``host_peak_bytes``). The ``cpu`` size
(``LLAMA_BENCH_DEVICE=cpu LLAMA_BENCH_DTYPE=float32 LLAMA_BENCH_TOKENS=64``) is the
issue's CPU case: a capture's host peak against eager's. Steady: median ms of 20 synchronized calls after 3 warm-up calls. Results:
``scale_cuda_llama_<tag>.json`` and a section of ``scale_cuda.md`` under ``--out``
(``scale_cpu*`` for the CPU).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGE = "llamabench"
TOKENS = 128
SIZES = {  # hidden, intermediate, layers, heads, kv heads, tied embeddings (vocab 128256)
    "cpu": dict(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=False,
        vocab_size=32000,
    ),  # the CPU case
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),  # a smoke test (also on CPU)
    "0.5b": dict(
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),  # Llama-3.2-1B
    "3b": dict(
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=28,
        num_attention_heads=24,
        num_key_value_heads=8,
        tie_word_embeddings=True,
    ),  # Llama-3.2-3B
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),  # Llama-3-8B
}
_COMPILER = ("torch._inductor", "torch._dynamo", "triton")


def _device() -> str:
    return os.environ.get("LLAMA_BENCH_DEVICE", "cuda")  # "cpu": the tiny size's smoke test


def _sync() -> None:
    import torch

    if _device() == "cuda":
        torch.cuda.synchronize()


def build(size: str):
    """(model, ids): the ``size`` Llama in bf16 on cuda (random weights, seeded), eval;
    ids: (1, TOKENS) token ids."""
    import torch
    import transformers

    shape = dict(SIZES[size])
    cfg = transformers.LlamaConfig(
        vocab_size=shape.pop("vocab_size", 128256),
        rope_theta=500000.0,
        max_position_embeddings=8192,
        **shape,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    # made in bf16 on the GPU: no fp32 copy (LLAMA_BENCH_DTYPE=float32: the CPU case's fp32)
    torch.set_default_dtype(getattr(torch, os.environ.get("LLAMA_BENCH_DTYPE", "bfloat16")))
    try:
        with torch.device(_device()):
            model = transformers.LlamaForCausalLM(cfg).eval()
            ids = torch.randint(
                0, cfg.vocab_size, (1, int(os.environ.get("LLAMA_BENCH_TOKENS", TOKENS)))
            )
    finally:
        torch.set_default_dtype(default)
    return model, ids


def forward(model, ids):
    return model(ids, use_cache=False).logits


def _maxrss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _steady_ms(fn, n: int = 20) -> float:
    for _ in range(3):
        fn()
    _sync()
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t) * 1000)
    return sorted(times)[n // 2]


def worker(mode: str, size: str, work: Path, cap_gib: float | None) -> dict:
    t0 = time.perf_counter()
    import torch

    if cap_gib and _device() == "cuda":
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_gib * 2**30 / total))
    model, ids = build(size)
    _sync()
    ready = time.perf_counter()
    out: dict = {
        "mode": mode,
        "size": size,
        "setup_s": ready - t0,
        "cap_gib": cap_gib,
        "params": sum(p.numel() for p in model.parameters()),
        "weights_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }
    name = f"llama_{size.replace('.', '_')}"
    with torch.no_grad():
        if mode == "capture":
            import precompile_build
            from precompile_build.builder.pairs import read_source_metadata

            stats = work / f"{name}.stats.json"
            os.environ["PRECOMPILE_STATS_PATH"] = str(stats)
            mode_opt = os.environ.get(
                "LLAMA_BENCH_CAPTURE_MODE"
            )  # bench/llama_cold.py: "max-autotune"
            with precompile_build.capture(
                forward,
                engine="frozen",
                target=name,
                options={"mode": mode_opt} if mode_opt else None,
                artifact_path=work / f"{name}.py",
                cache_path=work / f"{name}.cache",
            ) as f:
                f(model, ids)
            _sync()
            out["capture_s"] = time.perf_counter() - ready
            out.update(json.loads(stats.read_text()) if stats.exists() else {})
            out["host_peak_bytes"] = _maxrss()
            out["source_bytes"] = (work / f"{name}.py").stat().st_size
            out["cache_bytes"] = (work / f"{name}.cache").stat().st_size
            meta = read_source_metadata((work / f"{name}.py").read_bytes(), what=name)
            out["validation"] = meta["validation"]
            if "assumed" in meta:  # what each served call checks of Python state
                from precompile_build.wheels.manifest import checks_count

                out["checks"] = checks_count(meta["assumed"])
            return out
        if mode == "eager":
            if _device() == "cuda":
                torch.cuda.reset_peak_memory_stats()
            y = forward(model, ids)
        elif mode == "compile":
            fn = torch.compile(
                forward, mode=os.environ.get("LLAMA_BENCH_COMPILE_MODE")
            )  # None: default
            y = fn(model, ids)
        elif mode == "load":
            import precompile_runtime

            before = {m for m in sys.modules if m.startswith(_COMPILER)}
            fn = precompile_runtime.load_packaged(name, package=PACKAGE, strict=True)
            _sync()
            out["load_s"] = time.perf_counter() - ready  # manifest, sha256s, unpack, exec, kernels
            c0 = time.perf_counter()
            y = fn(model, ids)
            _sync()
            out["first_call_s"] = time.perf_counter() - c0  # first launches, cuBLAS handles
            out["compiler_modules_imported"] = sorted(
                m for m in sys.modules if m.startswith(_COMPILER) and m not in before
            )
        elif mode == "profile":
            out["profile"] = _profile_first_result(
                lambda: precompile_runtime_load(name), model, ids
            )
            return out
        else:
            raise SystemExit(f"unknown mode {mode}")
        _sync()
        out["first_result_s"] = time.perf_counter() - ready
        if mode == "eager" and _device() == "cuda":
            out["eager_gpu_bytes"] = torch.cuda.max_memory_allocated()
        if mode == "eager":
            out["steady_ms"] = _steady_ms(lambda: forward(model, ids))
        else:
            out["steady_ms"] = _steady_ms(lambda: fn(model, ids))
        out["host_peak_bytes"] = _maxrss()  # after the steady calls: they allocate nothing new
        if mode == "load":
            want = forward(model, ids)
            out["max_abs_vs_eager"] = float((y.float() - want.float()).abs().max())
            out["max_abs_value"] = float(want.float().abs().max())
    return out


def precompile_runtime_load(name: str):
    import precompile_runtime

    return precompile_runtime.load_packaged(name, package=PACKAGE, strict=True)


def _profile_first_result(load, model, ids, top: int = 40) -> list[dict]:
    """cProfile of ``load()`` and the loaded function's first call (synchronized):
    the ``top`` functions by cumulative seconds, each ``{"fn", "calls", "own_s",
    "cum_s"}``, then the ``top // 4`` ATen ops by their own host seconds (torch.profiler,
    ``{"op", "calls", "own_s"}``: which op a slow built-in call is). Profiling slows
    Python-heavy parts: read the shares, not the sums."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity, profile

    prof = cProfile.Profile()
    with profile(activities=[ProfilerActivity.CPU]) as ops:
        prof.enable()
        fn = load()
        fn(model, ids)
        _sync()
        prof.disable()
    by_op = sorted(ops.key_averages(), key=lambda e: -e.self_cpu_time_total)[: top // 4]
    rows = [
        {"op": e.key, "calls": e.count, "own_s": round(e.self_cpu_time_total / 1e6, 4)}
        for e in by_op
    ]
    for (path, line, func), (_, calls, own, cum, _) in pstats.Stats(prof).stats.items():
        rows.append(
            {
                "fn": f"{os.path.basename(path)}:{line}:{func}",
                "calls": calls,
                "own_s": round(own, 4),
                "cum_s": round(cum, 4),
            }
        )
    fns = [r for r in rows if "fn" in r]
    fns.sort(key=lambda r: -r["cum_s"])
    return fns[:top] + [r for r in rows if "op" in r]


def _env(work: Path, mode: str) -> dict:
    from scale import _env as fresh  # empty caches per process, this checkout first

    env = fresh(work)
    if mode in ("load", "profile"):
        env["PRECOMPILE_NO_COMPILE"] = "1"  # the serving guard: a compile raises
    return env


def run_worker(
    mode: str, size: str, work: Path, cap_gib: float | None, env: dict | None = None
) -> dict:
    """``mode`` of ``size`` in a fresh process with empty caches (``env``: more
    variables, e.g. ``LLAMA_BENCH_CAPTURE_MODE``); its result row, or ``{"error": ...}``."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        "--sizes",
        size,
        "--work",
        str(work),
    ]
    if cap_gib:
        cmd += ["--cap-gib", str(cap_gib)]
    p = subprocess.run(
        cmd, env={**_env(work, mode), **(env or {})}, capture_output=True, text=True, timeout=1800
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"mode": mode, "size": size, "error": (p.stderr or p.stdout)[-1500:]}
    return json.loads(lines[-1][len("RESULT ") :])


_CAPTURE_SCRIPT = """import sys
sys.path.insert(0, {bench!r})
import torch
import precompile_build
from scale_llama import build, forward

model, ids = build({size!r})
with torch.no_grad(), precompile_build.capture(forward, engine="frozen") as f:
    f(model, ids)
"""


def build_wheel(work: Path, size: str) -> dict:
    """``wheel`` mode: build and pip-install the project wheel of one size's target
    (see the module docstring); returns the row (``build_s``, ``wheel_bytes``, the
    manifest's variant fields) or ``{"error": ...}``."""
    import shutil
    import textwrap

    name = f"llama_{size.replace('.', '_')}"
    proj = work / "proj"
    shutil.rmtree(proj, ignore_errors=True)
    (proj / PACKAGE).mkdir(parents=True)
    (proj / PACKAGE / "__init__.py").write_text("")
    (proj / "capture.py").write_text(_CAPTURE_SCRIPT.format(bench=str(HERE), size=size))
    (proj / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [build-system]
        requires = ["precompile-build"]
        build-backend = "precompile_build.backend"

        [project]
        name = "{PACKAGE}"
        version = "0.1.0"
        dynamic = ["dependencies"]

        [tool.setuptools]
        packages = ["{PACKAGE}"]

        [tool.precompile]
        package = "{PACKAGE}"

        [tool.precompile.targets.{name}]
        script = "capture.py"
        device = "{_device()}"
        timeout = 1800
        """)
    )
    env = _env(work, "capture")
    env["PRECOMPILE_CACHE"] = "0"  # a capture of this run, not one a previous build cached
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "runtime"), env.get("PYTHONPATH", "")]
    )
    dist, site = work / "dist", work / "site"
    shutil.rmtree(dist, ignore_errors=True)
    shutil.rmtree(site, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--wheel",
            "--outdir",
            str(dist),
            str(proj),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    out: dict = {"mode": "wheel", "size": size, "build_s": time.perf_counter() - t0}
    wheels = sorted(dist.glob(f"{PACKAGE}-*.whl"))
    if p.returncode != 0 or not wheels:
        return {**out, "error": (p.stderr or p.stdout)[-1500:]}
    out["wheel_bytes"] = wheels[0].stat().st_size
    out["build_lines"] = [
        ln for ln in p.stdout.splitlines() + p.stderr.splitlines() if "precompile:" in ln
    ][-3:]
    q = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            str(site),
            str(wheels[0]),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if q.returncode != 0:
        return {**out, "error": "pip install: " + (q.stderr or q.stdout)[-1500:]}
    manifest = json.loads((site / PACKAGE / "_precompiled" / "manifest.json").read_text())
    variant = manifest["targets"][name]["variants"][0]
    out["variant"] = {k: v for k, v in variant.items() if k not in ("files",)}
    return out


def _package(work: Path, name: str) -> None:
    """work/site/llamabench/_precompiled/: the pair and its manifest, as a wheel has them."""
    sys.path[:0] = [str(ROOT), str(ROOT / "runtime")]
    from precompile_build.builder.pairs import inspect_pair
    from precompile_build.builder.runner import CaptureResult
    from precompile_build.wheels.manifest import assemble, write_dir_atomic

    src, cache = work / f"{name}.py", work / f"{name}.cache"
    info = inspect_pair(src, cache)
    pkg = work / "site" / PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    results = [
        CaptureResult(name, "ok", True, info.device, source_path=src, cache_path=cache, info=info)
    ]
    write_dir_atomic(pkg / "_precompiled", assemble(PACKAGE, results))


def _gib(b) -> str:
    return "-" if b is None else f"{b / 2**30:.2f}"


def _s(v) -> str:
    return "-" if v is None else f"{v:.2f}"


_STEPS = (
    "trace_s",
    "eager_call_s",
    "compile_s",
    "first_run_s",
    "validate_s",
)  # capture_stats.STEPS after setup
# capture_stats.STEPS + VALIDATE_PARTS: the steps whose GPU peaks a CUDA capture records
_PEAK_STEPS = (
    "trace",
    "eager_call",
    "compile",
    "first_run",
    "validate",
    "validate_graph",
    "validate_frozen",
    "validate_reference",
)


def peak_step(c: dict) -> str | None:
    """The capture step (a part of validate rather than validate) whose GPU peak is the
    capture's, from a capture row's ``<step>_gpu_bytes``; None where not recorded."""
    at = [s for s in _PEAK_STEPS if c.get(f"{s}_gpu_bytes", -1) >= c.get("gpu_bytes", 1 << 62)]
    return at[-1] if at else None


def _from_wheel(w: dict | None) -> dict:
    """A capture row made of a ``wheel`` row's manifest fields: its seconds are the
    capture steps' sum (the manifest's ``capture_seconds`` is the script process's, its
    imports and model build included: ``setup``); a manifest without steps, that."""
    if not w or "error" in w:
        return w or {}
    v = w.get("variant") or {}
    pm = v.get("peak_memory") or {}
    # `autotune` is part of compile and first_run (process/stats.py), not a step of its own
    steps = {
        k: x
        for k, x in (v.get("capture_breakdown") or {}).items()
        if k not in ("setup", "autotune")
    }
    out = {
        "capture_s": round(sum(steps.values()), 2) if steps else v.get("capture_seconds"),
        "gpu_bytes": pm.get("gpu_bytes"),
        "eager_gpu_bytes": pm.get("eager_gpu_bytes"),
        "validation": v.get("validation") or {},
    }
    out.update({f"{k}_s": x for k, x in (v.get("capture_breakdown") or {}).items()})
    out.update({f"{k}_gpu_bytes": x for k, x in (pm.get("gpu_steps") or {}).items()})
    return out


def _first(r: dict) -> str:
    """A mode's first result: the median of its runs, with their number when more than one."""
    runs = r.get("first_result_runs") or []
    return _s(r.get("first_result_s")) + (f" (median of {len(runs)})" if len(runs) > 1 else "")


def _runs(c: dict) -> str:
    """`` (runs 19.7, 17.7; steps of the last)`` for a capture given more than once."""
    runs = c.get("capture_runs") or []
    return (
        f" (the last of runs {', '.join(f'{x:.1f}' for x in runs)}, and its steps)"
        if len(runs) > 1
        else ""
    )


def _row(size: str, r: dict) -> str:
    c, ld, e, cc = (r.get(m, {}) for m in ("capture", "load", "eager", "compile"))
    if not c and r.get("wheel"):
        c = dict(_from_wheel(r["wheel"]), params=ld.get("params") or e.get("params") or 0)
    if "error" in c:
        return f"| {size} | FAILED: {c['error'].strip().splitlines()[-1][:200]} |" + " |" * 8
    val = c.get("validation") or {}
    worst = (val.get("cases") or [{}])[0].get("worst") or {}
    ratio = (c["gpu_bytes"] / c["eager_gpu_bytes"]) if c.get("eager_gpu_bytes") else None
    if "gpu_bytes" not in c and c.get("host_peak_bytes") and e.get("host_peak_bytes"):
        # a CPU capture: host peaks, the capturing process's against the eager process's
        c = dict(c, gpu_bytes=c["host_peak_bytes"], eager_gpu_bytes=e["host_peak_bytes"])
        ratio = c["gpu_bytes"] / c["eager_gpu_bytes"]
    checked = val.get("reference", "-") + (" (part on CPU)" if val.get("spilled_to_cpu") else "")
    if worst.get("frozen_error") is not None:
        checked += f"; worst {worst['frozen_error']:.3g} vs eager {worst['eager_error']:.3g} x{worst['multiple']:g}"
    checked += f"; eager call {(val.get('eager_call') or {}).get('outcome', '-')}"
    mods = ld.get("compiler_modules_imported")
    return (
        f"| {size} ({c.get('params', 0) / 1e9:.2f}B{', cap ' + str(c['cap_gib']) + ' GiB' if c.get('cap_gib') else ''}) "
        f"| {_s(c.get('capture_s'))}{_runs(c)} ({', '.join(f'{k[:-2]} {c[k]:.0f}' for k in _STEPS if k in c)}) "
        f"| {_gib(c.get('gpu_bytes'))} / {_gib(c.get('eager_gpu_bytes'))}"
        f" ({'-' if ratio is None else f'{ratio:.2f}x'}{', in ' + peak_step(c) if peak_step(c) else ''})"
        f" | {c.get('source_bytes', 0) / 1024:.0f} KiB / "
        f"{c.get('cache_bytes', 0) / 1024:.0f} KiB | {_first(e)} / {_first(ld)}"
        f" ({'last run: ' if len(ld.get('first_result_runs') or []) > 1 else ''}load {_s(ld.get('load_s'))}"
        f" + first call {_s(ld.get('first_call_s'))})"
        f" / {_s(cc.get('first_result_s'))} | {_s(e.get('steady_ms'))} / {_s(ld.get('steady_ms'))} / "
        f"{_s(cc.get('steady_ms'))} | {_s(ld.get('max_abs_vs_eager'))} ({_s(ld.get('max_abs_value'))}) | "
        f"{'-' if mods is None else len(mods)} | {checked} |"
    )


def write(out_dir: Path, device: str = "cuda") -> str:
    """Regenerate the Llama section of ``scale_<device>.md`` from every
    ``scale_<device>_llama_*.json`` under ``out_dir``; returns the section."""
    docs = [json.loads(p.read_text()) for p in sorted(out_dir.glob(f"scale_{device}_llama_*.json"))]
    head = [
        "<!-- llama -->",
        "## Llama-shaped models (issue 24)",
        "",
        "Produced by `python bench/scale.py --device cuda --llama --sizes ...` (bench/scale_llama.py): "
        "transformers LlamaForCausalLM, random weights made on the device, `forward(model, ids) -> "
        "logits`, each mode in a fresh process with empty caches. Capture peak: "
        "torch.cuda.max_memory_allocated during the capture (the weights included) / the same during "
        "the capture's own eager call, and the step that reached it (CPU rows: the peak RSS of the "
        "capturing process / of the eager process). load: `PRECOMPILE_NO_COMPILE=1`; compiler modules: "
        "torch._inductor / torch._dynamo / triton modules the load imported. Capture s: the capture's wall "
        "seconds from the model built (capture mode), or, for sizes built as wheels, the sum of the "
        "manifest's capture steps (the script's setup, and the pair's writing, left out). A mode run more "
        "than once: the median of its first results.",
        "",
    ]
    for d in docs:
        head.append(
            f"- `{d['tag']}`: torch {d['torch']}, {d['gpu']}, {d.get('dtype', 'bfloat16')}, "
            f"1 x {d.get('tokens', TOKENS)} tokens" + (f"; {d['note']}" if d.get("note") else "")
        )
    head += [
        "",
        "| size | capture s (per step) | capture peak GiB / eager call's (ratio) | source / cache | first result s: "
        "eager / load_packaged / torch.compile cold | steady ms: eager / load_packaged / torch.compile | "
        "max abs loaded - eager (values up to) | compiler modules at load | validation |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in docs:
        for size, r in d["rows"].items():
            head.append(_row(size, r))
    wheels = [(size, r["wheel"]) for d in docs for size, r in d["rows"].items() if r.get("wheel")]
    if wheels:
        head += [
            "",
            "Built as a wheel (`--modes wheel,...`: `python -m build`, then `pip install`; the load "
            "rows of these sizes load the installed package):",
            "",
        ]
    for size, w in wheels:
        v = w.get("variant") or {}
        pm = v.get("peak_memory") or {}
        head.append(
            f"- `{size}`: "
            + (
                f"FAILED: {w['error'].strip().splitlines()[-1][:200]}"
                if "error" in w
                else f"build {w['build_s']:.0f} s, wheel {w['wheel_bytes'] / 2**20:.1f} MiB; manifest: capture "
                f"{v.get('capture_seconds')} s (the script's process"
                + (
                    f"; of it setup {v['capture_breakdown']['setup']} s"
                    if "setup" in (v.get("capture_breakdown") or {})
                    else ""
                )
                + f"), peak_memory {json.dumps(pm)}, validation reference "
                f"{(v.get('validation') or {}).get('reference', '-')}"
            )
        )
    section = "\n".join(head + ["<!-- /llama -->"])
    md = out_dir / f"scale_{device}.md"
    text = md.read_text() if md.exists() else ""
    if "<!-- llama -->" in text:
        text = text[: text.index("<!-- llama -->")] + section + text.split("<!-- /llama -->", 1)[-1]
    else:
        text = (text.rstrip() + "\n\n" if text else "") + section + "\n"
    md.write_text(text)
    return section


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="1b", help=f"comma-separated, of {', '.join(SIZES)}")
    p.add_argument("--modes", default="capture,load,eager,compile")
    p.add_argument("--cap-gib", type=float, default=None, help="GPU memory cap for the capture")
    p.add_argument("--tag", default=None, help="names this run's JSON (default: the sizes)")
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument(
        "--rewrite",
        action="store_true",
        help="only regenerate scale_<device>.md's Llama section from the JSON under --out",
    )
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    a, _ = p.parse_known_args(argv)
    sizes = [s.strip() for s in a.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        p.error(f"unknown size(s) {bad}: use {', '.join(SIZES)}")
    if a.rewrite:
        print(write(Path(a.out), _device()))
        return 0
    if a.worker:
        r = worker(a.worker, sizes[0], Path(a.work), a.cap_gib)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    import torch

    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = a.tag or "_".join(s.replace(".", "_") for s in sizes)
    doc = {
        "tag": tag,
        "torch": torch.__version__,
        "rows": {},
        "dtype": os.environ.get("LLAMA_BENCH_DTYPE", "bfloat16"),
        "tokens": int(os.environ.get("LLAMA_BENCH_TOKENS", TOKENS)),
        "gpu": torch.cuda.get_device_name(0) if _device() == "cuda" else "cpu",
    }
    failed = False
    with tempfile.TemporaryDirectory(prefix="precompile-llama-") as tmp:
        work = Path(tmp)
        for size in sizes:
            rows = doc["rows"][size] = {}
            for mode in modes:
                made = rows.get("wheel") or rows.get("capture") or {"error": "not captured"}
                if mode in ("load", "profile") and "error" in made:
                    continue
                if mode == "wheel":
                    r = build_wheel(work, size)
                else:
                    r = run_worker(mode, size, work, a.cap_gib if mode == "capture" else None)
                prev = rows.get(mode)
                if prev is not None and "first_result_s" in prev and "first_result_s" in r:
                    # a mode given again: another fresh process, the first result their median
                    r["first_result_runs"] = prev.get(
                        "first_result_runs", [prev["first_result_s"]]
                    ) + [r["first_result_s"]]
                    r["first_result_s"] = statistics.median(r["first_result_runs"])
                if (
                    prev is not None and "capture_s" in prev and "capture_s" in r
                ):  # capture given again
                    r["capture_runs"] = prev.get("capture_runs", [prev["capture_s"]]) + [
                        r["capture_s"]
                    ]
                rows[mode] = r
                failed |= "error" in r
                print(
                    f"{size} {mode}: {json.dumps({k: v for k, v in r.items() if k != 'validation'})[:600]}",
                    flush=True,
                )
                if mode == "capture" and "error" not in r:
                    _package(work, f"llama_{size.replace('.', '_')}")
                    if r.get("eager_gpu_bytes"):
                        print(
                            f"{size} capture peak GPU {r['gpu_bytes'] / 2**30:.2f} GiB = "
                            f"{r['gpu_bytes'] / r['eager_gpu_bytes']:.2f}x eager call's "
                            f"{r['eager_gpu_bytes'] / 2**30:.2f} GiB, in {peak_step(r)}",
                            flush=True,
                        )
                # after each mode: a run cut short by a time limit keeps the modes it finished
                (out_dir / f"scale_{_device()}_llama_{tag}.json").write_text(
                    json.dumps(doc, indent=2) + "\n"
                )
    print(write(out_dir, _device()))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
