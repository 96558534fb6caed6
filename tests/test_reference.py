"""The wide reference of validation: it runs graphs whose views depend on
the strides the narrow dtype's kernel chose, and it widens the weights op by op.

An 8B Llama on CUDA failed validation at a ``view`` of the attention output after
its transpose: bf16 flash attention writes (B, L, H, D) memory, the fp64 math kernel
(B, H, L, D), so the view the trace recorded is not valid in fp64. On the CPU every
SDPA kernel writes (B, H, L, D); the custom ops below choose their output layout by
dtype, as those kernels do, to make the same graphs here.
"""

from __future__ import annotations

import pytest

import precompile_build
from precompile_build.capturing import sharing
from precompile_build.capturing.tracing import trace_call
from precompile_build.errors import CaptureError
from precompile_build.validation import reference, validate

torch = pytest.importorskip("torch")


def _narrow(dtype) -> bool:
    return dtype in (torch.bfloat16, torch.float16)


@torch.library.custom_op("precompile_test::heads_last", mutates_args=())
def heads_last(x: torch.Tensor) -> torch.Tensor:
    """``x * 2`` of a (B, H, L, D) tensor, written in (B, L, H, D) memory in bf16/fp16
    (as CUDA's flash attention writes its output), contiguous in other dtypes."""
    out = x * 2
    return (
        out.transpose(1, 2).contiguous().transpose(1, 2) if _narrow(x.dtype) else out.contiguous()
    )


@heads_last.register_fake
def _(x):
    b, h, n, d = x.shape
    if _narrow(x.dtype):
        return torch.empty_strided(
            x.shape, (n * h * d, d, h * d, 1), dtype=x.dtype, device=x.device
        )
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@torch.library.custom_op("precompile_test::channels_last_double", mutates_args=())
def channels_last_double(x: torch.Tensor) -> torch.Tensor:
    """``x * 2`` of an (N, C, H, W) tensor, channels-last in bf16/fp16 (as a oneDNN or
    cuDNN convolution chooses), contiguous in other dtypes."""
    out = (x * 2).contiguous()
    return out.to(memory_format=torch.channels_last) if _narrow(x.dtype) else out


@channels_last_double.register_fake
def _(x):
    fmt = torch.channels_last if _narrow(x.dtype) else torch.contiguous_format
    return torch.empty(x.shape, dtype=x.dtype, device=x.device).to(memory_format=fmt)


class _Attention(torch.nn.Module):
    def __init__(self, d=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        q = self.qkv(x).view(b, n, self.heads, d // self.heads).transpose(1, 2)
        y = torch.ops.precompile_test.heads_last(q)
        return self.out(y.transpose(1, 2).reshape(b, n, d))  # a view in the bf16 layout


class _Patches(torch.nn.Module):
    def __init__(self, c=8):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, c, 3, padding=1)

    def forward(self, x):
        y = torch.ops.precompile_test.channels_last_double(self.conv(x))
        return y.permute(0, 2, 3, 1).reshape(y.shape[0], -1)  # flattened NHWC: a view


_CASES = {
    "attention output after its transpose": (_Attention, (2, 6, 32)),
    "channels-last convolution output": (_Patches, (2, 3, 5, 5)),
}


@pytest.mark.parametrize("case", sorted(_CASES))
def test_a_view_valid_only_in_the_narrow_kernels_layout_runs_in_fp64(case):
    model_cls, shape = _CASES[case]
    torch.manual_seed(0)
    model = model_cls().to(torch.bfloat16)
    x = torch.randn(shape).to(torch.bfloat16)
    traced = trace_call(lambda m, x: m(x), (model, x), {}, target="t")
    assert any(
        n.target is torch.ops.aten.view.default
        for n in traced.graph_module.graph.nodes
        if n.op == "call_function"
    )
    (ref,), _, info = reference.reference_run(traced.graph_module, traced.example_inputs, "cpu")
    assert ref.dtype == torch.float64 and info["reference"] == "float64"
    wide = model_cls()
    wide.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    torch.testing.assert_close(ref, wide.double()(x.double()), rtol=1e-12, atol=1e-12)
    case = validate.compare(
        lambda args: list(traced.graph_module(*args)),
        traced,
        traced.example_inputs,
        "the example inputs",
        "t",
        {},
    )
    assert case["reference"] == "float64"


@pytest.mark.parametrize("case", sorted(_CASES))
def test_the_frozen_engine_captures_the_view(tmp_path, case):
    model_cls, shape = _CASES[case]
    torch.manual_seed(0)
    model = model_cls().to(torch.bfloat16)
    x = torch.randn(shape).to(torch.bfloat16)
    with precompile_build.capture(
        lambda m, x: m(x),
        engine="frozen",
        target="t",
        artifact_path=tmp_path / "t.py",
        cache_path=tmp_path / "t.cache",
    ) as f:
        got = f(model, x)
    from precompile_build.builder.pairs import read_source_metadata

    meta = read_source_metadata((tmp_path / "t.py").read_bytes(), what="pair")
    assert meta["validation"]["reference"] == "float64"
    torch.testing.assert_close(got, model(x))


def test_parameters_are_widened_one_op_at_a_time():
    # the reference never holds two wide weights of this stack at once: the widened
    # copies made per op are dropped when that op ran
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)]).to(torch.bfloat16)
    x = torch.randn(4, 64).to(torch.bfloat16)
    traced = trace_call(lambda m, x: m(x), (model, x), {}, target="t")
    alive, most = {}, [0]
    to = torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if out is not self and out.dtype == torch.float64 and out.numel() == 64 * 64:
            import weakref

            key = id(out)
            alive[key] = weakref.finalize(out, alive.pop, key, None)
            most[0] = max(most[0], len(alive))
        return out

    torch.Tensor.to = counting_to
    try:
        (ref,), inputs_after, _ = reference.reference_run(
            traced.graph_module, traced.example_inputs, "cpu"
        )
    finally:
        torch.Tensor.to = to
    assert most[0] == 1  # six weights widened, one at a time
    assert all(
        a.data_ptr() == b.data_ptr() and a.dtype == torch.bfloat16  # not copied
        for a, b in zip(inputs_after, traced.example_inputs)
    )
    want = x.double()
    for layer in model:
        want = torch.nn.functional.linear(want, layer.weight.double(), layer.bias.double())
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)


def test_inputs_the_graph_writes_are_copied_and_the_rest_shared():
    torch.manual_seed(0)
    bn = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)).train()
    x = torch.randn(4, 8)
    traced = trace_call(lambda m, x: m(x), (bn, x), {}, target="t")
    names = traced.metadata["param_names"]
    written = {names[i] for i in sharing.written_inputs(traced.graph_module) if i < len(names)}
    assert {"m0.1.running_mean", "m0.1.running_var", "m0.1.num_batches_tracked"} <= written
    assert not written & {"m0.0.weight", "m0.0.bias", "m0.1.weight", "m0.1.bias"}
    by_name = dict(zip(names, traced.example_inputs))
    own = {"m0." + k: v for k, v in [*bn.named_parameters(), *bn.named_buffers()]}
    for name in names:  # shared with the model: the same memory; written: a copy
        shares = by_name[name].data_ptr() == own[name].data_ptr()
        assert shares is (name not in written), name


def _linear_stack():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)).to(torch.bfloat16)
    x = torch.randn(4, 16).to(torch.bfloat16)
    return model, x, trace_call(lambda m, x: m(x), (model, x), {}, target="t")


def test_frozen_code_that_writes_a_shared_weight_is_refused():
    # the weights are shared with the model, not cloned: a kernel writing one is found
    # by its digest, and refused as before
    model, x, traced = _linear_stack()

    def writes_a_weight(args):
        outs = list(traced.graph_module(*args))
        args[0].view(-1)[3] += 1  # m.0.weight
        return outs

    with pytest.raises(
        CaptureError,
        match=r"target 't': the frozen kernels wrote to parameter/buffer "
        r"m.0.weight after the call, which the traced graph leaves alone",
    ):
        validate.compare(
            writes_a_weight, traced, traced.example_inputs, "the example inputs", "t", {}
        )


def test_where_no_reference_fits_the_values_are_checked_against_the_graph(monkeypatch):
    model, x, traced = _linear_stack()

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")

    monkeypatch.setattr(reference, "reference_run", out_of_memory)
    graph = lambda args: list(traced.graph_module(*args))  # noqa: E731
    case = validate.compare(graph, traced, traced.example_inputs, "the example inputs", "t", {})
    assert case["reference"] == "none" and case["checked"].startswith(
        "no wider-dtype reference fits in memory"
    )
    assert case["worst"] == {"value": "output 0", "max_abs_diff": 0.0}

    def off(args):
        outs = graph(args)
        outs[0] = outs[0] + 1
        return outs

    with pytest.raises(
        CaptureError,
        match=r"value 0 \(output 0\) differs from the traced graph on the example "
        r"inputs beyond its dtype's tolerance \(max \|frozen - graph\| 1; no "
        r"wider-dtype reference fits in memory\)",
    ):
        validate.compare(off, traced, traced.example_inputs, "the example inputs", "t", {})


def test_where_no_reference_fits_inputs_written_in_place_are_checked_too(monkeypatch):
    """The no-reference path judges what the graph writes (a cache) as well as the
    outputs: kernels that write a wrong cache are refused there too."""
    from precompile_build.capturing.tracing import trace_call

    def step(cache, x):
        cache.mul_(0.5).add_(x)
        return cache.sum(0)

    traced = trace_call(step, (torch.zeros(4, 8), torch.randn(4, 8)), {}, target="t")
    monkeypatch.setattr(
        reference,
        "reference_run",
        lambda *a, **k: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")),
    )

    def wrong_cache(args):
        outs = list(traced.graph_module(*args))
        args[0].add_(1)  # the kernels' cache write is off; the output is right
        return outs

    graph = lambda args: list(traced.graph_module(*args))  # noqa: E731
    assert (
        validate.compare(graph, traced, traced.example_inputs, "the example inputs", "t", {})[
            "reference"
        ]
        == "none"
    )
    with pytest.raises(
        CaptureError, match=r"\(tensor argument 0 after the call\) differs from the traced graph"
    ):
        validate.compare(wrong_cache, traced, traced.example_inputs, "the example inputs", "t", {})


def test_an_op_out_of_cuda_memory_moves_the_rest_of_the_reference_to_the_cpu(monkeypatch):
    # the control flow of the spill, on the CPU: the first product raises CUDA's
    # out-of-memory error; the reference moves its values and runs that op again
    model, x, traced = _linear_stack()
    run, failed = reference._Reference._run, []
    aten = torch.ops.aten
    products = {
        aten.linear.default,
        aten.addmm.default,
        aten.mm.default,
    }  # a linear in either ATen IR

    def first_fails(self, node, target, args, kwargs):
        if not failed and not self.spilled and target in products:
            failed.append(node.name)
            raise torch.OutOfMemoryError("CUDA out of memory")
        return run(self, node, target, args, kwargs)

    monkeypatch.setattr(reference._Reference, "_run", first_fails)
    monkeypatch.setattr(reference._Reference, "_on_cuda", staticmethod(lambda args, kwargs: True))
    (ref,), _, info = reference.reference_run(traced.graph_module, traced.example_inputs, "cpu")
    assert failed and info["spilled_to_cpu"] is True
    want = x.double()
    for layer in model:
        want = torch.nn.functional.linear(want, layer.weight.double(), layer.bias.double())
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "where", ["_widen", "_restrided"], ids=["widening a weight", "restriding a result"]
)
def test_out_of_cuda_memory_around_an_op_moves_the_reference_to_the_cpu(monkeypatch, where):
    # the GPU case: a cap below one wide weight fails in the widening, before the op
    # runs (or in the copy that gives a result the narrow run's strides, after it);
    # that spills too: a reference the GPU cannot hold stays fp64, on the CPU
    model, x, traced = _linear_stack()
    real, failed = getattr(reference, where), []

    def fails_once(t, arg):
        if not failed and isinstance(t, torch.Tensor) and t.dim() == 2:
            failed.append(tuple(t.shape))
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(t, arg)

    monkeypatch.setattr(reference, where, fails_once)
    monkeypatch.setattr(reference._Reference, "_on_cuda", staticmethod(lambda args, kwargs: True))
    (ref,), _, info = reference.reference_run(traced.graph_module, traced.example_inputs, "cpu")
    assert failed and info == {"reference": "float64", "fallback_ops": [], "spilled_to_cpu": True}
    want = x.double()
    for layer in model:
        want = torch.nn.functional.linear(want, layer.weight.double(), layer.bias.double())
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "tracer,shape",
    [("export", (4, 64)), ("export", (2, 3, 64)), ("make_fx", (4, 64)), ("make_fx", (2, 3, 64))],
)
def test_a_large_weight_is_widened_by_blocks_of_columns(monkeypatch, tracer, shape):
    # linear (export), addmm / mm (make_fx, 2-d and 3-d inputs): past BLOCK_BYTES a
    # weight is never wide whole, and the product is the same fp64 product
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 64, bias=False)).to(
        torch.bfloat16
    )
    x = torch.randn(*shape).to(torch.bfloat16)
    traced = trace_call(lambda m, x: m(x), (model, x), {}, target="t", tracer=tracer)
    (whole,), _, _ = reference.reference_run(traced.graph_module, traced.example_inputs, "cpu")
    monkeypatch.setattr(reference, "BLOCK_BYTES", 16 * 64 * 8)  # 16 columns of a 64-deep weight
    largest, to = [0], torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if (
            out is not self
            and out.dtype == torch.float64
            and self.dim() == 2
            and self.numel() >= 16 * 64
        ):
            largest[0] = max(largest[0], out.numel())
        return out

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    (blocks,), _, _ = reference.reference_run(traced.graph_module, traced.example_inputs, "cpu")
    monkeypatch.setattr(torch.Tensor, "to", to)
    assert (
        0 < largest[0] <= 16 * 96
    )  # a block of 16 (or 10) columns/rows, never a whole 96 x 64 weight
    torch.testing.assert_close(blocks, whole, rtol=1e-12, atol=1e-12)
    want = torch.nn.functional.linear(x.double(), model[0].weight.double(), model[0].bias.double())
    torch.testing.assert_close(
        blocks, torch.nn.functional.linear(want, model[1].weight.double()), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("tracer", ["export", "make_fx"])
def test_an_embedding_gathers_from_the_narrow_table(monkeypatch, tracer):
    # the rows are gathered, then widened: the same values, never a wide table
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(100, 16), torch.nn.Linear(16, 8)).to(
        torch.bfloat16
    )
    ids = torch.tensor([[3, 7, 99], [0, 3, 5]])
    traced = trace_call(lambda m, i: m(i), (model, ids), {}, target="t", tracer=tracer)
    assert any("embedding" in str(n.target) for n in traced.graph_module.graph.nodes)
    largest, to = [0], torch.Tensor.to

    def counting_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if out is not self and out.dtype == torch.float64:
            largest[0] = max(largest[0], out.numel())
        return out

    monkeypatch.setattr(torch.Tensor, "to", counting_to)
    (ref,), _, info = reference.reference_run(traced.graph_module, traced.example_inputs, "cpu")
    monkeypatch.setattr(torch.Tensor, "to", to)
    assert largest[0] < 100 * 16 and info["reference"] == "float64"
    want = torch.nn.functional.linear(
        model[0].weight.double()[ids], model[1].weight.double(), model[1].bias.double()
    )
    torch.testing.assert_close(ref, want, rtol=1e-12, atol=1e-12)
