"""Tensor-parallel Llama on one GPU: a 70B-shaped rank built alone
under the fake process group, and two gloo ranks served from one pair.

    python bench/tp_llama.py --out bench/results            # both parts, ends within --budget (530 s)
    python bench/tp_llama.py --out DIR --layers 40          # part (a) cut down when time is short
    python bench/tp_llama.py --out DIR --parts serve        # part (b) only

The model is transformers' ``LlamaForCausalLM`` shaped like Llama 3 70B (hidden 8192,
intermediate 28672, 64 heads / 8 KV heads, vocab 128256, bf16; ``--layers`` of its 80
layers), made on the meta device, sharded with ``parallelize_module`` and then
materialised shard by shard on the GPU (``to_empty`` + random values: no full weight
ever exists). The captured function is the last position's logits of a 1 x
``--tokens`` prompt. Each step runs in a fresh process with empty Inductor and Triton
caches; the capture goes through the build (``python -m precompile_build capture``
on a generated project whose target has ``world-size``), with this checkout first on
the path.

(a) ``shard``: rank 0 of TP = 8 (q/k/v/gate/up colwise, o/down rowwise, the embedding
    and lm_head sharded on the vocabulary: about 17.5 GB at 80 layers), built on one
    GPU, so ``distributed = auto`` runs rank 0 alone under the fake backend. Against
    ``torch.compile`` cold of the same shard (the same script, the same fake group):
    seconds from "model exists" to the first result, and the peak GPU memory of each
    (the capture's from the build's stats: ``peak_memory.gpu_bytes``; torch.compile's
    ``torch.cuda.max_memory_allocated``), each process's setup reported apart.
(b) ``serve``: a TP = 2 pair of the same shape (``--serve-layers`` layers; the
    embedding and lm_head replicated, so the only collective is the rowwise
    all-reduce), also built under the fake backend, then served by ``torchrun
    --nproc_per_node 2`` with both ranks on cuda:0 and gloo (NCCL needs one GPU per
    rank) under the serving guard (``PRECOMPILE_NO_COMPILE=1``): per rank the
    max |served - eager TP=2| of the logits against max |eager|, 16 greedy tokens
    over a sliding window of the prompt, served and eager, and the same 16 steps
    teacher-forced on eager's tokens (:func:`forced_greedy`: a step that differs shows
    eager's margin between the two tokens against that step's max difference, which
    tells a bf16 tie of random weights from a wrong answer).

Results: ``tp_llama.json`` and ``tp_llama.md`` in ``--out``, written again after each
step. Each step has a time limit taken from ``--budget`` (part (b): at most 150 s for
its capture and 120 s for serving; then part (a)'s capture and torch.compile half of
what is left each); a step that runs out is killed and reported as timed out (for
torch.compile a lower bound of its seconds), so one run ends in time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGE = "llamatp"
SHAPE = dict(
    hidden_size=8192,
    intermediate_size=28672,
    num_attention_heads=64,
    num_key_value_heads=8,
    vocab_size=128256,
    rope_theta=500000.0,
    max_position_embeddings=8192,
    tie_word_embeddings=False,
)
LAYER_PLAN = {
    "self_attn.q_proj": "colwise",
    "self_attn.k_proj": "colwise",
    "self_attn.v_proj": "colwise",
    "self_attn.o_proj": "rowwise",
    "mlp.gate_proj": "colwise",
    "mlp.up_proj": "colwise",
    "mlp.down_proj": "rowwise",
}
TINY = dict(
    SHAPE,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=8,
    num_key_value_heads=8,
    vocab_size=256,
)  # --tiny: the CPU smoke test's shape (every size divisible by 8)
GREEDY = 16


# ---- the model, as a torchrun server builds it (runs in the capture/serve processes) ----
def build(layers: int, vocab_parallel: bool, device: str = "cuda", tiny: bool = False):
    """Rank ``dist.get_rank()``'s shard of the 70B-shaped Llama (``tiny``: a small one)
    with ``layers`` layers, sharded over a 1-D ``tp`` mesh of the whole world; returns
    ``(model, mesh)``."""
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh(device, (dist.get_world_size(),), mesh_dim_names=("tp",))
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, **(TINY if tiny else SHAPE))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(default)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan: dict = {
        f"model.layers.{i}.{name}": styles[style]()
        for i in range(layers)
        for name, style in LAYER_PLAN.items()
    }
    if vocab_parallel:  # as torchtitan shards Llama: the 2 x 1B vocabulary parameters too
        plan["model.embed_tokens"] = RowwiseParallel(input_layouts=Replicate())
        plan["lm_head"] = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, mesh, plan)
    model.to_empty(device=device)  # each rank's shards only, uninitialised
    gen = torch.Generator(device=device).manual_seed(0)  # the same stream on every rank
    std = 0.02 if not tiny else 0.2
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p._local_tensor if hasattr(p, "_local_tensor") else p
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                local.fill_(1.0)
            else:
                local.normal_(0.0, std, generator=gen)
    rotary = model.model.rotary_emb  # its inv_freq buffer was made on meta: made again
    model.model.rotary_emb = type(rotary)(config=cfg, device=device)
    return model, mesh


def last_logits(model, ids):
    """The captured function: the last position's logits ([batch, vocab])."""
    return model(input_ids=ids, use_cache=False).logits[:, -1]


def prompt(tokens: int, device: str = "cuda", tiny: bool = False):
    import torch

    vocab = (TINY if tiny else SHAPE)["vocab_size"]
    return torch.randint(0, vocab, (1, tokens), generator=torch.Generator().manual_seed(3)).to(
        device
    )


def sliding_greedy(fn, model, ids, steps: int = GREEDY) -> list[int]:
    """``steps`` greedy tokens through ``fn`` (called as :func:`last_logits`) over a
    window of the prompt's length: each token is appended and the oldest dropped."""
    import torch

    out = []
    for _ in range(steps):
        token = fn(model, ids).argmax(-1)
        out.append(int(token))
        ids = torch.cat([ids[:, 1:], token[:, None]], dim=1)
    return out


def forced_greedy(fn, model, ids, steps: int = GREEDY) -> dict:
    """``steps`` greedy steps over eager's own tokens (teacher-forced: both paths see the
    same ids at every step, so one flipped argmax does not change every later step).

    Returns:
        ``{"equal": steps whose argmax agree, "steps": steps, "ties": [...]}``: for each
        step that differs, eager's margin between its top token and the served one
        (``margin``, in logits) and that step's max |served - eager| (``diff``); a margin
        within the diff is a numerical tie (bf16 rounding of kernels fused otherwise),
        a larger one a wrong answer.
    """
    import torch

    equal, ties = 0, []
    for _ in range(steps):
        got, want = fn(model, ids).float(), last_logits(model, ids).float()
        top, served = want.argmax(-1), got.argmax(-1)
        if torch.equal(top, served):
            equal += 1
        else:
            ties.append(
                {
                    "margin": float(want[0, top] - want[0, served]),
                    "diff": float((got - want).abs().max()),
                }
            )
        ids = torch.cat([ids[:, 1:], top[:, None]], dim=1)
    return {"equal": equal, "steps": steps, "ties": ties}


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _model(args):
    """``build`` and ``prompt`` for a role's arguments."""
    import torch

    if args.device == "cuda":
        torch.cuda.set_device(
            int(os.environ.get("LOCAL_RANK", "0")) if args.role == "capture" else 0
        )
    shard = (
        args.what == "shard"
    )  # (a): TP=8, vocabulary sharded; (b): TP=2, embedding and lm_head whole
    model, _ = build(args.layers if shard else args.serve_layers, shard, args.device, args.tiny)
    return model, prompt(args.tokens, args.device, args.tiny)


# ---- roles -------------------------------------------------------------------------------
def role_capture(args) -> None:
    """The capture script of the generated project (run by the build as a rank)."""
    import torch

    import precompile_build

    torch.distributed.init_process_group()  # the build's torchrun environment (fake: rank 0 alone)
    model, ids = _model(args)
    _sync()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    ready = time.perf_counter()
    with torch.no_grad(), precompile_build.capture(last_logits) as f:
        f(model, ids)
    done = time.perf_counter()  # the pair is written
    timing = os.environ.get("TP_BENCH_TIMING")
    if timing:
        with open(timing, "w") as out:
            json.dump(
                {
                    "first_result_s": done - ready,
                    "weights_gpu_bytes": torch.cuda.memory_allocated() if cuda else None,
                    "gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
                },
                out,
            )


def role_compile(args) -> None:
    """torch.compile cold of the same shard, rank 0 alone under the fake backend."""
    import torch

    from precompile_build.process.world import use_fake_backend

    t0 = time.perf_counter()
    use_fake_backend()
    torch.distributed.init_process_group()
    model, ids = _model(args)
    _sync()
    ready = time.perf_counter()
    cuda = args.device == "cuda"
    weights = torch.cuda.memory_allocated() if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    fn = torch.compile(last_logits)
    with torch.no_grad():
        fn(model, ids)
    _sync()
    first = time.perf_counter() - ready
    print(
        "RESULT "
        + json.dumps(
            {
                "setup_s": ready - t0,
                "first_result_s": first,
                "weights_gpu_bytes": weights,
                "gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
            }
        ),
        flush=True,
    )


def role_serve(args) -> None:
    """One rank of ``torchrun --nproc_per_node 2``: gloo on cuda:0, the packaged pair."""
    import torch
    import torch.distributed as dist

    from precompile_runtime import load_packaged

    dist.init_process_group("gloo")  # two ranks share cuda:0: NCCL would refuse
    rank = dist.get_rank()
    model, ids = _model(args)
    fn = load_packaged("serve", package=PACKAGE, strict=True)
    with torch.no_grad():
        got, want = fn(model, ids), last_logits(model, ids)
        _sync()
        row = {
            "rank": rank,
            "kernels": fn.uses_kernels,
            "shape": list(got.shape),
            "max_abs_diff": float((got.float() - want.float()).abs().max()),
            "max_abs_value": float(want.float().abs().max()),
            "argmax_equal": bool(torch.equal(got.argmax(-1), want.argmax(-1))),
            "served_tokens": sliding_greedy(fn, model, ids),
            "eager_tokens": sliding_greedy(last_logits, model, ids),
            "forced": forced_greedy(fn, model, ids),
        }
    with open(Path(args.work) / f"serve_rank{rank}.json", "w") as f:
        json.dump(row, f)
    dist.destroy_process_group()


# ---- the orchestrator --------------------------------------------------------------------
def _env(work: Path) -> dict:
    env = dict(os.environ)
    caches = Path(tempfile.mkdtemp(prefix="caches-", dir=work))  # empty caches per process
    env.update(
        TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
        TRITON_CACHE_DIR=str(caches / "triton"),
        PRECOMPILE_CACHE_DIR=str(caches / "kernels"),
        PRECOMPILE_CACHE="0",
        PYTHONPATH=os.pathsep.join(
            p
            for p in (
                str(work / "site"),
                str(ROOT),
                str(ROOT / "runtime"),
                env.get("PYTHONPATH", ""),
            )
            if p
        ),
    )
    return env


def _project(
    work: Path, name: str, world: int, script_args: list[str], timeout: float, device: str
) -> Path:
    """A project whose one target ``name`` runs this file as its capture script."""
    proj = work / f"proj-{name}"
    shutil.rmtree(proj, ignore_errors=True)
    (proj / PACKAGE).mkdir(parents=True)
    (proj / PACKAGE / "__init__.py").write_text("")
    shutil.copyfile(Path(__file__), proj / "capture.py")
    (proj / "pyproject.toml").write_text(
        textwrap.dedent(f"""
        [project]
        name = "{PACKAGE}"
        version = "0.1.0"

        [tool.precompile]
        package = "{PACKAGE}"

        [tool.precompile.targets.{name}]
        script = "capture.py"
        args = {json.dumps(["--role", "capture", *script_args])}
        device = "{device}"
        world-size = {world}
        timeout = {int(timeout)}
        """)
    )
    return proj


def capture(
    work: Path, name: str, world: int, script_args: list[str], timeout: float, device: str
) -> dict:
    """Build target ``name`` with ``python -m precompile_build capture``; returns the
    manifest's variant (capture_seconds, capture_breakdown, peak_memory, distributed)
    plus ``wall_s`` and the build's lines, or ``{"error": ...}``."""
    proj = _project(work, name, world, script_args, timeout, device)
    out = work / f"pairs-{name}"
    timing = work / f"timing-{name}.json"
    t0 = time.perf_counter()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "precompile_build", "capture", "--out", str(out)],
            cwd=proj,
            env=dict(
                _env(work),
                PRECOMPILE_DISTRIBUTED="fake",  # one rank built alone
                TP_BENCH_TIMING=str(timing),
            ),
            capture_output=True,
            text=True,
            timeout=timeout + 60,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout + 60:.0f} s"}
    row: dict = {
        "wall_s": round(time.perf_counter() - t0, 1),
        "build_lines": [
            ln
            for ln in (p.stdout + p.stderr).splitlines()
            if ln.startswith("precompile: ") and " running " not in ln
        ][-6:],
    }
    if p.returncode != 0:
        return {**row, "error": (p.stderr or p.stdout)[-3000:]}
    manifest = json.loads((out / "manifest.json").read_text())
    variant = manifest["targets"][name]["variants"][0]
    row.update({k: v for k, v in variant.items() if k not in ("files", "fingerprint")})
    row["pair_dir"] = str(out)
    if timing.exists():  # measured in the script: model ready -> pair written
        row["script"] = json.loads(timing.read_text())
    return row


def compile_cold(work: Path, args, timeout: float) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--role",
        "compile",
        "--what",
        "shard",
        *_common(args),
    ]
    env = dict(
        _env(work),
        RANK="0",
        WORLD_SIZE="8",
        LOCAL_RANK="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT="29999",
    )
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "timed_out_s": timeout}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout)[-3000:]}
    return {**json.loads(lines[-1][len("RESULT ") :]), "wall_s": round(time.perf_counter() - t0, 1)}


def serve(work: Path, row: dict, args, timeout: float) -> dict:
    """Part (b)'s serving: the TP=2 pair as an installed package's _precompiled/, two
    gloo ranks on cuda:0 under torchrun and the serving guard."""
    site = work / "site"
    shutil.rmtree(site, ignore_errors=True)
    (site / PACKAGE).mkdir(parents=True)
    (site / PACKAGE / "__init__.py").write_text("")
    shutil.copytree(row["pair_dir"], site / PACKAGE / "_precompiled")
    env = dict(_env(work), PRECOMPILE_NO_COMPILE="1", OMP_NUM_THREADS="4")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(Path(__file__).resolve()),
        "--role",
        "serve",
        "--what",
        "serve",
        *_common(args),
        "--work",
        str(work),
    ]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout)[-3000:]}
    ranks = [json.loads((work / f"serve_rank{r}.json").read_text()) for r in range(2)]
    return {"wall_s": round(time.perf_counter() - t0, 1), "ranks": ranks}


def _common(args) -> list[str]:
    """The arguments every role takes from the orchestrator's."""
    return [
        "--layers",
        str(args.layers),
        "--serve-layers",
        str(args.serve_layers),
        "--tokens",
        str(args.tokens),
        "--device",
        args.device,
        *(["--tiny"] if args.tiny else []),
    ]


def _gib(n) -> str:
    return f"{n / 2**30:.1f} GiB" if isinstance(n, (int, float)) else "-"


def _why(error: str) -> str:
    """A failure for the table: the build's ``error:`` line where it printed one (the
    log's tail is in the JSON), else the end of what it printed."""
    said = [ln for ln in error.splitlines() if ln.startswith("error:")]
    return (said[-1] if said else error[-300:]).replace("|", "/")


def markdown(res: dict) -> str:
    lines = [
        f"# Tensor-parallel Llama on one GPU ({res.get('gpu')}, torch {res.get('torch')})",
        "",
        "`python bench/tp_llama.py "
        + " ".join(res["argv"])
        + "` (bench/tp_llama.py says what each "
        "figure is).",
        "",
    ]
    a = res.get("shard")
    if a:
        c, comp = a.get("capture") or {}, a.get("compile") or {}
        script = c.get("script") or {}
        ours = script.get("first_result_s")
        lines += [
            f"## (a) rank 0 of TP = 8, {res['layers']} layers, built alone under the fake backend",
            "",
            "| | seconds: model ready -> pair written / first result | peak GPU (weights included) |",
            "| --- | --- | --- |",
        ]
        row = "| precompile-build capture (rank 0 alone, fake backend, run by the build) |"
        if "error" in c:
            lines.append(f"{row} failed: {_why(c['error'])} | |")
        else:
            lines.append(
                f"{row} {ours:.1f} | {_gib(script.get('gpu_bytes'))} |"
                if ours is not None
                else f"{row} (no timing) | |"
            )
        row = "| torch.compile cold, same shard, same fake group |"
        if "error" in comp:
            lines.append(f"{row} failed: {_why(comp['error'])} | |")
        elif comp:
            lines.append(f"{row} {comp['first_result_s']:.1f} | {_gib(comp['gpu_bytes'])} |")
            if ours:
                ratio = f"capture / torch.compile cold: {ours / comp['first_result_s']:.2f}x the seconds"
                if script.get("gpu_bytes") and comp.get("gpu_bytes"):
                    ratio += f", {script['gpu_bytes'] / comp['gpu_bytes']:.2f}x the peak GPU memory"
                lines += ["", ratio]
        if "error" not in c:
            lines += [
                "",
                f"The shard's weights: {_gib(script.get('weights_gpu_bytes'))}. The build: "
                f"{c.get('capture_seconds')} s for the script (setup and exit included), steps "
                f"{c.get('capture_breakdown')}, peak {c.get('peak_memory')}; distributed: "
                f"{c.get('distributed')}. torch.compile's process: setup {comp.get('setup_s')} s.",
            ]
        lines.append("")
    b = res.get("serve")
    if b:
        lines += [
            f"## (b) TP = 2, {res['serve_layers']} layers: one pair (fake-built), two gloo ranks on cuda:0",
            "",
        ]
        if "error" in b.get("capture", {}):
            lines.append(f"capture failed: `{b['capture']['error'][-600:]}`")
        elif "error" in b.get("served", {}):
            lines.append(f"serving failed: `{b['served']['error'][-600:]}`")
        else:
            lines += [
                "| rank | kernels | max abs diff | max abs eager | argmax equal | 16 greedy tokens equal "
                "| teacher-forced steps equal (differing: eager's margin / max diff) |",
                "| --- | --- | --- | --- | --- | --- | --- |",
            ]
            for r in b["served"]["ranks"]:
                f = r.get("forced") or {}
                ties = ", ".join(f"{t['margin']:.3g} / {t['diff']:.3g}" for t in f.get("ties", []))
                forced = f"{f['equal']}/{f['steps']}" + (f" ({ties})" if ties else "") if f else "-"
                lines.append(
                    f"| {r['rank']} | {r['kernels']} | {r['max_abs_diff']:.4g} | {r['max_abs_value']:.4g} | "
                    f"{r['argmax_equal']} | {r['served_tokens'] == r['eager_tokens']} | {forced} |"
                )
            lines += [
                "",
                f"capture: {b['capture'].get('capture_seconds')} s; distributed: "
                f"{b['capture'].get('distributed')}",
            ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=str(HERE / "results"))
    p.add_argument(
        "--parts", default="serve,shard", help="serve (b) and/or shard (a), in that order"
    )
    p.add_argument("--layers", type=int, default=80, help="layers of the TP=8 shard (a)")
    p.add_argument("--serve-layers", type=int, default=2, help="layers of the TP=2 model (b)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--budget", type=float, default=530, help="seconds for the whole run")
    p.add_argument("--device", default="cuda", help="cuda; cpu with --tiny: the smoke test")
    p.add_argument("--tiny", action="store_true", help="a tiny Llama of the same plan (smoke test)")
    p.add_argument("--role", default=None, help=argparse.SUPPRESS)
    p.add_argument("--what", default=None, choices=("shard", "serve"), help=argparse.SUPPRESS)
    p.add_argument("--work", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role:
        {"capture": role_capture, "compile": role_compile, "serve": role_serve}[args.role](args)
        return 0
    start = time.monotonic()

    def left() -> float:
        return args.budget - (time.monotonic() - start)

    import torch

    res: dict = {
        "argv": sys.argv[1:] if argv is None else list(argv),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "layers": args.layers,
        "serve_layers": args.serve_layers,
        "tiny": args.tiny,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="tp-llama-") as tmp:
        work = Path(tmp)
        if "serve" in parts:
            b: dict = {
                "capture": capture(
                    work,
                    "serve",
                    2,
                    ["--what", "serve", *_common(args)],
                    min(150, left() - 60),
                    args.device,
                )
            }  # about 50 s on an H200
            if "error" not in b["capture"]:
                b["served"] = serve(
                    work, b["capture"], args, max(30, min(120, left()))
                )  # about 40 s
            res["serve"] = b
            write(res, out)
            print(f"(b) done at {time.monotonic() - start:.0f} s", file=sys.stderr)
        if "shard" in parts:
            a: dict = {}
            share = left() / 2  # ours, then torch.compile's: the same time each (the build's
            # subprocess gets 60 s more than the script's timeout: the script gets share - 60)
            a["capture"] = capture(
                work, "shard", 8, ["--what", "shard", *_common(args)], share - 60, args.device
            )
            print(f"(a) capture done at {time.monotonic() - start:.0f} s", file=sys.stderr)
            res["shard"] = a
            write(res, out)
            a["compile"] = compile_cold(work, args, max(60, left() - 10))
    write(res, out)
    print(markdown(res))
    return 0


def write(res: dict, out: Path) -> None:
    """``tp_llama.json`` and ``tp_llama.md`` in ``out``: what the run has so far."""
    (out / "tp_llama.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / "tp_llama.md").write_text(markdown(res))


if __name__ == "__main__":
    sys.exit(main())
