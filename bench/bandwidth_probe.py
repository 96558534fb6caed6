"""What this GPU's memory streams at, against a Llama decode step's weight-read floor
(the target: the 8B step at batch 1 under CUDA graphs <= 1.15x its floor).

    python bench/bandwidth_probe.py --size 8b --out /tmp/bandwidth_h200
    PYTHONPATH=bench python bench/bandwidth_probe.py --device cpu --size tiny --out /tmp/b   # a smoke run

bench/roofline.py's floor divides the bytes a step must read by the datasheet's 4.8 TB/s.
This says how near any kernel gets on the machine at hand, with no model around it:

- ``stream``: one read of a large bf16 tensor (``torch.sum``) and one copy (read and
  write counted), ms and TB/s;
- ``chain``: the step's matrix products alone (bench/scale_llama.py's ``SIZE`` shapes,
  every layer's q, k, v, o, gate, up and down weights and the lm_head, each its own
  tensor, ``F.linear`` at batch ``--batch``: cuBLAS), replayed as one CUDA graph: the
  time a step spends in cuBLAS's matrix-vector products when nothing else runs and no
  launch gap shows; ``fused`` does the same with q, k, v as one weight and gate, up as
  one (4 products a layer instead of 7);
- ``per_shape``: each distinct weight shape, its ``layers`` weights one after another,
  cuBLAS's kernel time per product from torch.profiler, ms and TB/s; ``--inductor`` adds
  Inductor's (``torch.compile`` ``max-autotune-no-cudagraphs``, which at batch 1 decomposes
  a product into a coordinate-descent-tuned reduction, the pairs' kernels): a compile per
  shape, minutes in all (on the H200 it did not end within the 300 s the GPU script
  gives it; bench/roofline.py ``--kernels`` profiles the same kernels inside the step).

All weights are distinct tensors, so no product reads another's from L2 (50 MB on an
H200). Results: ``<out>.json`` and ``<out>.md`` (notes below the marker kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from roofline_report import write_md  # noqa: E402 - bench/ on the path first

DATASHEET = 4.8e12  # bytes/s: bench/roofline.py's BANDWIDTH (NVIDIA H200 datasheet)


def _timed(fn, device: str, reps: int) -> float:
    """Median ms of ``fn()`` over ``reps`` synchronized calls (after 3 warm ones)."""
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _graphed(fn, device: str):
    """``fn`` as one CUDA graph's replay (CUDA), else ``fn``."""
    import torch

    if device != "cuda":
        return fn
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def _row(name: str, ms: float, nbytes: int) -> dict:
    return {
        "name": name,
        "ms": round(ms, 4),
        "bytes": nbytes,
        "tb_s": round(nbytes / (ms / 1e3) / 1e12, 3),
        "of_datasheet": round(nbytes / (ms / 1e3) / DATASHEET, 3),
    }


def stream(device: str, nbytes: int, reps: int) -> list[dict]:
    """A read (``sum``) and a copy of ``nbytes`` bytes of bf16."""
    import torch

    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    y = torch.empty_like(x)
    return [
        _row("stream read (sum)", _timed(lambda: x.sum(), device, reps), nbytes),
        _row("stream copy (read + write)", _timed(lambda: y.copy_(x), device, reps), 2 * nbytes),
    ]


def _shapes(size: str, fused: bool) -> tuple[list[tuple[int, int]], int, int]:
    """([(out, in) of one layer's weights], layers, vocab) for scale_llama's ``size``."""
    import scale_llama

    c = scale_llama.SIZES[size]
    h, inter, kv = (
        c["hidden_size"],
        c["intermediate_size"],
        c["num_key_value_heads"] * c["hidden_size"] // c["num_attention_heads"],
    )
    layer = (
        [(h + 2 * kv, h), (h, h), (2 * inter, h), (h, inter)]
        if fused
        else [(h, h), (kv, h), (kv, h), (h, h), (inter, h), (inter, h), (h, inter)]
    )
    return layer, c["num_hidden_layers"], c.get("vocab_size", 128256)


def chain(device: str, size: str, batch: int, fused: bool, reps: int) -> dict:
    """The decode step's matrix products alone, cuBLAS, one graph replay."""
    import torch
    import torch.nn.functional as F

    layer, layers, vocab = _shapes(size, fused)
    h = layer[0][1]
    weights = [
        torch.randn(o, i, dtype=torch.bfloat16, device=device)
        for _ in range(layers)
        for o, i in layer
    ]
    weights.append(torch.randn(vocab, h, dtype=torch.bfloat16, device=device))
    inputs = {i: torch.randn(batch, i, dtype=torch.bfloat16, device=device) for _, i in layer}

    def step():
        for w in weights:
            F.linear(inputs[w.shape[1]], w)

    nbytes = sum(w.numel() * 2 for w in weights)
    ms = _timed(_graphed(step, device), device, reps)
    weights.clear()  # the next measurement's memory
    label = "q k v, gate up fused" if fused else "7 products a layer"
    return _row(
        f"{size} step's products, cuBLAS, one graph ({label}; {len(layer) * layers + 1} products)",
        ms,
        nbytes,
    )


def _kernel_ms(fn, device: str, calls: int) -> float:
    """Kernel ms per ``fn()`` (CUDA: torch.profiler's kernel self time; CPU: wall)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if device != "cuda":
        return _timed(fn, device, calls)
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return (
        sum(e.self_device_time_total for e in prof.key_averages() if e.device_type.name == "CUDA")
        / calls
        / 1e3
    )


def per_shape(device: str, size: str, batch: int, calls: int, inductor: bool) -> list[dict]:
    """Each distinct weight shape: cuBLAS's kernel per product (``inductor``: and Inductor's)."""
    import torch
    import torch.nn.functional as F

    layer, layers, vocab = _shapes(size, False)
    rows = []
    for o, i in sorted(set(layer)) + [(vocab, layer[0][1])]:
        n = layers if o != vocab else 4
        ws = [torch.randn(o, i, dtype=torch.bfloat16, device=device) for _ in range(n)]
        x = torch.randn(batch, i, dtype=torch.bfloat16, device=device)

        def products(x, ws=ws):
            return [F.linear(x, w) for w in ws]

        nbytes = o * i * 2
        lib = "cuBLAS" if device == "cuda" else "ATen"
        rows.append(
            _row(f"{o}x{i}, {lib}", _kernel_ms(lambda x=x: products(x), device, calls) / n, nbytes)
        )
        if not inductor:
            continue
        try:
            torch._dynamo.reset()
            compiled = torch.compile(products, mode="max-autotune-no-cudagraphs")
            rows.append(
                _row(
                    f"{o}x{i}, Inductor max-autotune",
                    _kernel_ms(lambda f=compiled, x=x: f(x), device, calls) / n,
                    nbytes,
                )
            )
        except Exception as e:  # noqa: BLE001 - reported in the table
            rows.append(
                {
                    "name": f"{o}x{i}, Inductor max-autotune",
                    "error": f"{type(e).__name__}: {str(e)[:200]}",
                }
            )
        ws.clear()
    return rows


def write(doc: dict, out: Path) -> None:
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        "# Memory bandwidth probe",
        "",
        f"`{doc['argv']}`: torch {doc['torch']}, {doc['device_name']}; "
        f"TB/s and its ratio to the datasheet's {DATASHEET / 1e12:.1f} TB/s.",
        "",
        "| what | ms | bytes | TB/s | of datasheet |",
        "|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} | | | |")
        else:
            lines.append(
                f"| {r['name']} | {r['ms']:.4f} | {r['bytes'] / 1e9:.3f} GB | {r['tb_s']:.3f} | "
                f"{r['of_datasheet']:.2f} |"
            )
    write_md(out.with_suffix(".md"), "\n".join(lines) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--size", default="8b", help="bench/scale_llama.py's SIZES key")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--stream-bytes", type=int, default=4 << 30)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument(
        "--inductor", action="store_true", help="per shape, Inductor's kernels too (slow)"
    )
    p.add_argument("--out", type=Path, required=True, help="results: OUT.json and OUT.md")
    a = p.parse_args(argv)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "bench/bandwidth_probe.py: --device cuda needs a CUDA device (or pass --device cpu)"
        )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "argv": " ".join(["python bench/bandwidth_probe.py"] + (argv or sys.argv[1:])),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(0) if a.device == "cuda" else "cpu",
        "rows": [],
    }
    doc["rows"] += stream(a.device, a.stream_bytes, a.reps)
    write(doc, a.out)
    for fused in (False, True):
        doc["rows"].append(chain(a.device, a.size, a.batch, fused, a.reps))
        write(doc, a.out)
    doc["rows"] += per_shape(a.device, a.size, a.batch, a.reps, a.inductor)
    write(doc, a.out)
    print(a.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
