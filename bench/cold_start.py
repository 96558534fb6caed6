"""Cold start of a compiled forward pass, side by side, each in fresh processes.

    python bench/cold_start.py [--models tinylm,gpt_block] [--repeats 3] [--out bench/results]

Mechanisms (a row each, where this host's torch has it):
  eager          plain eager call
  compile_cold   torch.compile, empty Inductor/Triton caches
  compile_warm   torch.compile, on-disk caches primed by an earlier process
  mega_cache     torch.compile after torch.compiler.load_cache_artifacts (Mega-Cache)
  aoti           AOTInductor package (aoti_compile_and_package / aoti_load_package)
  precompile     torch.compiler.precompile pair (torch 2.14+)
  load_packaged  precompile_runtime.load_packaged from an installed wheel (this project)
  load_packaged_graphs  the same with cuda_graphs=True (CUDA only): the first call runs
                 the kernels plainly, the second too (timed: is the size launch-bound?),
                 the third records the graph, later calls replay

Per mechanism: import seconds (``import torch``), setup seconds (building the model
and inputs, the same work for every mechanism), load seconds (the mechanism's own
imports and loading), first-call seconds, ``to_first_result`` (from ``import torch``
finished to the first result, synchronized: setup + load + first call), second-call
seconds (with graphs: the recording), steady-state latency (ms, median of 50 calls
after 10 warm-up calls), artifact bytes, and ratios against eager and against the
best other compiled mechanism. Each cold-start figure is the median of --repeats
fresh processes. Writes cold_start_<device>.json and .md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MECHANISMS = (
    "eager",
    "compile_cold",
    "compile_warm",
    "mega_cache",
    "aoti",
    "precompile",
    "load_packaged",
    "load_packaged_graphs",
)


# ---- worker: runs in a fresh process, prints one JSON line ----------------------------


def worker(mech: str, model_name: str, device: str, work: Path) -> dict:
    t0 = time.perf_counter()  # nothing of torch is imported yet in a worker process
    import torch

    t_import = time.perf_counter()
    # appended: the installed benchmodels (PYTHONPATH, with its _precompiled/) wins
    sys.path += [str(HERE / "project"), str(ROOT / "example_project")]
    import benchmodels

    model, args = benchmodels.build(model_name, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t_ready = time.perf_counter()  # the model exists: what every mechanism starts from
    fn = benchmodels.forward
    if mech == "eager":
        call = lambda: fn(model, *args)  # noqa: E731
    elif mech in ("compile_cold", "compile_warm", "mega_cache"):
        if mech == "mega_cache":
            torch.compiler.load_cache_artifacts((work / "mega.bin").read_bytes())
        compiled = torch.compile(fn)
        call = lambda: compiled(model, *args)  # noqa: E731
    elif mech == "aoti":
        loaded = torch._inductor.aoti_load_package(str(work / f"{model_name}.pt2"))
        call = lambda: loaded(*args)  # noqa: E731
    elif mech == "precompile":
        code = (work / f"{model_name}.precompile.py").read_text()
        cache = (work / f"{model_name}.precompile.cache").read_bytes()
        loaded = torch.compiler.precompile.load(code, cache)
        call = lambda: loaded(model, *args)  # noqa: E731
    elif mech in ("load_packaged", "load_packaged_graphs"):
        import precompile_runtime

        # graphs: calls 1 and 2 run the kernels plainly (warm-up, timed run), the third records
        loaded = precompile_runtime.load_packaged(
            f"{model_name}_forward",
            package="benchmodels",
            strict=True,
            cuda_graphs=mech == "load_packaged_graphs",
        )
        call = lambda: loaded(model, *args)  # noqa: E731
    else:
        raise SystemExit(f"unknown mechanism {mech}")
    t_loaded = time.perf_counter()
    call()
    sync()
    t_first = time.perf_counter()
    call()
    sync()
    t_second = time.perf_counter()
    for _ in range(9):
        call()
    sync()
    times = []
    for _ in range(50):
        s = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - s)
    return {
        "import_s": t_import - t0,
        "setup_s": t_ready - t_import,
        "load_s": t_loaded - t_ready,
        "first_call_s": t_first - t_loaded,
        # the figure: from `import torch` finished to the first result, so
        # building the model (the same for every mechanism) counts for all
        "to_first_result_s": t_first - t_import,
        "second_call_s": t_second - t_first,  # with CUDA graphs: the recording
        "steady_ms": statistics.median(times) * 1e3,
        "compiler_imported": sorted(
            {
                m.split(".")[1]
                for m in sys.modules
                if m.startswith(("torch._inductor", "torch._dynamo"))
            }
        ),
    }


# ---- preparation: artifacts each mechanism loads ---------------------------------------

PRIME = r"""
import sys, torch
sys.path[:0] = [{project!r}, {example!r}]
import benchmodels
mech, name, device, work = {mech!r}, {name!r}, {device!r}, {work!r}
model, args = benchmodels.build(name, device)
if mech in ("compile_warm", "mega_cache"):
    out = torch.compile(benchmodels.forward)(model, *args)
    if mech == "mega_cache":
        data, _info = torch.compiler.save_cache_artifacts()
        open(work + "/mega.bin", "wb").write(data)
elif mech == "aoti":
    class Fwd(torch.nn.Module):
        def __init__(self, m):
            super().__init__(); self.m = m
        def forward(self, *a):
            return benchmodels.forward(self.m, *a)
    ep = torch.export.export(Fwd(model), args)
    torch._inductor.aoti_compile_and_package(ep, package_path=work + "/" + name + ".pt2")
elif mech == "precompile":
    code, cache = torch.compiler.precompile(benchmodels.forward, model, *args)
    open(work + "/" + name + ".precompile.py", "w").write(code)
    open(work + "/" + name + ".precompile.cache", "wb").write(cache)
"""


def _env(work: Path, mech: str, fresh_caches: bool) -> dict:
    env = dict(os.environ)
    caches = work / ("cache-" + mech)
    if fresh_caches:
        shutil.rmtree(caches, ignore_errors=True)
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
        TRITON_CACHE_DIR=str(caches / "triton"),
        PRECOMPILE_CACHE_DIR=str(caches / "precompile"),
        PYTHONPATH=os.pathsep.join(
            [str(work / "site"), str(ROOT / "runtime"), env.get("PYTHONPATH", "")]
        ),
    )
    return env


def _run(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def prepare(mech: str, name: str, device: str, work: Path) -> str | None:
    """Build what ``mech`` loads; returns None, or why the mechanism is not measured."""
    import torch

    if mech in ("eager", "compile_cold"):
        return None
    if mech == "precompile" and not callable(getattr(torch.compiler, "precompile", None)):
        return f"torch {torch.__version__} has no torch.compiler.precompile"
    if mech == "load_packaged_graphs" and device != "cuda":
        return "CUDA graphs: CUDA only"
    if mech in ("load_packaged", "load_packaged_graphs"):
        return None  # built once for all models, see build_wheel()
    code = PRIME.format(
        project=str(HERE / "project"),
        example=str(ROOT / "example_project"),
        mech=mech,
        name=name,
        device=device,
        work=str(work),
    )
    try:
        p = _run([sys.executable, "-c", code], _env(work, mech, fresh_caches=True), 1800)
    except subprocess.TimeoutExpired:
        return "preparation timed out"
    if p.returncode != 0:
        return f"preparation failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}"
    return None


def build_wheel(work: Path, device: str) -> None:
    """Build the benchmodels wheel (captures run here) and install it into work/site."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "runtime")]))
    env["PRECOMPILE_VERBOSE"] = "1"
    dist = work / "dist"
    # precompile-build comes from this tree (PYTHONPATH), not an install: skip the check
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            "--skip-dependency-check",
            "--wheel",
            "--outdir",
            str(dist),
            str(HERE / "project"),
        ],
        check=True,
        env=env,
    )
    shutil.rmtree(HERE / "project" / "build", ignore_errors=True)
    wheel = next(dist.glob("benchmodels-*.whl"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(work / "site"),
            str(wheel),
        ],
        check=True,
    )


def artifact_bytes(mech: str, name: str, work: Path) -> int | None:
    def size(p: Path) -> int:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
        return p.stat().st_size if p.exists() else 0

    if mech == "mega_cache":
        return size(work / "mega.bin")
    if mech == "aoti":
        return size(work / f"{name}.pt2")
    if mech == "precompile":
        return size(work / f"{name}.precompile.py") + size(work / f"{name}.precompile.cache")
    if mech in ("load_packaged", "load_packaged_graphs"):
        base = work / "site" / "benchmodels" / "_precompiled" / f"{name}_forward"
        return size(base.with_suffix(".py")) + size(base.with_suffix(".cache"))
    if mech == "compile_warm":
        return size(work / "cache-compile_warm")
    return None


def measure(mech: str, name: str, device: str, work: Path, repeats: int) -> dict:
    runs, error = [], None
    for _ in range(repeats):
        env = _env(work, mech, fresh_caches=(mech == "compile_cold"))
        try:
            p = _run(
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    mech,
                    "--models",
                    name,
                    "--device",
                    device,
                    "--work",
                    str(work),
                ],
                env,
                1800,
            )
        except subprocess.TimeoutExpired:
            error = "timed out"
            break
        if p.returncode != 0:
            tail = (p.stderr.strip().splitlines() or ["?"])[-1]
            error = f"exit {p.returncode}: {tail[:160]}"
            break
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    if error:
        return {"mechanism": mech, "error": error}
    row = {"mechanism": mech}
    for key in runs[0]:
        vals = [r[key] for r in runs]
        row[key] = statistics.median(vals) if isinstance(vals[0], float) else vals[0]
    row["artifact_bytes"] = artifact_bytes(mech, name, work)
    return row


def add_ratios(rows: list[dict]) -> None:
    eager = next((r for r in rows if r["mechanism"] == "eager" and "error" not in r), None)
    for r in rows:
        if "error" in r or eager is None:
            continue
        r["first_result_vs_eager_first_call"] = r["to_first_result_s"] / eager["to_first_result_s"]
        r["steady_vs_eager"] = r["steady_ms"] / eager["steady_ms"]
        others = [
            o for o in rows if "error" not in o and o["mechanism"] not in ("eager", r["mechanism"])
        ]
        if others:
            best_start = min(others, key=lambda o: o["to_first_result_s"])
            best_steady = min(others, key=lambda o: o["steady_ms"])
            r["first_result_vs_best_other"] = (
                r["to_first_result_s"] / best_start["to_first_result_s"]
            )
            r["best_other_first_result"] = best_start["mechanism"]
            r["steady_vs_best_other"] = r["steady_ms"] / best_steady["steady_ms"]


def markdown(result: dict) -> str:
    out = [
        f"# Cold start on {result['host']}",
        "",
        f"torch {result['torch']}, Python {result['python']}, device {result['device']}, "
        f"median of {result['repeats']} fresh processes per cell. Reproduce: `{result['command']}`.",
        "",
    ]
    for name, rows in result["models"].items():
        out += [
            f"## {name}",
            "",
            result["configs"][name],
            "",
            "| mechanism | import s | setup s | load s | first call s | to first result s | second call s | steady ms "
            "| artifact bytes | first result / eager | vs best other | steady / eager | steady / best other "
            "| compiler stack imported |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            if "error" in r:
                out.append(f"| {r['mechanism']} | not measured: {r['error']} ||||||||||||")
                continue
            f = lambda k, fmt="{:.3f}", r=r: fmt.format(r[k]) if r.get(k) is not None else "-"  # noqa: E731
            out.append(
                " | ".join(
                    [
                        f"| {r['mechanism']}",
                        f("import_s", "{:.2f}"),
                        f("setup_s"),
                        f("load_s"),
                        f("first_call_s"),
                        f("to_first_result_s"),
                        f("second_call_s"),
                        f("steady_ms", "{:.3f}"),
                        f("artifact_bytes", "{:,}"),
                        f("first_result_vs_eager_first_call", "{:.2f}x"),
                        f("first_result_vs_best_other", "{:.2f}x"),
                        f("steady_vs_eager", "{:.2f}x"),
                        f("steady_vs_best_other", "{:.2f}x"),
                        ", ".join(r.get("compiler_imported") or []) or "no",
                    ]
                )
                + " |"
            )
        out.append("")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tinylm,gpt_block")
    ap.add_argument("--mechanisms", default=",".join(MECHANISMS))
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:  # the parent passes the resolved device; import torch inside, timed
        print(json.dumps(worker(a.worker, a.models, a.device, Path(a.work))))
        return 0
    import torch

    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    import platform

    sys.path[:0] = [str(HERE / "project"), str(ROOT / "example_project")]
    import benchmodels

    work = Path(tempfile.mkdtemp(prefix="bench-cold-start-"))
    mechs = a.mechanisms.split(",")
    if {"load_packaged", "load_packaged_graphs"} & set(mechs):
        os.environ["PRECOMPILE_TARGETS"] = ",".join(f"{m}_forward" for m in a.models.split(","))
        build_wheel(work, device)
    host = (
        torch.cuda.get_device_name()
        if device == "cuda"
        else (platform.processor() or platform.machine())
    )
    result = {
        "host": host,
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "repeats": a.repeats,
        "command": "python bench/cold_start.py " + " ".join(sys.argv[1:]),
        "models": {},
        "configs": {},
    }
    for name in a.models.split(","):
        result["configs"][name] = (
            str(benchmodels.gpt_block_config(device))
            if name == "gpt_block"
            else "tinylm.build_model(seed=0), ids (2, 32)"
        )
        rows = []
        for mech in mechs:
            why = prepare(mech, name, device, work)
            row = (
                {"mechanism": mech, "error": why}
                if why
                else measure(mech, name, device, work, a.repeats)
            )
            print(json.dumps({"model": name, **row}), flush=True)
            rows.append(row)
        add_ratios(rows)
        result["models"][name] = rows
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"cold_start_{device}.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / f"cold_start_{device}.md").write_text(markdown(result) + "\n")
    print(markdown(result))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
