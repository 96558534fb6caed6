"""Helpers that one job shares with another: one walk, one parse."""

from __future__ import annotations

import torch

from precompile_build.capturing import sharing
from precompile_build.templates import module_settings
from precompile_build.wheels.rewrite import insert_requires, requirement_of, requires_project


def test_metadata_requirements_are_read_with_packaging():
    assert str(requirement_of("Requires-Dist: torch==2.13.0; sys_platform == 'linux'")) == (
        'torch==2.13.0; sys_platform == "linux"'
    )
    assert requirement_of("Requires-Python: >=3.9") is None
    assert requirement_of("Requires-Dist: not a requirement !!") is None
    assert requires_project("Requires-Dist: Torch[opt]>=2", "torch")
    assert not requires_project(
        "Requires-Dist: torchvision==0.29", "torch"
    )  # (the old prefix split)
    lines = ["Name: p", "Requires-Dist: a", "Summary: s"]
    assert insert_requires(lines, ["Requires-Dist: b"]) == [
        "Name: p",
        "Requires-Dist: a",
        "Requires-Dist: b",
        "Summary: s",
    ]
    assert insert_requires(["Name: p"], ["Requires-Dist: b"]) == ["Name: p", "Requires-Dist: b"]


def test_one_walk_of_a_models_tensors_and_submodules():
    """What tracing records and what the driver checks at a call come from one walk
    (module_settings.py, copied into the source half)."""
    a = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2), torch.nn.Linear(2, 2))
    a[2].weight = a[0].weight  # tied: lifted once
    names, tensors = module_settings.module_tensors([a])
    assert names == [
        "m0.0.weight",
        "m0.0.bias",
        "m0.1.weight",
        "m0.1.bias",
        "m0.2.bias",
        "m0.1.running_mean",
        "m0.1.running_var",
        "m0.1.num_batches_tracked",
    ]
    assert len({id(t) for t in tensors}) == len(tensors)
    assert module_settings.submodules(a) == [a, a[0], a[1], a[2]]


def test_writes_is_false_for_what_is_no_aten_op():
    g = torch.fx.symbolic_trace(lambda x: x.add_(1))
    x, node = [n for n in g.graph.nodes if n.op == "placeholder"][0], None
    node = next(n for n in g.graph.nodes if n.op == "call_method")
    assert not sharing.writes(node, x)  # a method call, not an ATen overload


def test_writes_sees_an_aten_op_writing_its_input():
    from torch.fx.experimental.proxy_tensor import make_fx

    g = make_fx(lambda x, y: (x.add_(1), y * 2))(torch.ones(2), torch.ones(2))
    x, y = [n for n in g.graph.nodes if n.op == "placeholder"]
    ops = [n for n in g.graph.nodes if n.op == "call_function"]
    assert [sharing.writes(n, x) for n in ops] == [True, False]
    assert not any(sharing.writes(n, y) for n in ops)
