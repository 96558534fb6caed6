"""The serving side, run by the tests under `torchrun --nproc_per_node N serve.py OUT
TARGET...` with the built wheel's contents on PYTHONPATH: each rank loads the packaged
pairs and writes what it served and what eager TP computed to OUT/rank<R>.json.

Before dist.init_process_group() each load is refused (recorded as "before_init");
`--world-of-one` (run as a single process) records the refusal of a world of 1."""

import json
import os
import sys

import torch
import torch.distributed as dist
import tpmodels

from precompile_runtime import CallError, load_packaged

out, names = sys.argv[1], sys.argv[2:]
result: dict = {"before_init": {}}
for name in names:
    try:
        load_packaged(name, package="tpmodels", strict=True)
    except CallError as e:
        result["before_init"][name] = str(e)
mesh = tpmodels.init_world(dp=2 if "mlp2d" in names else 1)
rank = dist.get_rank()
if dist.get_world_size() == 1:
    for name in names:
        try:
            load_packaged(name, package="tpmodels", strict=True)
        except CallError as e:
            result.setdefault("world_of_one", {})[name] = str(e)
else:
    with torch.no_grad():
        if "mlp" in names:
            served = load_packaged("mlp", package="tpmodels", strict=True)
            model, x = tpmodels.build_mlp(mesh), tpmodels.mlp_input()
            result["mlp"] = {
                "max_diff": float((served(model, x) - tpmodels.mlp_call(model, x)).abs().max()),
                "kernels": served.uses_kernels,
            }
        if "mlp2d" in names:  # rank 0's pair, on ranks whose tp groups are [0, 1] and [2, 3]
            served = load_packaged("mlp2d", package="tpmodels", strict=True)
            model, x = tpmodels.build_mlp(mesh), tpmodels.mlp_input()
            result["mlp2d"] = {
                "max_diff": float((served(model, x) - tpmodels.mlp_call(model, x)).abs().max()),
                "tp_ranks": dist.get_process_group_ranks(mesh.get_group(0)),
                "groups": served.metadata["collectives"],
            }
        if "llama_forward" in names:
            served = load_packaged("llama_forward", package="tpmodels", strict=True)
            model, ids = tpmodels.build_llama(mesh), tpmodels.prompt()
            got, want = served(model, ids), tpmodels.forward(model, ids)
            result["llama_forward"] = {
                "max_diff": float((got - want).abs().max()),
                "shape": list(got.shape),
                "kernels": served.uses_kernels,
            }
        if "llama_decode" in names:
            served = load_packaged("llama_decode", package="tpmodels", strict=True)
            model, ids = tpmodels.build_llama(mesh), tpmodels.prompt()
            cache = tpmodels.static_cache(model)
            step = float(
                (
                    served(model, ids[:, :1], cache, torch.tensor([0]))
                    - tpmodels.decode_step(
                        model, ids[:, :1], tpmodels.static_cache(model), torch.tensor([0])
                    )
                )
                .abs()
                .max()
            )
            result["llama_decode"] = {
                "step_max_diff": step,
                "tokens": tpmodels.greedy(served, model, ids),
                "eager_tokens": tpmodels.greedy(tpmodels.decode_step, model, ids),
                "kernels": served.uses_kernels,
            }
with open(f"{out}/rank{rank}.json", "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
# torch 2.13's gloo can abort this process in interpreter finalization, after every
# result is written ("terminate called without an active exception", no Python frame;
# 1 to 6 runs in 20 on a 2-core host, an eager-only TP script as often as a served
# pair): end here, as the results are complete, so that the test judges what was served
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
