"""Serve every case of the model matrix from the installed wheel and compare with
eager: `python serve_check.py DEVICE CASE...` prints one JSON object.

Run in a fresh process (tests/test_models.py, bench/models.py, scripts/gpu_check.sh)
with PRECOMPILE_NO_COMPILE=1 and empty compiler caches. Per case: the largest
difference to eager (outputs; for a training step, every parameter and buffer after
3 optimizer steps), the result's type and key/attribute access, and the modules of
the compiler stack (torch._inductor, torch._dynamo, triton) that loading and calling
imported beyond what the model's library and its eager call had already imported.
"""

import dataclasses
import json
import sys
import time

import modelzoo
import torch

import precompile_runtime

COMPILER = ("torch._inductor", "torch._dynamo", "triton")


def _compiler_modules():
    return {
        m for m in sys.modules if m in COMPILER or m.startswith(tuple(c + "." for c in COMPILER))
    }


def _diff(got, want, path="result"):
    """Largest absolute difference; raises AssertionError on another structure."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got).__name__}, eager gives a tensor"
        assert got.shape == want.shape and got.dtype == want.dtype, (
            f"{path}: {got.shape}/{got.dtype} vs {want.shape}/{want.dtype}"
        )
        return (got.float() - want.float()).abs().max().item() if want.numel() else 0.0
    assert type(got) is type(want), (
        f"{path}: {type(got).__name__}, eager gives {type(want).__name__}"
    )
    if dataclasses.is_dataclass(want) and hasattr(want, "keys"):  # a transformers ModelOutput
        assert list(got.keys()) == list(want.keys()), (
            f"{path}: keys {list(got.keys())} vs {list(want.keys())}"
        )
        return max(
            [0.0]
            + [
                max(
                    _diff(got[k], want[k], f"{path}[{k!r}]"),
                    _diff(getattr(got, k), want[k], f"{path}.{k}"),
                )
                for k in want.keys()
            ]
        )
    if isinstance(want, (tuple, list)):
        assert len(got) == len(want), path
        return max([0.0] + [_diff(g, w, f"{path}[{i}]") for i, (g, w) in enumerate(zip(got, want))])
    if isinstance(want, dict):
        assert list(got) == list(want), path
        return max([0.0] + [_diff(got[k], want[k], f"{path}[{k!r}]") for k in want])
    assert got == want, f"{path}: {got!r} vs {want!r}"
    return 0.0


def _state(model):
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def check(name, device):
    case = modelzoo.CASES[name]
    out = {"type": None, "sizes": []}
    if case.train:
        eager_model, inputs = modelzoo.example(name, device)
        opt = torch.optim.SGD(eager_model.parameters(), lr=0.05)
        eager_losses = []
        for _ in range(3):
            eager_losses.append(case.fn(eager_model, *inputs))
            opt.step()
            opt.zero_grad()
    else:
        model, inputs = modelzoo.example(name, device)
        want = case.fn(model, *inputs)
        out["type"] = type(want).__name__
    before = _compiler_modules()
    t0 = time.perf_counter()
    fn = precompile_runtime.load_packaged(name, package="modelzoo", strict=True)
    out["load_seconds"] = time.perf_counter() - t0
    if case.train:
        served_model, _ = modelzoo.example(name, device)
        opt = torch.optim.SGD(served_model.parameters(), lr=0.05)
        err = 0.0
        for i in range(3):
            err = max(err, _diff(fn(served_model, *inputs), eager_losses[i], f"loss of step {i}"))
            opt.step()
            opt.zero_grad()
        want, got = _state(eager_model), _state(served_model)
        assert list(got) == list(want)
        err = max([err] + [_diff(got[k], want[k], k) for k in want])
    else:
        got = fn(model, *inputs)
        err = _diff(got, want)
        if hasattr(want, "keys") and "logits" in want.keys():  # attribute and key access
            assert got.logits is got["logits"]
        for sizes in case.serve_sizes:
            other = tuple(case.inputs(device, **sizes))
            err = max(err, _diff(fn(model, *other), case.fn(model, *other), f"result at {sizes}"))
            out["sizes"].append(sizes)
    out["max_abs_err"] = err
    out["new_compiler_modules"] = sorted(_compiler_modules() - before)
    return out


def decode_check(device):
    """Greedy decoding from the wheel's decoding targets, against eager: two requests
    (two StaticCache objects) served interleaved, prefill then one-token steps; and the
    export wrapper. Returns the token lists and what the served caches hold."""
    model = modelzoo.build_llama().to(device)
    prompts = [modelzoo.prompt(device, 6, seed=3), modelzoo.prompt(device, 11, seed=4)]
    with torch.no_grad():
        eager = [
            list(
                modelzoo.greedy(
                    modelzoo.lm_step,
                    modelzoo.lm_step,
                    model,
                    modelzoo.static_cache(model, device),
                    p,
                )
            )
            for p in prompts
        ]
        eager_wrapper = modelzoo.wrapper_greedy(
            modelzoo.wrapper_step, modelzoo.export_wrapper(model, device), prompts[0]
        )
    prefill = precompile_runtime.load_packaged("llama_prefill", package="modelzoo", strict=True)
    decode = precompile_runtime.load_packaged("llama_decode", package="modelzoo", strict=True)
    step = precompile_runtime.load_packaged("llama_wrapper_decode", package="modelzoo", strict=True)
    caches = [modelzoo.static_cache(model, device) for _ in prompts]
    runs = [modelzoo.greedy(prefill, decode, model, c, p) for c, p in zip(caches, prompts)]
    served = [[], []]
    with torch.no_grad():  # served as captured: a no_grad capture is refused with grad on
        for _ in range(modelzoo.DECODE_STEPS):  # two requests, a step of each in turn
            for i, r in enumerate(runs):
                served[i].append(next(r))
        wrapper = modelzoo.export_wrapper(model, device)
        served_wrapper = modelzoo.wrapper_greedy(step, wrapper, prompts[0])
    return {
        "eager": eager,
        "served": served,
        "eager_wrapper": eager_wrapper,
        "served_wrapper": served_wrapper,
        "cache_lengths": [int(c.layers[0].cumulative_length) for c in caches],
        "wrapper_buffer_is_cache": wrapper.key_cache_0 is wrapper.static_cache.layers[0].keys,
        "wrapper_cache_written": bool(wrapper.key_cache_0.abs().sum() > 0),
    }


def main():
    if sys.argv[2:] == ["--decode"]:
        try:
            print(json.dumps(decode_check(sys.argv[1])))
        except Exception as e:
            print(json.dumps({"error": f"{type(e).__name__}: {e}"[:3000]}))
        return
    device, names = sys.argv[1], sys.argv[2:]
    # TF32 off on both sides: the comparison measures the pair, not TF32's rounding
    # (eager and the frozen kernels may pick other cuDNN algorithms and layouts; with
    # TF32 on, resnet18's training step drifted 0.04 apart over 3 steps on the H200)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = {}
    for name in names:
        try:
            results[name] = check(name, device)
        except Exception as e:  # reported per case; the caller asserts
            results[name] = {"error": f"{type(e).__name__}: {e}"[:3000]}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
