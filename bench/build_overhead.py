"""Build overhead: a wheel build against the bare captures it runs (a measurement, not a test).

Usage::

    PYTHONPATH=.:runtime /tmp/v213/bin/python bench/build_overhead.py [--project example_project]

In one run, on a copy of the project (so nothing is written into the source tree):

(a) ``bare``: each capture script run directly, one after the other, with the
    environment the runner gives it (PRECOMPILE_* paths and device,
    CUDA_VISIBLE_DEVICES, the target's ``env``, the project on PYTHONPATH); the sum.
(b) ``build_nocache``: ``python -m build --no-isolation --wheel`` with
    ``PRECOMPILE_CACHE=off`` (``jobs`` as configured: auto).
(c) ``build_cache_first``: the same with the cache on and an empty cache directory,
    then ``build_cache_rebuild``: again with nothing changed (every target reused).

``--repeat N`` runs N interleaved rounds and reports each measurement's minimum.

(a) and each build start from EMPTY Inductor and Triton cache directories (one per
measurement, shared by its targets as within a build), so no measurement profits
from an earlier one's compiled kernels. Ratios: (b)/(a)
(target <= 1.10) and rebuild/first (target <= 0.10). Writes
``bench/results/build_overhead_<device>.{json,md}``. Wall times are this host's,
one run each; targets left out on this host (a ``cuda`` target without a GPU) are
listed and not run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:0] = [str(REPO), str(REPO / "runtime")]

from precompile_build.builder.runner import cuda_available, gpu_ids, resolve_device  # noqa: E402
from precompile_build.builder.slots import cpu_limit  # noqa: E402
from precompile_build.config.settings import load_settings  # noqa: E402

_IGNORE = shutil.ignore_patterns("build", "dist", "*.egg-info", "_precompiled", "__pycache__")


def _env(tmp: Path, tag: str, extra: dict) -> dict:
    """os.environ + PYTHONPATH (repo, runtime) + fresh Inductor/Triton caches + extra."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(
        p
        for p in (
            extra.get("PYTHONPATH"),
            str(REPO),
            str(REPO / "runtime"),
            os.environ.get("PYTHONPATH"),
        )
        if p
    )
    env["TORCHINDUCTOR_CACHE_DIR"] = str(tmp / f"inductor-{tag}")
    env["TRITON_CACHE_DIR"] = str(tmp / f"triton-{tag}")
    return env


def _timed(cmd: list, cwd: Path, env: dict, what: str) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(
            f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return seconds, proc.stderr


def bare_captures(proj: Path, tmp: Path) -> tuple[dict, list]:
    """(a): seconds per target run directly; and the targets left out on this host."""
    settings = load_settings(proj, {}, {})
    times, left_out = {}, []
    for name in settings.selected:
        t = settings.targets[name]
        device = resolve_device(t.device)
        if device is None:
            left_out.append(name)
            continue
        out = tmp / "bare" / name
        out.mkdir(parents=True)
        extra = dict(
            t.env,
            PYTHONPATH=str(proj),
            PRECOMPILE_TARGET=name,
            PRECOMPILE_ARTIFACT_PATH=str(out / f"{name}.py"),
            PRECOMPILE_CACHE_PATH=str(out / f"{name}.cache"),
            PRECOMPILE_DEVICE=device,
            CUDA_VISIBLE_DEVICES="" if device == "cpu" else (gpu_ids() or ["0"])[0],
        )
        times[name], _ = _timed(
            [sys.executable, str(t.script), *t.args],
            proj,
            _env(tmp, "bare", extra),
            f"bare capture {name}",
        )
        print(f"(a) bare {name} on {device}: {times[name]:.1f} s", flush=True)
    return times, left_out


def wheel_build(proj: Path, tmp: Path, tag: str, extra: dict) -> tuple[float, str]:
    cmd = [
        sys.executable,
        "-m",
        "build",
        "--no-isolation",
        "--skip-dependency-check",
        "--wheel",
        "--outdir",
        str(tmp / f"dist-{tag}"),
        str(proj),
    ]
    seconds, err = _timed(cmd, proj, _env(tmp, tag, extra), f"build {tag}")
    shutil.rmtree(proj / "build", ignore_errors=True)
    print(f"{tag}: {seconds:.1f} s", flush=True)
    return seconds, err


def _round(project: str, i: int) -> dict:
    """One round of every measurement, in a fresh copy of the project."""
    with tempfile.TemporaryDirectory(prefix="bench-build-") as d:
        tmp = Path(d)
        proj = tmp / "proj"
        shutil.copytree(project, proj, ignore=_IGNORE)
        print(f"round {i + 1}", flush=True)
        bare, left_out = bare_captures(proj, tmp)
        b, _ = wheel_build(proj, tmp, "build_nocache", {"PRECOMPILE_CACHE": "off"})
        cache = {"PRECOMPILE_CACHE": "on", "PRECOMPILE_BUILD_CACHE_DIR": str(tmp / "cache")}
        c1, err1 = wheel_build(proj, tmp, "build_cache_first", cache)
        c2, err2 = wheel_build(proj, tmp, "build_cache_rebuild", cache)
    if err2.count("reused (key") != len(bare) or err1.count("captured (why: no entry)") != len(
        bare
    ):
        sys.exit(f"expected {len(bare)} captured then reused targets:\n{err1}\n{err2}")
    return {"bare": bare, "left_out": left_out, "b": b, "c1": c1, "c2": c2}


def _host() -> dict:
    import torch

    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in open("/proc/cpuinfo")
            if ln.startswith("model name")
        ),
        platform.processor(),
    )
    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else []
    )
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "gpus": gpus,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--project", default=str(REPO / "example_project"))
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of (a), (b), first, rebuild, interleaved; the minimum "
        "of each is reported (a shared host's noise only adds time)",
    )
    args = ap.parse_args()
    device = "cuda" if cuda_available() else "cpu"
    rounds = [_round(args.project, i) for i in range(args.repeat)]
    bare = {n: min(r["bare"][n] for r in rounds) for n in rounds[0]["bare"]}
    left_out = rounds[0]["left_out"]
    a = sum(bare.values())
    b, c1, c2 = (min(r[k] for r in rounds) for k in ("b", "c1", "c2"))
    gpus = len(gpu_ids())
    doc = {
        "device": device,
        "host": _host(),
        "project": Path(args.project).name,
        "targets": sorted(bare),
        "left_out": left_out,
        "jobs": {"setting": "auto", "gpus": gpus, "cpu_captures_at_once": cpu_limit(None)},
        "seconds": {
            "bare_per_target": {k: round(v, 2) for k, v in bare.items()},
            "a_bare_sum": round(a, 2),
            "b_build_nocache": round(b, 2),
            "build_cache_first": round(c1, 2),
            "c_build_cache_rebuild": round(c2, 2),
        },
        "ratios": {"b_over_a": round(b / a, 3), "rebuild_over_first": round(c2 / c1, 3)},
        "rounds": [
            {
                k: (round(v, 2) if isinstance(v, float) else {n: round(x, 2) for n, x in v.items()})
                for k, v in r.items()
                if k != "left_out"
            }
            for r in rounds
        ],
        "targets_ratio": {"b_over_a": 1.10, "rebuild_over_first": 0.10},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"build_overhead_{device}.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"build_overhead_{device}.md").write_text(_markdown(doc))
    print(_markdown(doc))


def _markdown(doc: dict) -> str:
    s, r, h = doc["seconds"], doc["ratios"], doc["host"]
    ok = lambda v, t: "meets" if v <= t else "MISSES"  # noqa: E731
    rows = [f"| (a) bare captures, sum ({', '.join(doc['targets'])}) | {s['a_bare_sum']:.1f} |"]
    rows += [f"| &nbsp;&nbsp;{k} | {v:.1f} |" for k, v in s["bare_per_target"].items()]
    rows += [
        f"| (b) `python -m build --no-isolation --wheel`, cache off | {s['b_build_nocache']:.1f} |",
        f"| first build, cache on (empty cache) | {s['build_cache_first']:.1f} |",
        f"| (c) rebuild, nothing changed, cache on | {s['c_build_cache_rebuild']:.1f} |",
    ]
    gpus = ", ".join(h["gpus"]) or "none"
    return "\n".join(
        [
            f"# Build overhead: {doc['project']} on {doc['device']}",
            "",
            f"torch {h['torch']}, Python {h['python']}, {h['platform']}; CPU {h['cpu']} "
            f'({h["cpu_count"]} cores); GPUs: {gpus}. `jobs = "auto"`: '
            f"{doc['jobs']['cpu_captures_at_once']} CPU capture(s) at once, "
            f"{doc['jobs']['gpus']} GPU(s). Left out on this host: "
            f"{', '.join(doc['left_out']) or 'none'}.",
            "",
            f"Generated by `bench/build_overhead.py --repeat {len(doc['rounds'])}`: the minimum "
            "over interleaved rounds (raw values in the .json); empty Inductor/Triton caches "
            "at the start of (a) and of each build.",
            "",
            "| measurement | seconds |",
            "| --- | ---: |",
            *rows,
            "",
            "| ratio | value | target |",
            "| --- | ---: | ---: |",
            f"| (b) / (a): build overhead | {r['b_over_a']:.3f} | <= 1.10 "
            f"({ok(r['b_over_a'], 1.10)}) |",
            f"| (c) / first: no-change rebuild | {r['rebuild_over_first']:.3f} | <= 0.10 "
            f"({ok(r['rebuild_over_first'], 0.10)}) |",
            "",
        ]
    )


if __name__ == "__main__":
    main()
