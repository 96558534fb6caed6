"""What comparing dict versions costs per call, on CPU: the price of each covering dict
a served call's guards compare (templates/guards.py) and of what they leave out.

For N plain dicts, ns per "have any of them been written?" check in two forms: a Python
loop calling ``torch._C._dynamo.guards.dict_version`` (what templates/guards.py runs)
and ``list(map(dict_version, dicts)) == versions``. Then, for Llamas of L layers (hidden
32, transformers), how many registry dicts (``_parameters``, ``_buffers``, ``_modules``
of every submodule) a per-call check of direct registry writes would compare, and what
that loop costs for them (docs/assumed_state.md, "What is not checked").

    PYTHONPATH=$PWD:$PWD/runtime python bench/dict_versions.py --dicts 60 120 450 --layers 2 8 32
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

_VERSION = torch._C._dynamo.guards.dict_version


def _loop(pairs: list) -> bool:
    for d, v in pairs:
        if _VERSION(d) != v:
            return False
    return True


def _mapped(dicts: list, versions: list) -> bool:
    return list(map(_VERSION, dicts)) == versions


def _ns(fn, calls: int, rounds: int) -> float:
    """Median over ``rounds`` of the ns per call of ``fn()``."""
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter_ns() - t0) / calls)
    return statistics.median(out)


def _llama_registries(layers: int) -> list:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return [
        r for m in LlamaForCausalLM(cfg).modules() for r in (m._parameters, m._buffers, m._modules)
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dicts", type=int, nargs="*", default=[60, 120, 450])
    ap.add_argument("--layers", type=int, nargs="*", default=[2, 8, 32])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(
        f"torch {torch.__version__}, Python {platform.python_version()}, {platform.machine()}; "
        f"median of {a.rounds} rounds x {a.calls} calls"
    )
    print("| dicts | loop (ns/call) | map (ns/call) | loop per dict (ns) |\n|---|---|---|---|")
    for n in a.dicts:
        dicts = [type("O", (), {})().__dict__ for _ in range(n)]
        versions = list(map(_VERSION, dicts))
        pairs = list(zip(dicts, versions))
        loop = _ns(lambda p=pairs: _loop(p), a.calls, a.rounds)
        mapped = _ns(lambda d=dicts, v=versions: _mapped(d, v), a.calls, a.rounds)
        print(f"| {n} | {loop:.0f} | {mapped:.0f} | {loop / n:.1f} |")
    if a.layers:
        print("\n| Llama layers | registry dicts | loop over them (ns/call) |\n|---|---|---|")
    for layers in a.layers:
        regs = _llama_registries(layers)
        pairs = [(d, _VERSION(d)) for d in regs]
        print(
            f"| {layers} | {len(regs)} | {_ns(lambda p=pairs: _loop(p), a.calls, a.rounds):.0f} |"
        )


if __name__ == "__main__":
    main()
