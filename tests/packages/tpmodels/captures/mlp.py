"""Capture script of target `mlp`: written as the torchrun serving code is (one rank
of the world the build or torchrun starts), then precompile_build.capture."""

import torch
import tpmodels

import precompile_build

mesh = tpmodels.init_world()
model = tpmodels.build_mlp(mesh)
with torch.no_grad(), precompile_build.capture(tpmodels.mlp_call) as f:
    f(model, tpmodels.mlp_input())
