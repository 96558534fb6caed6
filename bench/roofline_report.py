"""The roofline bench's output (bench/roofline.py): its Markdown table from the
results JSON; :func:`write_md` keeps a results file's hand-written notes across
rewrites (bench/llama_cold.py's too)."""

from __future__ import annotations

from pathlib import Path

MECHANISMS = (
    "eager",
    "torch.compile",
    "torch.compile max-autotune-no-cudagraphs",
    "torch.compile max-autotune",
    "load_packaged",
    "load_packaged max-autotune",
    "load_packaged max-autotune + graphs",
)


def _cell(m: dict | None) -> str:
    if not m:
        return "-"
    if "ms" not in m:
        return "skipped" if "budget" in m.get("error", "") else "FAILED"
    return f"{m['ms']:.3f} ({m['vs_floor']:.2f}x)"


def markdown(doc: dict) -> str:
    names = list(
        dict.fromkeys(
            [*MECHANISMS, *(n for r in doc["rows"].values() for n in r.get("mechanisms", {}))]
        )
    )
    commands = list(dict.fromkeys(r.get("argv") or doc["argv"] for r in doc["rows"].values())) or [
        doc["argv"]
    ]
    lines = [
        "# Roofline: each mechanism against the floor",
        "",
        ", ".join(f"`python bench/roofline.py {c}`" for c in commands)
        + f" (a row per command's rows): "
        f"torch {doc['torch']}, {doc['device_name']}; one process, "
        f"mechanisms interleaved, median of {doc['rounds']} rounds; ms per call (x the row's floor).",
        "",
        f"Floor: max(bytes / {doc['bandwidth'] / 1e12:.1f} TB/s, FLOPs / {doc['peak'] / 1e12:.0f} TFLOP/s) "
        f"({doc['source']}){' (the H200 figures, not this CPU)' if doc['device'] != 'cuda' else ''}. Bytes: "
        "the weights read once (the embedding: the gathered rows), inputs read, results written (decode: "
        "the KV cache of the context read); FLOPs: the matrix products and the attention (causal prefill: "
        "half). Max-autotune compiles: torch.compile `max-autotune-no-cudagraphs` (decode rows also "
        '`max-autotune`, with Inductor\'s CUDA graphs); the pairs: `mode = "max-autotune"`, loaded with '
        "load_packaged (decode rows also with `cuda_graphs=True`).",
        "",
        "| row | shape | floor ms (memory / compute) | " + " | ".join(names) + " |",
        "|" + "---|" * (3 + len(names)),
    ]
    for key, r in doc["rows"].items():
        if "error" in r:
            lines.append(f"| {key} | FAILED: {r['error'][:200]} |" + " |" * (1 + len(names)))
            continue
        lines.append(
            f"| {key} | {r['shape']} | {r['floor_ms']:.3f} ({r['memory_ms']:.3f} / {r['compute_ms']:.3f}) | "
            + " | ".join(_cell(r["mechanisms"].get(m)) for m in names)
            + " |"
        )
    lines += [
        "",
        "Seconds in this warm process (torch.compile: its first call; load_packaged: capture, then its "
        "first call) and max |result - eager| (decode rows: the logits the step wrote):",
        "",
        "| row | mechanism | seconds | max abs err | calls x rounds | round spread |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in doc["rows"].items():
        for name, m in r.get("mechanisms", {}).items():
            secs = " + ".join(f"{m[k]:.1f}" for k in ("capture_s", "first_call_s") if k in m) or "-"
            if "error" in m:
                lines.append(f"| {key} | {name} | {m['error'][:160]} | | | |")
                continue
            lines.append(
                f"| {key} | {name} | {secs} | {m.get('max_abs_err', float('nan')):.3g} | "
                f"{m.get('calls', '-')} x {len(m.get('rounds_ms', []))} | {m.get('spread', 0):.0%} |"
            )
    profiled = [
        (key, name, m["kernels"])
        for key, r in doc["rows"].items()
        for name, m in r.get("mechanisms", {}).items()
        if m.get("kernels")
    ]
    if profiled:
        lines += [
            "",
            "Kernels (`--kernels`: torch.profiler over that many calls after the timing; kernel ms per "
            "call against the call's ms, launches per call, the three longest):",
            "",
        ]
        for key, name, k in profiled:
            ms = doc["rows"][key]["mechanisms"][name]["ms"]
            lines.append(
                f"- {key}, {name}: {k['kernel_ms']:.3f} of {ms:.3f} ms, {k['kernels']:.0f} kernels; "
                + "; ".join(f"`{t[2][:70]}` {t[0]:.3f} ms x{t[1]:.0f}" for t in k["top"][:3])
            )
    lines += ["", "Issue 39's targets, where both sides were measured:", ""]
    for key, r in doc["rows"].items():
        ms = {n: m["ms"] for n, m in r.get("mechanisms", {}).items() if "ms" in m}
        if "prefill" in key and "load_packaged max-autotune" in ms:
            for other, limit in (
                ("torch.compile max-autotune-no-cudagraphs", 1.0),
                ("torch.compile", 0.9),
            ):
                if other in ms:
                    ratio = ms["load_packaged max-autotune"] / ms[other]
                    lines.append(
                        f"- {key}: load_packaged max-autotune / {other} = {ratio:.2f}x "
                        f"(target <= {limit}x: {'met' if ratio <= limit else 'not met'})"
                    )
        if "decode_b1" in key and "load_packaged max-autotune + graphs" in ms:
            ratio = ms["load_packaged max-autotune + graphs"] / r["memory_ms"]
            lines.append(
                f"- {key}: load_packaged max-autotune + graphs / weight-read floor = {ratio:.2f}x "
                f"(target <= 1.15x: {'met' if ratio <= 1.15 else 'not met'})"
            )
    return "\n".join(lines) + "\n"


NOTES = "<!-- notes: kept when the table above is written again -->"


def write_md(path: Path, text: str) -> None:
    """``path`` := ``text`` (a results table), followed by what an existing file has
    after :data:`NOTES` (a run's notes, written by hand)."""
    old = path.read_text() if path.exists() else ""
    notes = old[old.index(NOTES) :] if NOTES in old else ""
    path.write_text(text + ("\n" + notes if notes else ""))
