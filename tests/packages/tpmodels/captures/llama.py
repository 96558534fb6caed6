"""Capture script of targets `llama_forward` and `llama_decode` (argument `forward` or
`decode`): one rank of a tensor-parallel tiny Llama, as its torchrun server builds it."""

import sys

import torch
import tpmodels

import precompile_build

mesh = tpmodels.init_world()
model = tpmodels.build_llama(mesh)
ids = tpmodels.prompt()
with torch.no_grad():
    if sys.argv[1] == "forward":
        with precompile_build.capture(tpmodels.forward) as f:
            f(model, ids)
    else:
        with precompile_build.capture(tpmodels.decode_step) as f:
            f(model, ids[:, :1], tpmodels.static_cache(model), torch.tensor([0]))
