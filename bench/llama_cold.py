"""Cold starts at real size: a Llama's capture time against
torch.compile cold, and its first result from the wheel's pair against eager's.

    python bench/llama_cold.py --sizes 8b,1b --out bench/results/llama_cold_h200
    python bench/llama_cold.py --sizes 1b --capture-modes max-autotune --first-runs 0 --out ...
    LLAMA_BENCH_DEVICE=cpu LLAMA_BENCH_DTYPE=float32 LLAMA_BENCH_TOKENS=8 \\
        python bench/llama_cold.py --sizes tiny --first-runs 2 --out /tmp/cold        # a CPU smoke test

bench/scale_llama.py's model (transformers ``LlamaForCausalLM``, random bf16 weights made
on the GPU, ``forward(model, ids) -> logits`` of 1 x 128 tokens); every step below is one
of its workers, a fresh process with empty Inductor, Triton and precompile caches:

1. **Capture time**, for each of ``--capture-modes``: the frozen engine's capture
   (``capture``: from the model built to the pair written, the validation included;
   ``max-autotune``: ``options={"mode": "max-autotune"}``, its autotuning seconds
   reported) and torch.compile cold (``compile``: from the model built to the first
   synchronized result; for ``max-autotune``, ``mode="max-autotune-no-cudagraphs"``: the
   same autotuned kernels without CUDA graphs, as the captured pair serves by default),
   ``--capture-runs`` of each, the order alternating; the ratio of their medians.
   Inductor's own parallelism applies to both the same way (its compile workers; for
   max-autotune, its benchmarking as configured in this torch).
2. **First result**: the ``default`` pair packaged as a wheel has it, byte-compiled as
   ``pip install`` does (``--no-compile``: not, as ``uv pip install`` without
   ``--compile-bytecode`` leaves it, with only the pyc the build ships beside the source
   half, precompile_build/wheels/bytecode.py); one ``load``
   process run and dropped (the first process after a build is slower for every
   mechanism: files and the driver's caches are cold), then ``--first-runs`` rounds of
   ``load`` (``load_packaged`` under ``PRECOMPILE_NO_COMPILE=1``) and ``eager``, the
   order alternating; their medians and ratio (the target: <= 0.9x). First result: from
   "model and inputs exist" to the first synchronized result. Then one ``profile``
   process: where the load's and first call's seconds go (the JSON's ``profile``).

``--budget-s`` starts no new process after that many seconds; results are written after
every process to ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import scale_llama  # noqa: E402 - bench/ on the path first
from roofline_report import write_md  # noqa: E402

COMPILE_MODE = {"default": None, "max-autotune": "max-autotune-no-cudagraphs"}
START = time.monotonic()


def _median(rows: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rows if key in r]
    return statistics.median(vals) if vals else None


def capture_times(size: str, mode: str, runs: int, work: Path, budget: float, log) -> dict:
    """``{"capture": [rows], "compile": [rows], "ratio": median capture_s / median
    compile first_result_s}`` for ``mode`` (a key of :data:`COMPILE_MODE`)."""
    env_capture = {"LLAMA_BENCH_CAPTURE_MODE": mode} if mode != "default" else {}
    env_compile = {"LLAMA_BENCH_COMPILE_MODE": COMPILE_MODE[mode]} if COMPILE_MODE[mode] else {}
    out: dict = {"capture": [], "compile": []}
    for i in range(runs):
        order = ("capture", "compile") if i % 2 == 0 else ("compile", "capture")
        for step in order:
            if time.monotonic() - START > budget:
                out["skipped"] = "time budget"
                break
            r = scale_llama.run_worker(
                step, size, work, None, env_capture if step == "capture" else env_compile
            )
            out[step].append(r)
            log(
                f"{size} {mode} {step}: "
                + json.dumps(
                    {
                        k: v
                        for k, v in r.items()
                        if k
                        in (
                            "capture_s",
                            "first_result_s",
                            "compile_s",
                            "autotune_s",
                            "validate_s",
                            "trace_s",
                            "error",
                        )
                    }
                )[:400]
            )
    cap, comp = _median(out["capture"], "capture_s"), _median(out["compile"], "first_result_s")
    if cap is not None and comp:
        out["ratio"] = cap / comp
    return out


def first_results(
    size: str, runs: int, work: Path, budget: float, log, bytecode: bool = True
) -> dict:
    """``{"dropped": row, "load": [rows], "eager": [rows], "ratio": median load /
    median eager, "profile": row, "bytecode": bytecode}`` from the pair of ``work``
    (packaged first; ``bytecode``: byte-compiled as pip does)."""
    import compileall

    scale_llama._package(work, f"llama_{size.replace('.', '_')}")
    if bytecode:
        for f in sorted((work / "site" / scale_llama.PACKAGE).rglob("*.py")):
            compileall.compile_file(
                str(f), force=True, quiet=1
            )  # pip's own call for a wheel's .py files
    out: dict = {"load": [], "eager": [], "bytecode": bytecode, "shipped_pyc": True}
    out["dropped"] = scale_llama.run_worker("load", size, work, None)
    log(
        f"{size} load (dropped: the first process after the build): {out['dropped'].get('first_result_s')}"
    )
    for i in range(runs):
        for step in ("eager", "load") if i % 2 == 0 else ("load", "eager"):
            if time.monotonic() - START > budget:
                out["skipped"] = "time budget"
                break
            r = scale_llama.run_worker(step, size, work, None)
            out[step].append(r)
            log(
                f"{size} {step}: "
                + json.dumps(
                    {
                        k: v
                        for k, v in r.items()
                        if k
                        in (
                            "first_result_s",
                            "load_s",
                            "first_call_s",
                            "compiler_modules_imported",
                            "max_abs_vs_eager",
                            "error",
                        )
                    }
                )[:400]
            )
    ld, ea = _median(out["load"], "first_result_s"), _median(out["eager"], "first_result_s")
    if ld is not None and ea:
        out["ratio"] = ld / ea
    if time.monotonic() - START < budget:
        out["profile"] = scale_llama.run_worker("profile", size, work, None).get("profile")
    return out


def merge(docs: list[dict]) -> dict:
    """One result document of several runs' (``--merge``): per size and capture mode the
    capture and compile runs of all, their ratio again; a size's first results (``firsts``,
    by how the package was installed: :func:`installed`) from the last run that has them;
    ``argv``: every run's command."""
    out: dict = {
        "argv": "; ".join(dict.fromkeys(d["argv"] for d in docs)),
        "torch": docs[-1]["torch"],
        "gpu": docs[-1]["gpu"],
        "sizes": {},
    }
    for d in docs:
        for size, r in d["sizes"].items():
            into = out["sizes"].setdefault(size, {"capture": {}})
            for mode, c in r.get("capture", {}).items():
                m = into["capture"].setdefault(mode, {"capture": [], "compile": []})
                m["capture"] += c.get("capture", [])
                m["compile"] += c.get("compile", [])
                cap, comp = (
                    _median(m["capture"], "capture_s"),
                    _median(m["compile"], "first_result_s"),
                )
                m.pop("ratio", None)
                if cap is not None and comp:
                    m["ratio"] = cap / comp
            for f in _firsts(r):
                into.setdefault("firsts", {})[installed(f)] = f
    return out


def installed(first: dict) -> str:
    """How a first-result run's package was installed (runs before the build shipped a
    pyc beside the source half carry no ``shipped_pyc``)."""
    if first.get("bytecode"):
        return "byte-compiled (pip)"
    if first.get("bytecode") is False:
        return (
            "not byte-compiled (uv's default): the build's pyc"
            if first.get("shipped_pyc")
            else "no bytecode (uv's default, a build that shipped none)"
        )
    return "-"


def _firsts(size_doc: dict) -> list[dict]:
    """A size's first-result runs: one run's ``first``, or a merged document's ``firsts``."""
    if "firsts" in size_doc:
        return list(size_doc["firsts"].values())
    return [size_doc["first"]] if size_doc.get("first") else []


def _fmt(v, unit: str = "") -> str:
    return "-" if v is None else f"{v:.2f}{unit}"


def _runs(rows: list[dict]) -> str:
    return ", ".join(f"{x['first_result_s']:.2f}" for x in rows if "first_result_s" in x)


def markdown(doc: dict) -> str:
    lines = [
        "# Cold starts of a Llama: capture time and first result",
        "",
        ", ".join(
            f"`{c if 'python ' in c else 'python bench/llama_cold.py ' + c}`"
            for c in doc["argv"].split("; ")
        )
        + f": torch {doc['torch']}, {doc['gpu']}; every step a "
        "fresh process with empty caches (bench/llama_cold.py's docstring says what each counts).",
        "",
        "| size | mode | capture s (runs) | of it autotuning s | torch.compile cold s (runs) | capture / compile |",
        "|---|---|---|---|---|---|",
    ]
    for size, r in doc["sizes"].items():
        for mode, c in r.get("capture", {}).items():
            caps = [x["capture_s"] for x in c["capture"] if "capture_s" in x]
            comps = [x["first_result_s"] for x in c["compile"] if "first_result_s" in x]
            errs = [
                x["error"].strip().splitlines()[-1][:160]
                for x in c["capture"] + c["compile"]
                if "error" in x
            ]
            lines.append(
                f"| {size} | {mode} | {_fmt(_median(c['capture'], 'capture_s'))} "
                f"({', '.join(f'{x:.1f}' for x in caps)}) | {_fmt(_median(c['capture'], 'autotune_s'))} | "
                f"{_fmt(_median(c['compile'], 'first_result_s'))} ({', '.join(f'{x:.1f}' for x in comps)}) | "
                f"{_fmt(c.get('ratio'), 'x')}{' FAILED: ' + '; '.join(errs) if errs else ''} |"
            )
    lines += [
        "",
        "| size | installed | first result s: load_packaged (runs) | load + first call (medians) | "
        "eager (runs) | load_packaged / eager | dropped first process | compiler modules the load imported |",
        "|---|---|---|---|---|---|---|---|",
    ]
    profiles: list[str] = []  # below the table
    for size, r in doc["sizes"].items():
        for f in _firsts(r):
            ld, ea = f["load"], f["eager"]
            mods = sorted({m for x in ld for m in x.get("compiler_modules_imported", [])})
            how = installed(f)
            lines.append(
                f"| {size} | {how} | {_fmt(_median(ld, 'first_result_s'))} "
                f"({_runs(ld)}) | "
                f"{_fmt(_median(ld, 'load_s'))} + {_fmt(_median(ld, 'first_call_s'))} | "
                f"{_fmt(_median(ea, 'first_result_s'))} "
                f"({_runs(ea)}) | "
                f"{_fmt(f.get('ratio'), 'x')} | load {_fmt(f['dropped'].get('first_result_s'))} | "
                f"{len(mods)}{': ' + ', '.join(mods[:5]) if mods else ''} |"
            )
            if f.get("profile"):
                top = [p for p in f["profile"] if "fn" in p][:8]
                profiles += [
                    "",
                    f"{size}, {how}, where load + first call's seconds go (cProfile, cumulative "
                    "s, profiled process): "
                    + "; ".join(f"`{p['fn']}` {p['cum_s']:.3f}" for p in top),
                ]
    return "\n".join(lines + profiles) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--sizes", default="8b,1b", help=f"comma-separated, of {', '.join(scale_llama.SIZES)}"
    )
    p.add_argument(
        "--capture-modes", default="default", help=f"comma-separated, of {', '.join(COMPILE_MODE)}"
    )
    p.add_argument(
        "--capture-runs", type=int, default=1, help="captures (and torch.compile colds) per mode"
    )
    p.add_argument("--first-runs", type=int, default=5, help="rounds of load and eager (0: none)")
    p.add_argument(
        "--budget-s", type=float, default=540.0, help="start no new process after this many seconds"
    )
    p.add_argument(
        "--no-compile",
        action="store_true",
        help="first results without the bytecode pip writes at install (uv's default: the build's "
        "shipped pyc only)",
    )
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="only combine these result files into --out: each size's runs added up, in order",
    )
    a = p.parse_args(argv)
    if a.capture_runs < 1 or a.first_runs < 0:
        p.error("--capture-runs takes 1 or more, --first-runs 0 or more")
    if a.merge:
        docs = []
        for f in a.merge:
            try:
                docs.append(json.loads(Path(f).read_text()))
            except (OSError, json.JSONDecodeError) as e:
                p.error(f"--merge {f}: not a results file of this bench ({e})")
            if (
                not isinstance(docs[-1], dict)
                or not {"argv", "torch", "gpu", "sizes"} <= docs[-1].keys()
            ):
                p.error(f"--merge {f}: not a results file of this bench (no argv/torch/gpu/sizes)")
        merged = merge(docs)
        Path(a.out).with_suffix(".json").write_text(json.dumps(merged, indent=1) + "\n")
        write_md(Path(a.out).with_suffix(".md"), markdown(merged))
        return 0
    sizes = [s for s in a.sizes.split(",") if s]
    modes = [m for m in a.capture_modes.split(",") if m]
    bad = [s for s in sizes if s not in scale_llama.SIZES] + [
        m for m in modes if m not in COMPILE_MODE
    ]
    if bad:
        p.error(f"unknown size(s) or mode(s) {bad}")
    import torch

    cuda = scale_llama._device() == "cuda"
    doc = {
        "argv": " ".join(argv if argv is not None else sys.argv[1:]),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if cuda else "cpu",
        "sizes": {},
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        write_md(out.with_suffix(".md"), markdown(doc))

    def log(line: str):
        print(f"[{time.monotonic() - START:6.0f} s] {line}", flush=True)

    with tempfile.TemporaryDirectory(prefix="llama-cold-") as tmp:
        for size in sizes:
            r = doc["sizes"][size] = {"capture": {}}
            for mode in modes:
                work = Path(tmp) / size / mode
                work.mkdir(parents=True)
                r["capture"][mode] = capture_times(
                    size, mode, a.capture_runs, work, a.budget_s, log
                )
                save()
            made = r["capture"].get("default", {}).get("capture", [])
            if (
                a.first_runs
                and made
                and "error" not in made[-1]
                and time.monotonic() - START < a.budget_s
            ):
                r["first"] = first_results(
                    size,
                    a.first_runs,
                    Path(tmp) / size / "default",
                    a.budget_s,
                    log,
                    bytecode=not a.no_compile,
                )
                save()
    save()
    print(markdown(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
