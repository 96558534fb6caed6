"""Roofline bench: every mechanism against the H200's floor, one process.

    python bench/roofline.py --out bench/results/roofline_h200            # all rows (see --budget-s)
    python bench/roofline.py --rows prefill_1x128,prefill_8x512 --sizes 8b --out ...
    PYTHONPATH=$PWD:$PWD/runtime python bench/roofline.py --device cpu --tiny --rows gpt_block,decode_b1 --out /tmp/r

Rows (``--rows``; the Llama rows for each of ``--sizes``, bench/scale_llama.py's
shapes, random bf16 weights):

- ``gpt_block``: bench/steady_state.py's ``gpt`` case: 4 pre-norm blocks, bf16,
  8 x 512 tokens, d 1024, 16 heads (the issue's GPT block);
- ``decode_block``: steady_state's ``decode`` case in bf16: 4 blocks, d 512, 1 token;
- ``prefill_1x128``, ``prefill_8x512``: ``LlamaForCausalLM(ids).logits`` (scale_llama's
  ``forward``) for batch x tokens;
- ``decode_b1``, ``decode_b8``: the whole greedy step of bench/decode_project.py
  (``greedy_step``: the logits of one token per row at context ``CONTEXT``, their
  argmax, the token and logits kept in device buffers, the position advanced), a
  transformers StaticCache of ``MAX_CACHE`` tokens.

Mechanisms, timed in this one process, interleaved (each round runs every mechanism
``calls`` times, synchronized, each round starting one mechanism later; the median
over ``--rounds`` rounds): ``eager``; ``torch.compile`` (default mode);
``torch.compile max-autotune-no-cudagraphs``; ``load_packaged`` and
``load_packaged max-autotune`` (the pair captured here by the frozen engine, default
and ``mode = "max-autotune"``, packaged as a wheel's ``_precompiled/`` and loaded
with ``precompile_runtime.load_packaged``; their warm-up calls run under
``precompile_runtime.no_compilation()``: compiling there raises). Decode rows on
CUDA add ``torch.compile max-autotune`` (Inductor's CUDA graphs; the step's mutated
buffers marked static) and ``load_packaged max-autotune + graphs``
(``cuda_graphs=True``).

Each row's floor is the larger of ``bytes / bandwidth`` and ``FLOPs / peak`` (below,
the H200's: :data:`SOURCE`), counted for what any implementation must do: bytes are
the weights read once (of the embedding only the rows gathered), the inputs read and
the results written (the logits; decode: the KV cache of the context read and one
token's written); FLOPs are the matrix products (2 x batch x tokens x weights) and
the attention's (causal prefill: half the square). Every mechanism's time is given
as a ratio to it. Compile and capture seconds are those of this warm process (the
mechanism that ran first paid the autotuning both max-autotune mechanisms share
through Inductor's cache); cold starts are bench/cold_start.py's and scale_llama.py's.

Diagnosis: ``--mechanisms`` runs only the named ones (the table's column names);
``--variant LABEL=JSON`` adds a pair captured with those capture options, served as
``load_packaged LABEL`` (decode rows on CUDA also ``+ graphs``), e.g. Inductor settings
against the ``max-autotune`` pair; ``--kernels CALLS`` (CUDA) profiles each mechanism's
kernels after the timing (bench/profile_kernels.py's ``kernel_times``: kernel ms per
call, launches, the longest kernels), to tell kernels' time from the gaps between them.

Results: ``<out>.json`` (rows merged into an existing file, so several commands
build one table; ``--fresh`` starts over; ``--merge A.json B.json`` combines files made
elsewhere) and ``<out>.md``. ``--budget-s`` (default
470) stops starting new mechanisms once that many seconds have passed: a command
under a 10-minute limit ends with what it measured (the rest marked skipped).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from roofline_report import MECHANISMS, markdown, write_md

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
START = time.monotonic()
BUDGET = 470.0  # --budget-s

BANDWIDTH = 4.8e12  # bytes/s
PEAK_BF16 = 989e12  # FLOP/s, dense
SOURCE = (
    "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: GPU memory bandwidth 4.8 TB/s; BF16 Tensor "
    "Core 1,979 TFLOPS with sparsity, so 989 TFLOPS dense"
)
ROWS = ("gpt_block", "decode_block", "prefill_1x128", "prefill_8x512", "decode_b1", "decode_b8")
LLAMA_ROWS = ROWS[2:]
CONTEXT = 512  # decode rows: tokens already in the cache when a step runs
MAX_CACHE = 640  # the static cache: CONTEXT + room for a round's steps
TINY = {"prefill_1x128": (1, 8), "prefill_8x512": (2, 16), "decode_b1": 1, "decode_b8": 2}
TINY_CONTEXT, TINY_CACHE = 8, 200


@dataclass
class Row:
    """One measured computation: ``fn(*args)``, its floor's counts, and how to read it."""

    key: str
    shape: str
    fn: Callable
    args: tuple
    flops: float
    bytes: float
    decode: bool = False
    reset: Callable[[], None] = lambda: None
    """Restores the state a call advances (a decode step's position) before a round."""
    probe: Callable[[Any], Any] = lambda out: out
    """The tensor of a call's result (or of what it wrote) compared with eager's."""
    result: dict = field(default_factory=dict)


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def left() -> float:
    """Seconds of ``--budget-s`` left."""
    return BUDGET - (time.monotonic() - START)


# ---- the rows -----------------------------------------------------------------------


def _blocks_counts(model, x, causal: bool) -> tuple[float, float]:
    """(FLOPs, bytes) of steady_state's pre-norm blocks on ``x`` [B, T, d]."""
    n, (b, t, d) = len(model), x.shape
    params = sum(p.numel() for p in model.parameters())
    flops = n * (2 * b * t * 12 * d * d + (2 if causal else 4) * b * t * t * d)
    return flops, params * x.element_size() + 2 * x.numel() * x.element_size()


def block_row(key: str, device: str) -> Row:
    import steady_state
    import torch

    model, fn, args = steady_state.make_case("gpt" if key == "gpt_block" else "decode", device)
    if device == "cuda":  # the decode case is fp32 there: served as bf16
        model, args = model.to(torch.bfloat16), tuple(a.to(torch.bfloat16) for a in args)
    flops, nbytes = _blocks_counts(model, args[0], causal=args[0].shape[1] > 1)
    shape = f"{len(model)} blocks, {'x'.join(map(str, args[0].shape))}, {str(args[0].dtype).split('.')[-1]}"
    return Row(key, shape, fn, (model, *args), flops, nbytes, decode=key == "decode_block")


def llama(size: str, device: str, tiny: bool):
    """bench/scale_llama.py's ``size`` Llama: random weights, seeded, eval; bf16 on
    CUDA, fp32 on CPU (``--tiny``: vocabulary 1024)."""
    import scale_llama
    import torch
    import transformers

    shape = dict(scale_llama.SIZES[size])
    vocab = 1024 if tiny else shape.pop("vocab_size", 128256)
    shape.pop("vocab_size", None)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab, rope_theta=500000.0, max_position_embeddings=8192, **shape
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if device == "cuda" else torch.float32)
    try:
        with torch.device(device):
            return transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)


def _llama_weights(model) -> tuple[float, float, int]:
    """(weights of the matrix products, bytes of the weights a forward reads, bytes
    per element): the embedding counted only when tied (then it is the lm_head)."""
    emb = model.model.embed_tokens.weight
    params = sum(p.numel() for p in model.parameters())
    tied = model.lm_head.weight is emb
    read = params - (0 if tied else emb.numel())
    return (
        read - sum(p.numel() for n, p in model.named_parameters() if "norm" in n),
        read * emb.element_size(),
        emb.element_size(),
    )


def llama_row(key: str, size: str, model, device: str, tiny: bool) -> Row:
    import scale_llama
    import torch

    c = model.config
    matmul_w, weight_bytes, s = _llama_weights(model)
    layers, h = c.num_hidden_layers, c.hidden_size
    kv = c.num_key_value_heads * (h // c.num_attention_heads)
    g = torch.Generator().manual_seed(1)
    if key.startswith("prefill"):
        b, t = TINY[key] if tiny else tuple(int(v) for v in key.split("_")[1].split("x"))
        ids = torch.randint(0, c.vocab_size, (b, t), generator=g).to(device)
        flops = (
            2 * b * t * matmul_w + layers * 2 * b * t * t * h
        )  # causal attention: half of 4 B T^2 h
        nbytes = (
            weight_bytes + b * t * h * s + b * t * c.vocab_size * s
        )  # weights, gathered rows, logits
        return Row(
            f"{size} {key}",
            f"{size}, {b}x{t} tokens",
            scale_llama.forward,
            (model, ids),
            flops,
            nbytes,
        )
    ns = _decode_module(c, device, TINY_CACHE if tiny else MAX_CACHE)
    b = TINY[key] if tiny else int(key.split("_b")[1])
    p0 = TINY_CONTEXT if tiny else CONTEXT
    cache = ns["static_cache"](model, b, device)
    token = torch.randint(0, c.vocab_size, (b, 1), generator=g).to(device)
    pos = torch.tensor([p0], device=device)
    tokens, logits = ns["greedy_buffers"](model, b, device)
    flops = 2 * b * matmul_w + layers * 4 * b * (p0 + 1) * h
    nbytes = weight_bytes + layers * 2 * b * (p0 + 1) * kv * s + b * c.vocab_size * s

    token0 = token.clone()
    lengths = [
        t
        for t in (
            getattr(layer, "cumulative_length", None) for layer in getattr(cache, "layers", [])
        )
        if isinstance(t, torch.Tensor)
    ]  # transformers 5's StaticLayer counts its tokens itself

    def reset():  # the same step again: position, input token and the cache's length at the context
        pos.fill_(p0)
        token.copy_(token0)
        for t in lengths:
            t.fill_(p0)

    def probe(_out):
        return logits[:, p0 + 1].clone()

    return Row(
        f"{size} {key}",
        f"{size}, batch {b}, 1 token at context {p0}",
        ns["greedy_step"],
        (model, token, cache, pos, tokens, logits),
        flops,
        nbytes,
        decode=True,
        reset=reset,
        probe=probe,
    )


def _decode_module(config, device: str, max_cache: int) -> dict:
    """bench/decode_project.py's model module (its static cache, greedy_step and
    buffers) for ``max_cache`` tokens."""
    import decode_project

    name = f"roofline_decode_{max_cache}"
    if name not in sys.modules:  # a real module: torch.compile imports the module of what it traces
        module = types.ModuleType(name)
        exec(
            decode_project.MODULE.format(
                config={"vocab_size": config.vocab_size}, max_cache=max_cache
            ),
            module.__dict__,
        )
        sys.modules[name] = module
    return sys.modules[name].__dict__


# ---- the mechanisms -----------------------------------------------------------------


def _fresh(fn: Callable) -> Callable:
    """A copy of ``fn`` with its own code object: torch.compile's cache entries are
    per code object, so each mode compiles its own (none reuses another's)."""
    return types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )


def _tensors(obj: Any, depth: int = 3) -> list:
    """The tensors ``obj`` holds: itself, or in its lists and plain attributes
    (a transformers cache's layers' keys and values), ``depth`` levels down."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth == 0 or isinstance(obj, torch.nn.Module):
        return []
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o, depth - 1)]
    return [t for v in getattr(obj, "__dict__", {}).values() for t in _tensors(v, depth - 1)]


def _static(row: Row) -> None:
    """Mark the tensors a decode step writes (its cache, position, token and result
    buffers) as static addresses, so that torch.compile's CUDA graphs take the step,
    as a server sets it up."""
    import torch

    for a in row.args[1:]:
        for t in _tensors(a):
            torch._dynamo.mark_static_address(t)


def _package(work: Path, package: str, names: list[str]) -> None:
    """``work/site/<package>/_precompiled/``: the pairs and their manifest, as a wheel has them."""
    from precompile_build.builder.pairs import inspect_pair
    from precompile_build.builder.runner import CaptureResult
    from precompile_build.wheels.manifest import assemble, write_dir_atomic

    pkg = work / "site" / package
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    results = []
    for name in names:
        src, cache = work / f"{name}.py", work / f"{name}.cache"
        info = inspect_pair(src, cache)
        results.append(
            CaptureResult(
                name, "ok", True, info.device, source_path=src, cache_path=cache, info=info
            )
        )
    write_dir_atomic(pkg / "_precompiled", assemble(package, results))


def captured(row: Row, work: Path, package: str, modes: dict[str, dict | None]) -> dict[str, dict]:
    """Capture ``row`` with the frozen engine once per target (``{target: capture
    options}``), package the pairs and load each with load_packaged. Returns ``{target:
    {"fn": loaded, "capture_s": ...}}`` or ``{target: {"error": ...}}``."""
    import importlib

    import torch

    import precompile_build
    import precompile_runtime

    out: dict[str, dict] = {}
    for name, options in modes.items():
        if left() < 0:
            out[name] = {"error": "skipped: time budget"}
            continue
        row.reset()
        t0 = time.perf_counter()
        try:
            with (
                torch.no_grad(),
                precompile_build.capture(
                    row.fn,
                    engine="frozen",
                    target=name,
                    artifact_path=work / f"{name}.py",
                    cache_path=work / f"{name}.cache",
                    options=options,
                ) as f,
            ):
                f(*row.args)
            out[name] = {"capture_s": round(time.perf_counter() - t0, 2)}
        except Exception as e:  # noqa: BLE001 - reported in the table
            out[name] = {"error": f"capture: {type(e).__name__}: {str(e)[:300]}"}
    ok = [n for n in out if "error" not in out[n]]
    if ok:
        _package(work, package, ok)
        site = str(work / "site")
        if site not in sys.path:
            sys.path.insert(0, site)
        importlib.invalidate_caches()
        for name in ok:
            out[name]["fn"] = precompile_runtime.load_packaged(name, package=package, strict=True)
    return out


def mechanisms(
    row: Row,
    device: str,
    work: Path,
    package: str,
    variants: dict[str, dict],
    wanted: set[str] | None = None,
) -> dict[str, dict]:
    """``{mechanism: {"fn": callable of no arguments, ...}}`` for ``row``; a
    mechanism that could not be made has ``{"error": ...}`` instead. ``variants``:
    more pairs, ``{label: capture options}`` (``--variant``), served as
    ``load_packaged <label>`` (and ``+ graphs`` on decode rows); ``wanted``: the
    mechanisms to make (None: all)."""
    import torch

    cuda = device == "cuda"
    fn, args = row.fn, row.args

    def want(name: str) -> bool:
        return wanted is None or name in wanted

    mechs: dict[str, dict] = {"eager": {"fn": lambda: fn(*args)}}
    modes = {
        "torch.compile": "default",
        "torch.compile max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs",
    }
    if row.decode and cuda:
        modes["torch.compile max-autotune"] = "max-autotune"
        _static(row)
    for name, mode in modes.items():
        if want(name):
            compiled = torch.compile(_fresh(fn), mode=mode)
            mechs[name] = {"fn": (lambda c=compiled: c(*args)), "compiles": True}
    labels = {
        "": None,
        " max-autotune": {"mode": "max-autotune"},
        **{f" {k}": v for k, v in variants.items()},
    }
    graphs = {
        label
        for label in labels
        if label and row.decode and cuda and want(f"load_packaged{label} + graphs")
    }
    names = {
        "": "default",
        " max-autotune": "max_autotune",  # a variant's target: v<i>, whatever its label
        **{f" {k}": f"v{i}" for i, k in enumerate(variants)},
    }
    targets = {
        label: f"{package}_{names[label]}"
        for label in labels
        if want(f"load_packaged{label}") or label in graphs
    }
    pairs = captured(row, work, package, {targets[label]: labels[label] for label in targets})
    for label, target in targets.items():
        p = pairs[target]
        plain, graphed = {k: v for k, v in p.items() if k != "fn"}, {"error": p.get("error")}
        if "fn" in p:
            plain.update(fn=(lambda f=p["fn"]: f(*args)), packaged=True)
            if label in graphs:
                import precompile_runtime

                g = precompile_runtime.load_packaged(
                    target, package=package, strict=True, cuda_graphs=True
                )
                graphed = {"fn": (lambda g=g: g(*args)), "packaged": True}
        if want(f"load_packaged{label}"):
            mechs[f"load_packaged{label}"] = plain
        if label in graphs:
            mechs[f"load_packaged{label} + graphs"] = graphed
    return mechs


# ---- timing -------------------------------------------------------------------------


def warm(row: Row, mechs: dict[str, dict], device: str, want) -> None:
    """First call of each mechanism (compiling, for torch.compile: its seconds kept),
    then 3 more (CUDA graphs record), the result compared with eager's."""
    import torch

    import precompile_runtime

    # the loaded pairs first: a budget spent on torch.compile's compiles skips those, not them
    for m in sorted(mechs.values(), key=lambda m: bool(m.get("compiles"))):
        if "fn" not in m:
            continue
        if left() < 0:
            m.clear()
            m["error"] = "skipped: time budget"
            continue
        guard = (
            precompile_runtime.no_compilation() if m.get("packaged") else contextlib.nullcontext()
        )
        try:
            with torch.no_grad(), guard:
                row.reset()
                sync(device)
                t0 = time.perf_counter()
                out = m["fn"]()
                sync(device)
                m["first_call_s"] = round(time.perf_counter() - t0, 3)
                got = row.probe(out).float()
                for _ in range(3):
                    row.reset()
                    m["fn"]()
                sync(device)
            m["max_abs_err"] = float((got - want).abs().max())
        except Exception as e:  # noqa: BLE001 - reported in the table
            m.clear()
            m["error"] = f"{type(e).__name__}: {str(e)[:300]}"


def interleaved(
    row: Row, mechs: dict[str, dict], device: str, rounds: int, target_s: float
) -> None:
    """Median ms per call of each mechanism over ``rounds`` rounds; a round runs each
    mechanism ``calls`` times (about ``target_s`` seconds each, from its warm-up), each
    round starting one mechanism later."""
    import torch

    live = [(n, m) for n, m in mechs.items() if "fn" in m]
    for _, m in live:
        one = []
        for _ in range(3):  # the fastest of 3: a busy host's pause sets no mechanism's count
            with torch.no_grad():
                row.reset()
                sync(device)
                t0 = time.perf_counter()
                m["fn"]()
                sync(device)
            one.append(time.perf_counter() - t0)
        m["calls"] = max(3, min(100, int(target_s / max(min(one), 1e-6))))
        m["times"] = []
    for r in range(rounds):
        for _, m in live[r % len(live) :] + live[: r % len(live)]:
            with torch.no_grad():
                row.reset()
                sync(device)
                t0 = time.perf_counter()
                for _ in range(m["calls"]):
                    m["fn"]()
                sync(device)
            m["times"].append((time.perf_counter() - t0) * 1e3 / m["calls"])
    for _, m in live:
        m["ms"] = statistics.median(m["times"])
        m["spread"] = (max(m["times"]) - min(m["times"])) / m["ms"]


def run_row(
    row: Row,
    device: str,
    rounds: int,
    target_s: float,
    peak: float,
    bandwidth: float,
    variants: dict[str, dict],
    wanted: set[str] | None,
    kernel_calls: int,
) -> dict:
    """One row measured (see the module docstring); ``kernel_calls`` > 0 (CUDA): each
    mechanism's kernels profiled over that many calls after the timing
    (profile_kernels.kernel_times: ``"kernels"`` of its entry)."""
    import torch

    memory_ms, compute_ms = row.bytes / bandwidth * 1e3, row.flops / peak * 1e3
    res: dict = {
        "shape": row.shape,
        "flops": row.flops,
        "bytes": row.bytes,
        "memory_ms": memory_ms,
        "compute_ms": compute_ms,
        "floor_ms": max(memory_ms, compute_ms),
        "bound": "memory" if memory_ms >= compute_ms else "compute",
        "mechanisms": {},
    }
    with tempfile.TemporaryDirectory(prefix="roofline-") as tmp:
        package = "roofline_" + "".join(ch if ch.isalnum() else "_" for ch in row.key)
        mechs = mechanisms(row, device, Path(tmp), package, variants, wanted)
        with torch.no_grad():
            row.reset()
            want = row.probe(row.fn(*row.args)).float()
        warm(row, mechs, device, want)
        if left() > 0:
            interleaved(row, mechs, device, rounds, target_s)
        if kernel_calls and device == "cuda":
            from profile_kernels import kernel_times

            for m in mechs.values():
                if "ms" in m:
                    with torch.no_grad():
                        row.reset()
                        m["kernels"] = kernel_times(m["fn"], kernel_calls, top=8)
        for name, m in mechs.items():
            entry = {k: v for k, v in m.items() if k not in ("fn", "times", "packaged", "compiles")}
            if "ms" in m:
                entry["vs_floor"] = m["ms"] / res["floor_ms"]
                entry["rounds_ms"] = [round(t, 4) for t in m["times"]]
            elif "error" not in entry:
                entry["error"] = "skipped: time budget"
            res["mechanisms"][name] = entry
        del mechs
    return res


def main(argv=None) -> int:
    global BUDGET
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default=None, help="cuda (default where there is one) or cpu")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (a smoke test, e.g. on CPU)")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--sizes", default=None, help="the Llama rows' sizes: 1b,8b (--tiny: tiny)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument(
        "--round-s", type=float, default=0.1, help="seconds a mechanism runs per round, about"
    )
    p.add_argument(
        "--budget-s", type=float, default=BUDGET, help="start nothing new after this many seconds"
    )
    p.add_argument(
        "--mechanisms",
        default=None,
        help="comma-separated names of the table's mechanisms to run (default: all)",
    )
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=JSON",
        help="another pair, captured with these capture options, served as 'load_packaged LABEL' "
        "(decode rows on CUDA also '+ graphs'), e.g. "
        '\'no-cdt={"mode": "max-autotune", "inductor": {"coordinate_descent_tuning": false}}\'',
    )
    p.add_argument(
        "--kernels",
        type=int,
        default=0,
        metavar="CALLS",
        help="CUDA: profile each mechanism's kernels over CALLS calls after the timing",
    )
    p.add_argument("--bandwidth", type=float, default=BANDWIDTH, help="bytes/s of the floor")
    p.add_argument("--peak", type=float, default=PEAK_BF16, help="FLOP/s of the floor")
    p.add_argument("--out", required=True, help="path without suffix: writes .json and .md")
    p.add_argument("--fresh", action="store_true", help="do not merge into an existing --out JSON")
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="JSON",
        help="only merge the rows of these result files into --out (later files win) and write it",
    )
    a = p.parse_args(argv)
    if a.merge:
        out = Path(a.out)
        doc: dict = {"rows": {}}
        for path in a.merge:
            try:
                part = json.loads(Path(path).read_text())
            except (OSError, json.JSONDecodeError) as e:
                p.error(f"--merge {path}: not a results file of this bench ({e})")
            if not isinstance(part, dict) or not isinstance(part.get("rows"), dict):
                p.error(f"--merge {path}: not a results file of this bench (no rows)")
            rows = {
                k: {"argv": part.get("argv"), **r} for k, r in part["rows"].items()
            }  # each row's command
            doc = {
                **doc,
                **{k: v for k, v in part.items() if k != "rows"},
                "rows": {**doc["rows"], **rows},
            }
        out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
        write_md(out.with_suffix(".md"), markdown(doc))
        return 0
    BUDGET = a.budget_s
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    bad = [r for r in rows if r not in ROWS]
    if bad:
        p.error(f"unknown row(s) {bad}: use {', '.join(ROWS)}")
    sizes = [
        s.strip() for s in (a.sizes or ("tiny" if a.tiny else "1b,8b")).split(",") if s.strip()
    ]
    if a.rounds < 1 or a.round_s <= 0:
        p.error("--rounds and --round-s take positive numbers")
    variants: dict[str, dict] = {}
    for v in a.variant:
        label, _, opts = v.partition("=")
        try:
            variants[label.strip()] = json.loads(opts)
        except json.JSONDecodeError as e:
            p.error(f"--variant {v!r}: LABEL=JSON of capture options ({e})")
        if label.strip() in ("", "max-autotune") or not isinstance(variants[label.strip()], dict):
            p.error(
                f'--variant {v!r}: LABEL=JSON of capture options, e.g. \'x={{"mode": "max-autotune"}}\' '
                "(a label other than the table's own 'max-autotune')"
            )
    wanted = {m.strip() for m in a.mechanisms.split(",") if m.strip()} if a.mechanisms else None
    known = {*MECHANISMS, *(f"load_packaged {v}{g}" for v in variants for g in ("", " + graphs"))}
    if wanted is not None and (wanted - known or not wanted):
        p.error(f"--mechanisms {a.mechanisms!r}: names of {', '.join(sorted(known))}")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="roofline-inductor-"))
    sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "runtime")]
    import scale_llama
    import torch

    bad = [s for s in sizes if s not in scale_llama.SIZES]
    if bad:
        p.error(f"unknown size(s) {bad}: use {', '.join(scale_llama.SIZES)}")
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out.with_suffix(".json"), out.with_suffix(".md")
    doc = json.loads(json_path.read_text()) if json_path.exists() and not a.fresh else {"rows": {}}
    doc.update(
        torch=torch.__version__,
        device=device,
        rounds=a.rounds,
        source=SOURCE,
        bandwidth=a.bandwidth,
        peak=a.peak,
        argv=" ".join(sys.argv[1:] if argv is None else argv),
        device_name=torch.cuda.get_device_name()
        if device == "cuda"
        else f"{platform.machine()} CPU ({torch.get_num_threads()} threads)",
    )

    def save():
        json_path.write_text(json.dumps(doc, indent=1) + "\n")
        write_md(md_path, markdown(doc))

    plan: list[tuple[str, str | None]] = [(r, None) for r in rows if r not in LLAMA_ROWS]
    plan += [(r, s) for s in sizes for r in rows if r in LLAMA_ROWS]
    model_of: dict[str, Any] = {}
    for key, size in plan:
        name = key if size is None else f"{size} {key}"
        if left() < 0:
            doc["rows"][name] = {"error": "skipped: time budget"}
            save()
            continue
        try:
            if size is None:
                row = block_row(key, device)
            else:
                if size not in model_of:
                    model_of.clear()  # one model at a time: an 8B model is 16 GB
                    model_of[size] = llama(size, device, a.tiny)
                row = llama_row(key, size, model_of[size], device, a.tiny)
            doc["rows"][name] = {
                "argv": doc["argv"],
                **run_row(
                    row,
                    device,
                    a.rounds,
                    a.round_s,
                    a.peak,
                    a.bandwidth,
                    variants,
                    wanted,
                    a.kernels,
                ),
            }
        except Exception as e:  # noqa: BLE001 - reported in the table
            import traceback

            doc["rows"][name] = {
                "error": f"{type(e).__name__}: {e}"[:500],
                "traceback": traceback.format_exc()[-3000:],
            }
        print(
            f"{name}: "
            + json.dumps(
                {
                    m: v.get("ms", v.get("error"))
                    for m, v in doc["rows"][name].get("mechanisms", {}).items()
                }
                or doc["rows"][name]
            )[:800],
            flush=True,
        )
        save()  # after each row: a command cut short keeps what it measured
        if device == "cuda":
            torch.cuda.empty_cache()
    print(markdown(doc))
    failed = any("error" in r and "budget" not in r["error"] for r in doc["rows"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
