"""The export tracers' graph (precompile_build/capturing/aten_export.py): one trace to
functional ATen where torch has the entry point, the two public passes where it has
not, and the same graph either way: what the rest of the pipeline needs of it."""

from __future__ import annotations

import copy
import inspect

import pytest

torch = pytest.importorskip("torch")

from precompile_build.capturing import aten_export  # noqa: E402
from precompile_build.capturing.tracing import trace_call  # noqa: E402
from precompile_build.errors import CaptureError  # noqa: E402

aten = torch.ops.aten


class Block(torch.nn.Module):
    """A linear, an attention, a buffer and an argument written in place."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x, cache):
        self.calls.add_(1)
        q = self.proj(x).view(1, 2, 4, 4)  # (batch, heads, tokens, head dim)
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        cache.mul_(0.5).add_(y.sum(0))
        return y.flatten(), torch.relu(x)


def block_call(model, x, cache):
    return model(x, cache)


def _block():
    torch.manual_seed(0)
    return Block(), torch.randn(4, 8), torch.randn(2, 4, 4)


def _ops(gm) -> dict:
    counts: dict = {}
    for n in gm.graph.nodes:
        if n.op == "call_function":
            counts[n.target] = counts.get(n.target, 0) + 1
    return counts


def _spy_one_pass(monkeypatch) -> list:
    """Calls of the one-pass export (a list that grows by one per trace through it)."""
    calls: list = []
    real = aten_export._one_pass_export

    def spied():
        one_pass = real()
        assert one_pass is not None, "this torch has the one-pass entry point"

        def counted(*a):
            calls.append(1)
            return one_pass(*a)

        return counted

    monkeypatch.setattr(aten_export, "_one_pass_export", spied)
    return calls


def test_the_one_pass_graph_is_functional_with_writes_copied_back_last(monkeypatch):
    model, x, cache = _block()
    calls = _spy_one_pass(monkeypatch)
    traced = trace_call(block_call, (model, x, cache), {}, target="t", tracer="export")
    assert calls == [1] and traced.metadata["tracer"] == "export"
    gm = traced.graph_module
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    compute = [n for n in gm.graph.nodes if n.op == "call_function"]
    copies = [n for n in compute if n.target is aten.copy_.default]
    # functional: the only writes are the copies back into the written inputs, after the rest
    assert all(not n.target._schema.is_mutable for n in compute if n not in copies)
    assert compute[-len(copies) :] == copies
    names = traced.metadata["param_names"]
    written = sorted(placeholders.index(c.args[0]) for c in copies)
    assert written == traced.metadata["mutated_inputs"] == [names.index("m0.calls"), len(names) + 1]
    # composite ops whole (the reference widens an SDPA, not a backend's flash kernel)
    ops = _ops(gm)
    assert (
        ops.get(aten.linear.default) == 1
        and ops.get(aten.scaled_dot_product_attention.default) == 1
    )
    assert not any(n.meta.get("stack_trace") for n in gm.graph.nodes) or not hasattr(
        torch.fx.config, "do_not_emit_stack_traces"
    )
    output = next(n for n in gm.graph.nodes if n.op == "output")
    assert all(output in n.users for n in compute if n.target is aten.detach.default)

    # the graph computes and writes what the call does
    want_model, want_cache = copy.deepcopy(model), cache.clone()
    want = block_call(want_model, x, want_cache)
    inputs = [t.clone() for t in traced.example_inputs]
    got = gm(*inputs)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    torch.testing.assert_close(inputs[names.index("m0.calls")], want_model.calls)
    torch.testing.assert_close(inputs[len(names) + 1], want_cache)


def _two_pass(monkeypatch):
    runs: list = []
    real = torch.export.ExportedProgram.run_decompositions

    def counted(self, *a, **k):
        runs.append(a or k)
        return real(self, *a, **k)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    return runs


import torch.export._trace  # noqa: E402

_real_export = torch.export._trace._export


def _export_without_pre_dispatch(
    mod, args, kwargs=None, dynamic_shapes=None, *, strict=True, **rest
):
    return _real_export(
        mod, args, kwargs, dynamic_shapes, strict=strict, **rest
    )  # torch.export.export's


@pytest.mark.parametrize("change", ["missing", "other signature"])
def test_without_the_one_pass_entry_point_the_two_passes_make_the_same_graph(monkeypatch, change):
    model, x, cache = _block()
    one = trace_call(
        block_call, (model, copy.deepcopy(x), cache.clone()), {}, target="t", tracer="export"
    )
    if change == "missing":  # a name torch has not (torch.export.export keeps working)
        monkeypatch.setattr(
            aten_export,
            "_ENTRY_POINTS",
            (("torch.export._trace", "_export_gone"), *aten_export._ENTRY_POINTS[1:]),
        )
    else:
        monkeypatch.setattr(torch.export._trace, "_export", _export_without_pre_dispatch)
    assert aten_export._one_pass_export() is None
    runs = _two_pass(monkeypatch)
    two = trace_call(block_call, (model, x, cache), {}, target="t", tracer="export")
    assert runs == [({},)]  # run_decompositions({}): the functional composite ops kept
    ignored = {aten._assert_tensor_metadata.default}  # the pre-dispatch pass's checks
    assert {k: v for k, v in _ops(two.graph_module).items() if k not in ignored} == _ops(
        one.graph_module
    )
    assert two.metadata["mutated_inputs"] == one.metadata["mutated_inputs"]
    inputs = [t.clone() for t in two.example_inputs]
    for g, w in zip(
        two.graph_module(*inputs), one.graph_module(*[t.clone() for t in one.example_inputs])
    ):
        torch.testing.assert_close(g, w)


def test_a_call_the_one_pass_refuses_gets_the_two_passes(monkeypatch):
    # what they trace is served; what they refuse fails with their error (the one
    # docs/errors.md quotes), not the one pass's
    real = aten_export._one_pass_export()

    def refusing():
        def one_pass(*a):
            raise RuntimeError("the one pass refuses (simulated)")

        return one_pass

    monkeypatch.setattr(aten_export, "_one_pass_export", refusing)
    runs = _two_pass(monkeypatch)
    model, x, cache = _block()
    traced = trace_call(block_call, (model, x, cache), {}, target="t", tracer="export")
    assert runs == [({},)] and real is not None
    assert _ops(traced.graph_module).get(aten.scaled_dot_product_attention.default) == 1
    with pytest.raises(
        CaptureError, match=r"data-dependent branch .* export: GuardOnDataDependentSymNode"
    ) as e:
        trace_call(
            lambda x: x * 2 if x.sum() > 0 else x, (torch.ones(3),), {}, target="t", tracer="export"
        )
    assert (
        "simulated" not in str(e.value) and len(runs) == 1
    )  # it failed in the first of the two passes


def test_the_one_pass_entry_point_is_there_on_this_torch():
    # the CI's torch versions have it; a torch that drops it is still served (test
    # above), but slower: this says when that happens
    one_pass = aten_export._one_pass_export()
    assert one_pass is not None, inspect.signature(torch.export._trace._export)


@pytest.mark.parametrize("grad", [True, False])
def test_the_traced_code_sees_the_callers_grad_mode(grad):
    # the one pass traces under no_grad; the user's code must not see that (a library
    # fast path such as nn.MultiheadAttention's depends on it)
    def fn(x):
        return x * (2 if torch.is_grad_enabled() else 3)

    x = torch.randn(3)
    with torch.set_grad_enabled(grad):
        traced = trace_call(fn, (x,), {}, target="t", tracer="export")
    (got,) = traced.graph_module(*traced.example_inputs)
    torch.testing.assert_close(got, x * (2 if grad else 3))


def _step_backward(model, x):
    loss = model(x).square().mean()
    loss.backward()
    return loss.detach()


def _step_autograd_grad(model, x):
    loss = model(x).square().mean()
    (g,) = torch.autograd.grad(loss, [model.weight])
    return loss.detach(), g


# expected: the case runs a backward, which Dynamo does not trace
@pytest.mark.filterwarnings("ignore:.*the function runs a backward:UserWarning")
@pytest.mark.parametrize(
    "step", [_step_backward, _step_autograd_grad], ids=["backward", "autograd.grad"]
)
def test_a_backward_inside_is_seen_as_one(monkeypatch, step):
    # the one pass fails inside autograd (the kept composite ops have no backward
    # there): export refuses the call as a training step, auto traces it with make_fx
    torch.manual_seed(0)
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    runs = _two_pass(monkeypatch)
    with pytest.raises(CaptureError, match=r"runs a backward .*tracer='make_fx' or 'auto'"):
        trace_call(step, (model, x), {}, target="t", tracer="export")
    traced = trace_call(step, (model, x), {}, target="t", tracer="auto")
    assert (
        traced.metadata["tracer"] == "make_fx" and runs == []
    )  # no second export of a training step
    want_model = copy.deepcopy(model)
    want = step(want_model, x)
    got = traced.graph_module(*[t.clone() for t in traced.example_inputs])
    if step is _step_backward:  # the loss, then the parameters' gradients
        assert traced.metadata["grad_param_indices"] == [0, 1]
        want = (want, want_model.weight.grad, want_model.bias.grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
