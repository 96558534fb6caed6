"""Greedy decoding behind one HTTP server (FastAPI on uvicorn): requests per second and
latency of load_packaged against eager and torch.compile, in one run (a measurement, not
a test).

Usage::

    PYTHONPATH=.:runtime python bench/serve_http.py [--device cpu|cuda] [--clients 16]
        [--requests 128] [--prompt 8] [--steps 8] [--out bench/results/serve_http_cpu.md]

The model is bench/decode_project.py's Llama-shaped transformers model (CPU: hidden 256,
4 layers, fp32; CUDA: about 1.1B parameters, bf16), its weights built so that greedy
tokens are decidable. A wheel with one target, ``greedy_b1`` (``greedy_step``: one token
through the model with a StaticCache, its argmax, the position advanced, all in device
buffers), is built and installed first. Then, for each path, one server in this
process on 127.0.0.1 (the same app, only the step differs):

- ``load_packaged``: the loaded ``greedy_b1`` (CUDA: with CUDA graphs, one per request
  slot: ``max_graphs`` = ``--clients``);
- ``eager``: ``llmdecode.greedy_step`` itself;
- ``compile``: ``torch.compile(greedy_step)``; ``compile_ro``: ``mode="reduce-overhead"``
  (CUDA graphs of torch's own on CUDA).

``POST /generate {"prompt": [ids], "steps": K}`` takes a free request slot (one per
client: a StaticCache, the token, position and result buffers, all reused, so the
addresses a graph reads stay put), resets the cache, feeds the prompt a token per call,
decodes K tokens and answers them; FastAPI's worker threads serve requests at once.
``--clients`` client threads (keep-alive connections over loopback) send ``--requests``
requests in all, each prompt one of 32 fixed prompts; before the timed requests each
client sends one untimed (compiles and graph recordings happen there: ``warm-up s``).
Every answer is compared with eager's tokens for its prompt, computed first in this
process outside the server (``wrong``: answers that differ). On CPU torch runs one
intra-op thread per call (16 requests at once on a few cores). Wall-clock figures of
this host, one run; ``--out`` writes the markdown table.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT / "example_project")]

import decode_project  # noqa: E402
from pydantic import BaseModel  # noqa: E402

PATHS = ("load_packaged", "eager", "compile", "compile_ro")
N_PROMPTS = 32
MAX_CACHE = 64


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


class Slot:
    """One request slot: a StaticCache and the buffers greedy_step reads and writes."""

    def __init__(self, llmdecode: Any, model: Any, device: str):
        import torch

        self.cache = llmdecode.static_cache(model, 1, device)
        self.tokens, self.logits = llmdecode.greedy_buffers(model, 1, device)
        self.token = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)

    def generate(self, step: Callable, model: Any, prompt: list[int], steps: int) -> list[int]:
        """Greedy tokens after ``prompt``: the prompt a token per call, then ``steps - 1``
        calls (the last prompt token's call makes the first); one host read at the end."""
        import torch

        self.cache.reset()  # zeroed in place: the same addresses every request
        with torch.no_grad():
            for i, t in enumerate(prompt):
                self.token.fill_(t)
                self.pos.fill_(i)
                step(model, self.token, self.cache, self.pos, self.tokens, self.logits)
            for _ in range(steps - 1):
                step(model, self.token, self.cache, self.pos, self.tokens, self.logits)
        return self.tokens[0, len(prompt) : len(prompt) + steps].tolist()


class GenerateRequest(BaseModel):
    """``POST /generate``'s body: the prompt's token ids and how many tokens to make."""

    prompt: list[int]
    steps: int


def make_app(step: Callable, model: Any, slots: queue.Queue) -> Any:
    """The server: ``POST /generate``, a sync endpoint (FastAPI's worker threads)."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/generate")
    def generate(req: GenerateRequest) -> dict:
        slot = slots.get()  # blocks while every slot serves a request
        try:
            return {"tokens": slot.generate(step, model, req.prompt, req.steps)}
        finally:
            slots.put(slot)

    return app


def _client(url: str, jobs: list, out: list, errors: list) -> None:
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    try:
        for index, body in jobs:
            t0 = time.perf_counter()
            conn.request(
                "POST",
                "/generate",
                body=json.dumps(body),
                headers={"Content-Type": "application/json"},
            )
            resp = conn.getresponse()
            data = resp.read()  # a failed request's body is the server's text, not JSON
            reply = json.loads(data) if resp.status == 200 else data.decode("utf-8", "replace")
            out.append((index, resp.status, reply, time.perf_counter() - t0))
    except Exception as e:  # noqa: BLE001 - reported in the table
        errors.append(f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def _round(url: str, clients: int, per_client: list[list]) -> tuple[list, list, float]:
    out: list = []
    errors: list = []
    threads = [
        threading.Thread(target=_client, args=(url, per_client[c], out, errors))
        for c in range(clients)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, errors, time.perf_counter() - t0


def run_path(
    path: str,
    step: Callable,
    model: Any,
    llmdecode: Any,
    a: argparse.Namespace,
    prompts: list,
    want: list,
) -> dict:
    """One path behind the server: the warm-up round, then the timed requests."""
    from tinylm.serve import running

    slots: queue.Queue = queue.Queue()
    for _ in range(a.clients):
        slots.put(Slot(llmdecode, model, a.device))
    row: dict = {"path": path}
    with running(make_app(step, model, slots)) as url:
        warm = [
            [(c % N_PROMPTS, {"prompt": prompts[c % N_PROMPTS], "steps": a.steps})]
            for c in range(a.clients)
        ]
        out, errors, seconds = _round(url, a.clients, warm)
        row["warmup_s"] = seconds
        jobs: list[list] = [[] for _ in range(a.clients)]
        for r in range(a.requests):
            jobs[r % a.clients].append(
                (r % N_PROMPTS, {"prompt": prompts[r % N_PROMPTS], "steps": a.steps})
            )
        timed, errors2, seconds = _round(url, a.clients, jobs)
    errors += errors2
    answers = out + timed
    failed = [f"HTTP {s}: {str(r)[:200]}" for _, s, r, _ in answers if s != 200]
    row["wrong"] = sum(1 for i, s, r, _ in answers if s == 200 and r["tokens"] != want[i])
    row["answers"] = len(answers)
    row["errors"] = (errors + failed)[:3]
    lat = sorted(t for _, s, _, t in timed if s == 200)
    if lat:
        row.update(
            rps=len(lat) / seconds,
            p50_ms=statistics.median(lat) * 1e3,
            p99_ms=lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))] * 1e3,
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=128, help="timed requests in all")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=8, help="tokens generated per request")
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--work", help="folder for the project and wheel (default: a temp dir)")
    ap.add_argument("--out", help="markdown file for the table")
    a = ap.parse_args()
    if a.prompt + a.steps > MAX_CACHE:
        sys.exit(f"--prompt + --steps must be at most {MAX_CACHE} (the StaticCache's length)")
    work = Path(a.work or tempfile.mkdtemp(prefix="bench-serve-http-"))
    proj = decode_project.write_project(work, a.device, [1], MAX_CACHE, kinds=("greedy",))
    if not (work / "site" / "llmdecode").is_dir():
        os.environ.update(
            TORCHINDUCTOR_CACHE_DIR=str(work / "inductor-build"),
            TRITON_CACHE_DIR=str(work / "triton-build"),
        )
        build_s = decode_project.build_wheel(work, proj)
        print(f"wheel built in {build_s:.1f} s", flush=True)
    sys.path.insert(0, str(work / "site"))
    # the serving process starts with empty compiler caches: the compile paths' warm-up
    # is a first compile (read when torch.compile first runs)
    os.environ.update(
        TORCHINDUCTOR_CACHE_DIR=str(work / f"inductor-serve-{os.getpid()}"),
        TRITON_CACHE_DIR=str(work / f"triton-serve-{os.getpid()}"),
    )

    import llmdecode
    import torch

    import precompile_runtime

    if a.device == "cpu":
        torch.set_num_threads(1)  # 16 requests at once: one intra-op thread each
    model = llmdecode.build(a.device)
    g = torch.Generator().manual_seed(3)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (a.prompt,), generator=g).tolist() for _ in range(N_PROMPTS)]
    ref = Slot(llmdecode, model, a.device)
    want = [ref.generate(llmdecode.greedy_step, model, p, a.steps) for p in prompts]
    rows = []
    for path in a.paths.split(","):
        t0 = time.perf_counter()
        try:
            if path == "load_packaged":
                step = precompile_runtime.load_packaged(
                    "greedy_b1", package="llmdecode", strict=True
                )
                if a.device == "cuda":  # a graph per request slot (its cache's addresses)
                    step = step.with_cuda_graphs(True, max_graphs=a.clients)
            elif path == "eager":
                step = llmdecode.greedy_step
            elif path in ("compile", "compile_ro"):
                torch._dynamo.reset()  # each compile path compiles for itself
                mode = "reduce-overhead" if path == "compile_ro" else None
                step = torch.compile(llmdecode.greedy_step, mode=mode)
            else:
                sys.exit(f"unknown path {path!r}: one of {', '.join(PATHS)}")
            row = run_path(path, step, model, llmdecode, a, prompts, want)
        except Exception as e:  # noqa: BLE001 - reported in the table
            row = {"path": path, "errors": [f"{type(e).__name__}: {str(e)[:300]}"]}
        row["load_s"] = time.perf_counter() - t0 - row.get("warmup_s", 0.0)
        rows.append(row)
        print(json.dumps(row), flush=True)
        _sync(a.device)
    report = _table(rows, a, model)
    print(report)
    if a.out:
        Path(a.out).write_text(report, encoding="utf-8")


def _table(rows: list, a: argparse.Namespace, model: Any) -> str:
    import torch

    host = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    if a.device == "cuda":
        host += f", {torch.cuda.get_device_name(0)}"
    base = next((r for r in rows if r["path"] == "eager" and "rps" in r), None)
    n_params = sum(p.numel() for p in model.parameters())
    lines = [
        f"# Greedy decoding behind FastAPI on uvicorn: {a.device}",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}, {host}. "
        f"Generated by `bench/serve_http.py --device {a.device}`: a Llama-shaped model of "
        f"{n_params / 1e6:.1f}M parameters ({model.dtype}), {a.clients} clients over loopback, "
        f"{a.requests} timed requests of {a.prompt} prompt tokens + {a.steps} generated, a StaticCache "
        "per request slot; one run. `wrong`: answers whose tokens differ from eager's for that prompt "
        "(computed outside the server). `warm-up s`: the first request of every client at once "
        "(compiling, graph recordings; the serving process starts with empty Inductor/Triton caches, "
        "which the paths then share, as in one serving process's lifetime). Host load from other "
        f"work: {os.getloadavg()[0]:.1f} (1-minute average at the end).",
        "",
        "| path | requests/s | vs eager | p50 ms | p99 ms | warm-up s | wrong | errors |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        if "rps" not in r:
            lines.append(
                f"| {r['path']} | - | - | - | - | - | - | {'; '.join(r.get('errors', []))[:300]} |"
            )
            continue
        ratio = f"{r['rps'] / base['rps']:.2f}x" if base else "-"
        lines.append(
            f"| {r['path']} | {r['rps']:.1f} | {ratio} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
            f"{r['warmup_s']:.1f} | {r['wrong']} of {r['answers']} | "
            f"{'; '.join(r['errors'])[:300] or '-'} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
