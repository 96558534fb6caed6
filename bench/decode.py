"""Greedy LLM decoding: time per token and first token, each path in a fresh process.

A Llama-shaped transformers model (CUDA: about 1.1B parameters, bf16: hidden 2048,
16 layers, 32 heads, 8 KV heads, MLP 8192, vocabulary 32000; CPU: hidden 256, 4
layers, fp32), a prompt of ``--prompt`` tokens, then ``--steps`` greedy tokens, at
each batch of ``--batches``.

Weights: random, built so that greedy tokens are decidable in bf16. With plain random
weights the top two logits of a 32000-way argmax are often within bf16 rounding of
each other, so two correct implementations pick other tokens (the bench saw this from
token 1). Here the embeddings have unit-variance rows, the lm_head is the embedding
matrix with its rows permuted (scaled by 1/sqrt(hidden)), and the layers' weights are
small (``initializer_range``, chosen so that the 2 x layers sublayers add about 20% to
the residual stream's norm): the final hidden state is mostly the current token's
embedding, so the argmax is the one token whose lm_head row is that embedding, with a margin of about 0.9 x the top
logit, far above bf16 rounding (about 0.4%), while every layer still runs in full
(the same kernels and FLOPs as any weights) and moves the logits (reported: the
largest logit difference to eager's). No eos token: every path decodes ``--steps``.

Paths:

- ``eager``: the server loop below over ``model(input_ids=, past_key_values=StaticCache,
  cache_position=)`` (prefill, then one token per call);
- ``generate``: ``model.generate(past_key_values=StaticCache(...))`` (a fresh cache of
  one size per call, as ``cache_implementation="static"`` makes one), eager
  (``disable_compile=True``); ``generate_auto``: the same as transformers runs it by
  default (with a static cache it compiles the forward itself);
- ``generate_compile``: ``generate`` after ``model.forward = torch.compile(model.forward,
  fullgraph=True)``; ``generate_compile_ro``: with ``mode="reduce-overhead"``;
- ``load_packaged``: the same loop as ``eager`` on the targets of one wheel built here
  (``prefill_b<B>``: the prompt length dynamic; ``decode_b<B>``: one token), loaded with
  ``precompile_runtime.load_packaged``; ``load_packaged_graphs``: with
  ``cuda_graphs=True`` (CUDA only);
- ``load_packaged_greedy``: a loop over the target ``greedy_b<B>``, which holds the whole
  step (``greedy_step`` in decode_project.py: the argmax, the next input, the position,
  the token and logits kept in device buffers, the stop flag returned); the prompt goes
  through it a token per call; ``load_packaged_graphs_greedy``: with ``cuda_graphs=True``,
  so that each step is one graph replay and nothing else (CUDA only).

The server loop (eager, load_packaged*): the next token stays on the device and is fed
back as the next input, the position is a device tensor advanced in place, logits are
kept on the device; each step reads one stop flag on the host (``(token == stop).all()``,
no stop token here): one host sync per step, as ``generate`` does on CUDA
(``StopCheck``: ``bool(unfinished_sequences.max() == 0)`` every step). Tokens reach the
host at the end. ``eager_lagged`` and ``load_packaged_graphs_lagged``: the same loop
reading each step's stop flag one step later, after the next step is launched (at
most one step decoded past a stop, dropped; :class:`StopFlags`: copied to pinned host
memory and read after that copy's event, as a plain ``bool()`` of it would wait for the
step just launched too): the host's work for step t+1 (the call's checks, the graph
lookup, the launch) overlaps the GPU's step t, where the plain loop leaves the GPU idle
while the host works after each sync. The ``_greedy`` paths read their flags the same
way. ``--inductor KEY=VALUE``
passes an Inductor setting to the targets' captures (``combo_kernels=1``: independent
small kernels fused horizontally, fewer launches per step).

Per path: ``first token`` = seconds from the start of the path in its fresh process
(model built, weights on the device: not counted) to the first token on the host,
compiling or loading included (load_packaged: the prefill target; the decode target is
loaded after the first token is out, its seconds shown as ``decode load``; with
``--prefill decode`` the wheel has no prefill targets: the decode target is loaded, then
the prompt goes through it a token per call, its CUDA graph recorded on the way); ``ms/token`` =
the steady state: the loops' wall time of the decode calls after the first ``WARM`` = 3
(a warm-up, the CUDA graphs' timed plain run and their recording: what generate's
compiled paths do in their warm-up calls) over their number; generate: ``(t(steps) -
t(1)) / (steps - 1)``, each a full generate call, after the first-token call and a
warm-up call of 3 tokens; tokens and
logits are compared with ``eager``'s (``max |dlogit|``: the largest absolute difference
over all steps, rows and the vocabulary, and that over eager's largest |logit|).
``kernel floor`` (CUDA, load_packaged*): the GPU time of one decode step's kernels
(torch.profiler over 20 steps of the frozen kernels without graphs): what a replayed
graph can at best reach. ``load_packaged_graphs`` also gets a per-step breakdown (20
instrumented steps after the timed ones): host time in the loaded function before the
graph's replay (argument walk, checks, graph lookup, input copies), the replay call,
after it (output copies, result), the loop's own host time (argmax, position, stop
flag, waiting for the GPU), and the GPU time of the replay (CUDA events).

    PYTHONPATH=$PWD:$PWD/runtime python bench/decode.py --device cpu \\
        --out bench/results/decode_cpu.md
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

from decode_project import MODULE, SIZES, build_wheel, write_project  # noqa: F401 - MODULE: decode_host.py
from decode_timing import StopFlags, breakdown, kernel_floor, sync

ROOT = Path(__file__).resolve().parent.parent
# (in the order they run: a run cut short has the cheap and the precompiled ones)
PATHS = (
    "eager",
    "load_packaged",
    "load_packaged_graphs",
    "eager_lagged",
    "load_packaged_graphs_lagged",
    "load_packaged_greedy",
    "load_packaged_graphs_greedy",
    "generate",
    "generate_compile",
    "generate_compile_ro",
    "generate_auto",
)
GREEDY = (
    "_greedy"  # the loop over greedy_b<B>: the whole step (argmax, position, results) in the target
)
LAGGED = "_lagged"  # the server loop that reads each step's stop flag one step later
WARM = 3  # decode calls before the loops' timing starts: a warm-up, CUDA graphs' timed run, its recording


def worker(
    path: str,
    device: str,
    batch: int,
    steps: int,
    n_prompt: int,
    logits_file: str,
    prefill_with: str = "target",
) -> dict:
    """One path in this (fresh) process: first-token seconds, ms/token, tokens; the
    logits of every step (float32, [batch, steps, vocab]) saved to ``logits_file``."""
    if path.endswith(GREEDY):
        return greedy_worker(path, device, batch, steps, n_prompt, logits_file)
    import llmdecode
    import torch

    lagged = path.endswith(LAGGED)
    path = path.removesuffix(LAGGED)
    model = llmdecode.build(device)
    ids = llmdecode.prompt(batch, n_prompt, device)
    sync(device)
    out: dict = {}
    if path.startswith("generate"):
        if path != "generate":
            mode = "reduce-overhead" if path.endswith("_ro") else "default"
            model.forward = torch.compile(model.forward, fullgraph=True, mode=mode)

        extra = {} if path == "generate_auto" else {"disable_compile": True}

        def generate(n):
            sync(device)
            t0 = time.perf_counter()
            # a fresh StaticCache of one size for every call: the compiled forward sees
            # the same shapes (generate's own static cache is sized by max_new_tokens)
            res = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                past_key_values=llmdecode.static_cache(model, batch, device),
                pad_token_id=0,
                return_dict_in_generate=True,
                output_logits=True,
                **extra,
            )
            toks = res.sequences[:, n_prompt:].tolist()
            return time.perf_counter() - t0, toks, res.logits

        with torch.no_grad():
            out["first_token_s"], _, _ = generate(1)
            generate(3)  # a compiled path compiles its decode step here
            one, _, _ = generate(1)
            full, out["tokens"], logits = generate(steps)
        out["ms_per_token"] = (full - one) / (steps - 1) * 1e3
        torch.save(torch.stack(logits, 1).float().cpu(), logits_file)
        return out
    t0 = time.perf_counter()
    graphs = path == "load_packaged_graphs"
    by_decode = path != "eager" and prefill_with == "decode"
    if path == "eager":
        prefill = decode = llmdecode.step
    else:
        import precompile_runtime

        if (
            by_decode
        ):  # the prompt through the decode target, a token per call: one target per batch
            decode = precompile_runtime.load_packaged(
                f"decode_b{batch}", package="llmdecode", strict=True, cuda_graphs=graphs
            )
        else:
            prefill = precompile_runtime.load_packaged(
                f"prefill_b{batch}", package="llmdecode", strict=True
            )
    out["load_s"] = time.perf_counter() - t0
    cache = llmdecode.static_cache(model, batch, device)
    with torch.no_grad():
        if by_decode:
            for i in range(n_prompt):
                logits = decode(
                    model, ids[:, i : i + 1].contiguous(), cache, torch.tensor([i], device=device)
                )
        else:
            logits = prefill(model, ids, cache, torch.arange(n_prompt, device=device))
        token = logits.argmax(-1)
        first = token.cpu()  # the first token on the host
        out["first_token_s"] = time.perf_counter() - t0
        if (
            path != "eager" and not by_decode
        ):  # loaded once the first token is out (a server streams it)
            t1 = time.perf_counter()
            decode = precompile_runtime.load_packaged(
                f"decode_b{batch}", package="llmdecode", strict=True, cuda_graphs=graphs
            )
            out["decode_load_s"] = time.perf_counter() - t1
        pos = torch.tensor([n_prompt], device=device)
        tokens, all_logits = [token], [logits]
        flags = StopFlags(device)
        for i in range(steps - 1):
            if i == WARM:  # steady state from here (the first calls warm up, time, record)
                sync(device)
                t1 = time.perf_counter()
            logits = decode(model, token[:, None], cache, pos)
            token = logits.argmax(-1)
            pos += 1
            tokens.append(token)
            all_logits.append(logits)
            flag = (token == llmdecode.STOP).all()
            if not lagged:
                if bool(flag):  # the stop flag on the host: one sync per step, as generate
                    break
            elif flags.lagged(flag):
                # the previous step's flag, read while this step runs: the host never waits
                # for the step it just launched (at most one step decoded past the stop)
                tokens.pop()
                all_logits.pop()
                break
        sync(device)
        out["ms_per_token"] = (time.perf_counter() - t1) / (steps - 1 - WARM) * 1e3
        out["tokens"] = torch.stack(tokens, 1).tolist()
        assert out["tokens"][0][0] == first[0].item()
        torch.save(torch.stack(all_logits, 1).float().cpu(), logits_file)
        if path.startswith("load_packaged") and device == "cuda":
            try:  # (after the timed loop: a failure here keeps the row, with the reason)
                graphs = getattr(decode, "cuda_graphs", False)
                plain = decode.with_cuda_graphs(False) if graphs else decode

                def one_step():
                    plain(model, token[:, None], cache, pos)
                    pos.add_(1)

                out["kernel_ms_per_step"] = kernel_floor(one_step, device)
                if graphs:
                    state = {"token": token}

                    def after(
                        logits,
                    ):  # the loop's own work: the next input, the position, the flag
                        state["token"] = logits.argmax(-1)
                        pos.add_(1)
                        return (state["token"] == llmdecode.STOP).all()

                    out["breakdown"] = breakdown(
                        lambda: decode(model, state["token"][:, None], cache, pos),
                        after,
                        lagged=lagged,
                    )
            except Exception as e:  # noqa: BLE001 - reported in the table
                out["logit_note"] = f"floor/breakdown failed: {type(e).__name__}: {str(e)[:150]}"
    return out


def greedy_worker(
    path: str, device: str, batch: int, steps: int, n_prompt: int, logits_file: str
) -> dict:
    """A ``*_greedy`` path in this (fresh) process, as :func:`worker`: the loop calls the
    loaded ``greedy_b<B>`` (``load_packaged_graphs_greedy``: with CUDA graphs), whose one
    call is the whole step: the prompt goes through it a token per call (the token and
    position set before each), then each call decodes one token in place and returns the
    stop flag, read one step later (as the ``_lagged`` loops); tokens and logits come
    from the buffers the step wrote, at the end. The floor: this step's kernels."""
    import llmdecode
    import torch

    import precompile_runtime

    model = llmdecode.build(device)
    ids = llmdecode.prompt(batch, n_prompt, device)
    sync(device)
    out: dict = {}
    t0 = time.perf_counter()
    step = precompile_runtime.load_packaged(
        f"greedy_b{batch}",
        package="llmdecode",
        strict=True,
        cuda_graphs=path.startswith("load_packaged_graphs"),
    )
    out["load_s"] = time.perf_counter() - t0
    cache = llmdecode.static_cache(model, batch, device)
    tokens, logits = llmdecode.greedy_buffers(model, batch, device)
    # a tensor of its own (ids[:, :1].contiguous() is a view of ids at batch 1: the step would write the prompt)
    token, pos = ids[:, :1].clone(), torch.zeros(1, dtype=torch.long, device=device)
    with torch.no_grad():
        for i in range(n_prompt):  # the same tensors every call: a graph reads them in place
            token.copy_(ids[:, i : i + 1])
            pos.fill_(i)
            step(model, token, cache, pos, tokens, logits)
        first = token[:, 0].tolist()  # the first token on the host (a copy: the step writes token)
        out["first_token_s"] = time.perf_counter() - t0
        flags = StopFlags(device)
        for i in range(steps - 1):
            if i == WARM:
                sync(device)
                t1 = time.perf_counter()
            if flags.lagged(step(model, token, cache, pos, tokens, logits)):  # (no stop token here)
                break
        sync(device)
        out["ms_per_token"] = (time.perf_counter() - t1) / (steps - 1 - WARM) * 1e3
        made = slice(n_prompt, n_prompt + steps)  # the first token, then one per step
        out["tokens"] = tokens[:, made].tolist()
        assert [row[0] for row in out["tokens"]] == first
        torch.save(logits[:, made].float().cpu(), logits_file)
        if device == "cuda":
            try:  # (after the timed loop: a failure here keeps the row, with the reason)
                graphs = getattr(step, "cuda_graphs", False)
                plain = step.with_cuda_graphs(False) if graphs else step
                out["kernel_ms_per_step"] = kernel_floor(
                    lambda: plain(model, token, cache, pos, tokens, logits), device
                )
                if graphs:  # the loop's own work is the flag's read only
                    out["breakdown"] = breakdown(
                        lambda: step(model, token, cache, pos, tokens, logits),
                        lambda flag: flag,
                        lagged=True,
                    )
            except Exception as e:  # noqa: BLE001 - reported in the table
                out["logit_note"] = f"floor/breakdown failed: {type(e).__name__}: {str(e)[:150]}"
    return out


def run_path(
    path: str,
    device: str,
    batch: int,
    steps: int,
    n_prompt: int,
    work: Path,
    timeout: float,
    prefill_with: str = "target",
) -> dict:
    env = dict(os.environ)
    caches = work / f"cache-{path}-{batch}"
    shutil.rmtree(caches, ignore_errors=True)  # fresh compiler caches: a first run
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
        TRITON_CACHE_DIR=str(caches / "triton"),
        PRECOMPILE_CACHE_DIR=str(caches / "precompile"),
        PYTHONPATH=os.pathsep.join(
            [str(work / "site"), str(ROOT), str(ROOT / "runtime"), env.get("PYTHONPATH", "")]
        ),
    )
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        path,
        "--device",
        device,
        "--batches",
        str(batch),
        "--steps",
        str(steps),
        "--prompt",
        str(n_prompt),
        "--logits",
        str(work / f"logits-{path}-{batch}.pt"),
        "--prefill",
        prefill_with,
    ]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": f"exit {p.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def _first_difference(got, want):
    for r, (g, w) in enumerate(zip(got, want)):
        for i, (a, b) in enumerate(zip(g, w)):
            if a != b:
                return f"row {r} token {i}"
    return None


def _logit_difference(work: Path, path: str, batch: int) -> dict:
    """The largest |logit - eager's logit| over every step, row and token id, and that
    over eager's largest |logit| (files written by the workers; removed after)."""
    import torch

    mine, eager = work / f"logits-{path}-{batch}.pt", work / f"logits-eager-{batch}.pt"
    if not (mine.exists() and eager.exists()):
        return {}
    got, want = torch.load(mine), torch.load(eager)
    if got.shape != want.shape:
        return {"logit_note": f"logits of shape {list(got.shape)} vs eager's {list(want.shape)}"}
    diff = (got - want).abs().max().item()
    return {"max_dlogit": diff, "rel_dlogit": diff / max(want.abs().max().item(), 1e-30)}


def markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        f"# Greedy decoding ({meta['device']})",
        "",
        f"`{meta['command']}` - torch {meta['torch']}, transformers {meta['transformers']}, "
        f"{meta['host']}. Model: {meta['model']} (weights built for decidable greedy tokens: "
        f"bench/decode.py's docstring). Prompt {meta['prompt']} tokens, then "
        f"{meta['steps']} greedy tokens; each path in a fresh process with empty compiler caches "
        f"(wheel built in {meta['build_s']:.0f} s). The loops keep the token on the device and read "
        "one stop flag per step, as generate does; the `_lagged` paths read each step's flag after "
        "launching the next step (through pinned memory: the host's work overlaps the GPU's); the "
        "`_greedy` paths call one target holding the whole step (argmax, next input, position), "
        "lagged too, and their x kernel floor is over that step's own kernels.",
        "",
        "| batch | path | first token (s) | ms/token | vs eager | x kernel floor | tokens equal eager "
        "| max abs dlogit (rel.) | note |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['batch']} | {r['path']} | - | - | - | - | - | - | fails: {r['error']} |"
            )
            continue
        note = []
        if r.get("kernel_ms_per_step") is not None:
            note.append(f"kernel floor {r['kernel_ms_per_step']:.3f} ms/step")
        if r.get("decode_load_s") is not None:
            note.append(
                f"load: prefill {r['load_s']:.2f} s (in first token), decode {r['decode_load_s']:.2f} s "
                "(after it)"
            )
        if r.get("logit_note"):
            note.append(r["logit_note"])
        floor = f"{r['floor_ratio']:.2f}x" if r.get("floor_ratio") is not None else "-"
        dlogit = (
            f"{r['max_dlogit']:.3g} ({r['rel_dlogit']:.2%})"
            if r.get("max_dlogit") is not None
            else "-"
        )
        lines.append(
            f"| {r['batch']} | {r['path']} | {r['first_token_s']:.2f} | {r['ms_per_token']:.3f} | "
            f"{r.get('vs_eager', float('nan')):.2f}x | {floor} | {r.get('equal', '-')} | {dlogit} | "
            f"{'; '.join(note)} |"
        )
    parts = [r for r in rows if r.get("breakdown", {}).get("steps")]
    if parts:
        keys = [k for k in parts[0]["breakdown"] if k != "steps"]
        lines += [
            "",
            "Per-step breakdown of load_packaged_graphs (medians of instrumented steps after the "
            "timed ones; us, GPU replay and step in ms): host time in the loaded function before "
            "CUDAGraph.replay, in it, after it; the loop's own host time incl. waiting for the GPU "
            "(the _lagged rows: in the lagged loop).",
            "",
            "| batch | path | steps | " + " | ".join(keys) + " |",
            "|---|---|---|" + "---|" * len(keys),
        ]
        for r in parts:
            b = r["breakdown"]
            lines.append(
                f"| {r['batch']} | {r['path']} | {b['steps']} | "
                + " | ".join(f"{b[k]:.3f}" if k.endswith("_ms") else f"{b[k]:.1f}" for k in keys)
                + " |"
            )
    return "\n".join(lines) + "\n"


def summary(r: dict, rows: list[dict]) -> str:
    """One line for a (batch, path): what the issue's speed target reads."""
    head = f"SUMMARY batch={r['batch']} path={r['path']}"
    if "error" in r:
        return f"{head} FAILS {r['error'][:200]}"
    eager = next(
        (x for x in rows if x["batch"] == r["batch"] and x["path"] == "eager" and "error" not in x),
        None,
    )
    text = f"{head} ms/token={r['ms_per_token']:.3f}"
    if r.get("floor_ratio") is not None:
        text += f" floor_x={r['floor_ratio']:.2f}"
    text += f" first_token_s={r['first_token_s']:.2f}"
    if eager is not None and r is not eager:
        text += f" (eager {eager['first_token_s']:.2f}) tokens_equal={r.get('equal', '-').split(' ')[0]}"
    if r.get("max_dlogit") is not None:
        text += f" max_dlogit={r['max_dlogit']:.3g}"
    b = r.get("breakdown") or {}
    if b.get("steps"):
        text += (
            f" host_before_replay_us={b['driver_before_replay_us']:.0f} replay_gpu_ms={b['replay_gpu_ms']:.3f}"
            f" step_ms={b['step_ms']:.3f}"
        )
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if _cuda() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--steps", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per path")
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds for the whole run, the build of the wheel included: a path that would start after it is skipped, "
        "one running is stopped at it",
    )
    ap.add_argument(
        "--prefill",
        choices=["target", "decode"],
        default="target",
        help="load_packaged paths: the prompt through a prefill target (one per batch, "
        "the prompt length dynamic) or through the decode target, a token per call "
        "(half the targets to build)",
    )
    ap.add_argument(
        "--inductor",
        action="append",
        default=[],
        help="KEY=VALUE (true/false, an int, else text): an Inductor setting for the targets' capture",
    )
    ap.add_argument("--work", help="folder for the project, wheel and caches (default: a temp dir)")
    ap.add_argument("--out", help="write the markdown table here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--logits", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(
            json.dumps(
                worker(a.worker, a.device, a.batches[0], a.steps, a.prompt, a.logits, a.prefill)
            )
        )
        return
    work = Path(a.work or tempfile.mkdtemp(prefix="decode-bench-"))
    paths = [p for p in a.paths if a.device == "cuda" or not p.startswith("load_packaged_graphs")]
    if "eager" in paths:  # first: the others are compared with it
        paths.remove("eager")
        paths.insert(0, "eager")
    inductor = dict(map(inductor_setting, a.inductor))
    kinds: tuple = ()
    if any(p.startswith("load_packaged") and not p.endswith(GREEDY) for p in paths):
        kinds += ("prefill", "decode") if a.prefill == "target" else ("decode",)
    if any(p.endswith(GREEDY) for p in paths):
        kinds += ("greedy",)
    proj = write_project(work, a.device, a.batches, a.prompt + a.steps + 48, kinds, inductor)
    start = time.perf_counter()
    build_s = build_wheel(work, proj) if any(p.startswith("load_packaged") for p in paths) else 0.0
    write = _writer(a, build_s)
    rows: list[dict] = []
    eagers: dict = {}
    # path-major (eager at every batch, then the next path at every batch, ...): a run cut
    # short by --budget has the same paths at every batch
    for path, batch in [(p, b) for p in paths for b in a.batches]:
        left = (
            a.timeout
            if a.budget is None
            else min(a.timeout, a.budget - (time.perf_counter() - start))
        )
        if left < 10:
            r = {"error": "not run: the --budget was spent"}
        else:
            r = run_path(path, a.device, batch, a.steps, a.prompt, work, left, a.prefill)
        r.update(path=path, batch=batch)
        if path == "eager" and "error" not in r:
            eagers[batch] = r
        eager = eagers.get(batch)
        if "error" not in r and eager is not None:
            r["vs_eager"] = eager["ms_per_token"] / r["ms_per_token"]
            diff = _first_difference(r["tokens"], eager["tokens"])
            r["equal"] = "yes" if diff is None else f"no (first at {diff})"
            if r is not eager:
                r.update(_logit_difference(work, path, batch))
        rows.append(r)
        rows.sort(key=lambda x: (a.batches.index(x["batch"]), paths.index(x["path"])))
        print(json.dumps({k: v for k, v in r.items() if k != "tokens"}), flush=True)
        floor = next(
            (
                x["kernel_ms_per_step"]
                for x in rows
                if x["batch"] == batch
                and "kernel_ms_per_step" in x
                and not x["path"].endswith(GREEDY)
            ),
            None,
        )  # the decode step's
        for x in rows:
            own = x.get("kernel_ms_per_step") or floor  # a greedy row: its own step's kernels
            if x["batch"] == batch and own and "error" not in x:
                x["floor_ratio"] = x["ms_per_token"] / own
        write(rows)  # after every path: a run cut short keeps what it measured
    for p in work.glob("logits-*.pt"):
        p.unlink()
    for r in rows:
        print(summary(r, rows), flush=True)


def inductor_setting(text: str) -> tuple:
    """``KEY=VALUE`` as (key, value): true/false as bools, an int as an int, else text."""
    key, _, value = text.partition("=")
    if value.lower() in ("true", "false"):
        return key, value.lower() == "true"
    return key, int(value) if value.lstrip("-").isdigit() else value


def _writer(a, build_s):
    import torch
    import transformers

    size = SIZES[a.device]
    meta = {
        "device": a.device,
        "command": "python bench/decode.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "host": f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs"
        + (f", {torch.cuda.get_device_name()}" if a.device == "cuda" else ""),
        "model": (
            f"Llama, hidden {size['hidden_size']}, {size['num_hidden_layers']} layers, "
            f"{size['num_attention_heads']} heads ({size['num_key_value_heads']} KV), MLP "
            f"{size['intermediate_size']}, vocabulary {size['vocab_size']}, {size['dtype']}"
            + (", about 1.1B parameters" if a.device == "cuda" else "")
        ),
        "prompt": a.prompt,
        "steps": a.steps,
        "build_s": build_s,
    }

    def write(rows):
        if a.out:
            Path(a.out).write_text(markdown(meta, rows))

    return write


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


if __name__ == "__main__":
    main()
