"""What does loading a torch-engine pair still compile on CPU? (a measurement, not a test)

Usage (torch with torch.compiler.precompile, e.g. torch 2.14.1)::

    PYTHONPATH=.:runtime /tmp/v214/bin/python bench/torch_engine_load.py \
        [--out bench/results/torch_engine_load_cpu.md]

1. A capture process makes an inductor pair (Linear(8,8) -> ReLU -> Linear(8,8), a batch of
   4) with ``precompile_build.engines.torch_engine.capture_pair`` and its own inductor cache.
2. Each scenario then runs in a FRESH process with an EMPTY ``TORCHINDUCTOR_CACHE_DIR``
   and loads the pair with ``precompile_runtime.torch_pairs.load_torch_pair``. Before
   torch is imported the child wraps ``subprocess.Popen.__init__`` to count compiler
   invocations (argv[0] basename in g++/gcc/c++/cc/clang/nvcc/ptxas) and wraps
   ``torch._inductor.compile_fx.compile_fx{,_inner}`` to count inductor lowerings. It
   records which of ``torch._dynamo`` / ``torch._inductor`` are imported before and after,
   the number of files the load wrote under the inductor cache dir, and wall times
   (wall times are this machine's, for orientation only).

Scenarios: ``cache`` (host matches: torch's load primes the kernels from the cache),
``fallback`` (host mismatch: artifact left out, python_code compiles itself), ``eager``
(a backend="eager" pair), ``cache-warm`` (``cache`` again, reusing the inductor cache dir
the ``cache`` child left behind).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
COMPILERS = {"g++", "gcc", "c++", "cc", "clang", "clang++", "nvcc", "ptxas"}

CAPTURE = textwrap.dedent(
    """
    import sys, torch
    from precompile_build.engines.torch_engine import capture_pair
    out, backend = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    src, cache = capture_pair(lambda m, x: m(x), (m, torch.randn(4, 8)), {}, target="bench",
                              device="cpu", options={"backend": backend})
    open(out + ".py", "wb").write(src)
    open(out + ".cache", "wb").write(cache)
    """
)

CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    compilers = set(json.loads(sys.argv[3]))
    counts = {"compiler_procs": 0, "other_procs": 0, "compile_fx": 0}
    phase = ["import"]
    per_phase = {}
    _init = subprocess.Popen.__init__
    def counting_init(self, args, *a, **kw):
        argv = args if isinstance(args, (list, tuple)) else [args]
        exe = os.path.basename(str(argv[0])).split()[0] if argv else ""
        key = "compiler_procs" if (exe in compilers or exe.endswith(("-g++", "-gcc"))) else "other_procs"
        per_phase.setdefault(phase[0], {"compiler_procs": 0, "other_procs": 0})[key] += 1
        if key == "compiler_procs":
            words = [str(w) for w in argv]
            if "--version" in words or "-v" in words:
                kind = "compiler version probe"
            elif any(w.endswith("header.hpp") for w in words):
                kind = "precompiled-header build"
            elif any(w.endswith(".main.cpp") for w in words):
                kind = "kernel compile (.main.cpp)"
            elif any(w.endswith(".cpp") for w in words):
                kind = "other .cpp compile (vec-ISA checks, kernel parts)"
            else:
                kind = "other compiler call (link)"
            kinds = per_phase[phase[0]].setdefault("compiler_kinds", {})
            kinds[kind] = kinds.get(kind, 0) + 1
        return _init(self, args, *a, **kw)
    subprocess.Popen.__init__ = counting_init

    t0 = time.perf_counter()
    import torch
    t_import = time.perf_counter() - t0
    from precompile_runtime.torch_pairs import load_torch_pair
    mods = lambda: sorted(m for m in ("torch._dynamo", "torch._inductor", "torch._inductor.compile_fx") if m in sys.modules)
    before = mods()
    import importlib.abc
    class Hook(importlib.abc.MetaPathFinder):  # wrap compile_fx when (if) it gets imported
        def find_spec(self, name, path, target=None):
            return None
    def wrap_compile_fx():
        cf = sys.modules.get("torch._inductor.compile_fx")
        if cf is None or getattr(cf, "_bench_wrapped", False):
            return
        for n in ("compile_fx", "compile_fx_inner"):
            f = getattr(cf, n)
            def w(*a, _f=f, **k):
                counts["compile_fx"] += 1
                return _f(*a, **k)
            setattr(cf, n, w)
        cf._bench_wrapped = True
    src = open(sys.argv[1] + ".py", "rb").read()
    cache = open(sys.argv[1] + ".cache", "rb").read()
    mode = sys.argv[2]
    phase[0] = "load"
    t0 = time.perf_counter()
    fn = load_torch_pair(src, cache, fallback=(mode == "fallback"), where="bench")
    t_load = time.perf_counter() - t0
    wrap_compile_fx()
    after_load = mods()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8))
    x = torch.randn(4, 8)
    phase[0] = "first_call"
    t0 = time.perf_counter()
    with torch.no_grad():
        y = fn(m, x)
    t_call = time.perf_counter() - t0
    phase[0] = "later_calls"
    with torch.no_grad():
        for _ in range(3):
            fn(m, x)
        ok = bool(torch.allclose(y, m(x), atol=1e-5))
    files = sum(len(f) for _, _, f in os.walk(os.environ["TORCHINDUCTOR_CACHE_DIR"]))
    print(json.dumps({"mode": mode, "torch": torch.__version__, "matches_eager": ok,
        "procs_by_phase": per_phase, "compile_fx_calls_after_load": counts["compile_fx"],
        "modules_before_load": before, "modules_after_load": after_load,
        "inductor_cache_files_after": files, "import_torch_s": round(t_import, 3),
        "load_s": round(t_load, 3), "first_call_s": round(t_call, 4)}))
    """
)


def _env(cache_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, os.path.join(REPO, "runtime")])
    env["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    env.pop("TORCHINDUCTOR_FORCE_DISABLE_CACHES", None)
    return env


def run(out_md: str | None) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-torch-load-") as tmp:
        for backend in ("inductor", "eager"):
            cdir = os.path.join(tmp, f"capture-cache-{backend}")
            subprocess.run(
                [sys.executable, "-c", CAPTURE, os.path.join(tmp, backend), backend],
                check=True,
                env=_env(cdir),
                capture_output=True,
            )
        shared_cache = os.path.join(tmp, "serve-cache-for-warm")
        scenarios = [
            ("cache", "inductor", shared_cache),
            ("cache-warm", "inductor", shared_cache),
            ("fallback", "inductor", os.path.join(tmp, "serve-fallback")),
            ("eager", "eager", os.path.join(tmp, "serve-eager")),
        ]
        for mode, backend, cdir in scenarios:
            os.makedirs(cdir, exist_ok=True)
            if mode != "cache-warm":
                assert not os.listdir(cdir), "serving cache dir must start empty"
            child_mode = "cache" if mode == "cache-warm" else mode
            p = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    os.path.join(tmp, backend),
                    child_mode,
                    json.dumps(sorted(COMPILERS)),
                ],
                env=_env(cdir),
                capture_output=True,
                text=True,
            )
            if p.returncode:
                raise SystemExit(f"{mode} child failed:\n{p.stderr[-4000:]}")
            r = json.loads(p.stdout.strip().splitlines()[-1])
            r["scenario"] = mode
            results.append(r)
            print(json.dumps(r), flush=True)
    if out_md:
        _write_md(out_md, results)
    return results


FINDINGS = """## What this shows (torch 2.14.1, CPU)

(Written from the runs below and from reading the processes and kernels by hand: the
`g++ -E` / `openssl` command lines and the `loadu(p, 16)` source are manual
observations, not recorded by this script.)

- torch's cache does not hold compiled CPU kernels. Its `artifact` is a
  `save_cache_artifacts` bundle with one `inductor` (FX graph cache) entry, which
  `load_cache_artifacts` installs; but the exec'd python_code builds its C++ kernels
  through `async_compile.cpp_pybinding` (never through compile_fx), so that entry is never
  looked up. With an empty inductor cache dir, `load` with the cache runs exactly the
  same compiler processes as the no-cache fallback: g++ version probes, inductor's
  vector-ISA test builds, a precompiled-header build and the kernel compile.
- Only a warm `TORCHINDUCTOR_CACHE_DIR` (same host, same user, after one load) skips the
  kernel compile; even then each fresh process runs the 3 version probes and the header
  preprocessing (`g++ -E`, plus `openssl sha512`).
- Every load imports `torch._dynamo` and `torch._inductor` (torch's `load` imports
  dynamo, python_code imports inductor's runtime), also for `backend="eager"` pairs.
- No inductor lowering (`compile_fx`) runs at load, and calls after `load` start no
  process: all compiling happens inside `load`.
- So on CPU, "serving compiles nothing" does not hold for the torch engine on a fresh
  host: the compiled-kernel bytes are not in torch's pair. precompile_runtime's serving
  guard wraps compile_fx / cpp_extension / triton, not inductor's CppCodeCache, so it does
  not catch these g++ runs either. The python_code's kernels also bake the capture
  host's vector width (`Vectorized<float>::loadu(p, 16)` for AVX512), which is why the
  torch engine's CPU fingerprint records `cpu_isa`.
"""


def _write_md(path: str, results: list[dict]) -> None:
    def procs(r, phase):
        d = r["procs_by_phase"].get(phase, {})
        return f"{d.get('compiler_procs', 0)} / {d.get('other_procs', 0)}"

    lines = [
        "# Torch engine: what torch's own load still compiles on CPU",
        "",
        f"Measured with `bench/torch_engine_load.py` (torch {results[0]['torch']}, "
        f"Python {sys.version.split()[0]}, CPU only). Each row is a fresh process with an "
        "empty `TORCHINDUCTOR_CACHE_DIR` (except `cache-warm`, which reuses the dir the "
        "`cache` row left). Model: Linear(8,8)-ReLU-Linear(8,8), batch 4. "
        "Processes are `compiler (g++/gcc/cc/clang...) / other` subprocesses started in that phase.",
        "",
        "| scenario | procs during load | procs on 1st call | procs on later calls | compile_fx calls | "
        "dynamo/inductor imported after load | inductor cache files written | load s | 1st call s | == eager |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r['scenario']} | {procs(r, 'load')} | {procs(r, 'first_call')} | "
            f"{procs(r, 'later_calls')} | {r['compile_fx_calls_after_load']} | "
            f"{', '.join(r['modules_after_load']) or 'none'} | {r['inductor_cache_files_after']} | "
            f"{r['load_s']} | {r['first_call_s']} | {r['matches_eager']} |"
        )
    lines += ["", "Compiler processes during load, by kind:", ""]
    for r in results:
        kinds = r["procs_by_phase"].get("load", {}).get("compiler_kinds", {})
        lines.append(
            f"- {r['scenario']}: "
            + (", ".join(f"{k}: {v}" for k, v in sorted(kinds.items())) or "none")
        )
    lines += (
        ["", FINDINGS, "", "Raw results:", "", "```json"]
        + [json.dumps(r) for r in results]
        + ["```", ""]
    )
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(HERE, "results", "torch_engine_load_cpu.md"))
    run(ap.parse_args().out)
