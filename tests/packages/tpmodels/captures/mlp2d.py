"""Capture script of target `mlp2d`: the MLP sharded over the `tp` part of a (dp=2, tp=2)
mesh of 4 ranks (the eager engine: the test is about the groups, not the kernels)."""

import torch
import tpmodels

import precompile_build

mesh = tpmodels.init_world(dp=2)
model = tpmodels.build_mlp(mesh)
with torch.no_grad(), precompile_build.capture(tpmodels.mlp_call, engine="eager") as f:
    f(model, tpmodels.mlp_input())
