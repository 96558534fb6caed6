"""transformers decoding captured as it is written (torch 2.14.1 venv, with
transformers): a StaticCache argument, and the unmodified export wrapper whose cache
buffers are also held by its ``static_cache`` object, with every tracer (the eager
engine: seconds; tests/test_models.py builds, installs and serves the frozen pairs),
and a whole greedy step with the frozen engine (its inputs written in place)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="needs transformers (scripts/test.sh installs it)")

from _pairs import load_pair  # noqa: E402

import precompile_build  # noqa: E402
from precompile_build.errors import CaptureError  # noqa: E402
from precompile_runtime.errors import CallError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "packages" / "modelzoo"))
import modelzoo  # noqa: E402

TRACERS = ["export", "export-strict", "make_fx"]
STEPS = 8


def _capture(tmp_path, fn, *args, tracer="auto", name="t", engine="eager"):
    src, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    with (
        torch.no_grad(),
        precompile_build.capture(
            fn, artifact_path=src, cache_path=cache, target=name, engine=engine, tracer=tracer
        ) as f,
    ):
        f(*args)
    return load_pair(src, cache)


@pytest.mark.parametrize("tracer", TRACERS)
def test_the_export_wrapper_captures_as_it_is(tmp_path, tracer):
    model = modelzoo.build_llama()
    step = _capture(
        tmp_path,
        modelzoo.wrapper_step,
        modelzoo.export_wrapper(model, "cpu"),
        torch.tensor([[1]]),
        torch.tensor([0]),
        tracer=tracer,
    )
    ids = modelzoo.prompt("cpu", 4)
    with torch.no_grad():
        want = modelzoo.wrapper_greedy(
            modelzoo.wrapper_step, modelzoo.export_wrapper(model, "cpu"), ids, STEPS
        )
    wrapper = modelzoo.export_wrapper(model, "cpu")
    assert modelzoo.wrapper_greedy(step, wrapper, ids, STEPS) == want
    # the writes landed in the wrapper's buffers, which its cache object still holds
    assert wrapper.static_cache.layers[0].keys is wrapper.key_cache_0
    assert int(wrapper.cumulative_length_0) == 4 + STEPS


@pytest.mark.parametrize("tracer", TRACERS)
def test_a_static_cache_argument_is_updated_in_place(tmp_path, tracer):
    if tracer == "export-strict" and tuple(int(v) for v in torch.__version__.split(".")[:2]) < (
        2,
        13,
    ):
        # torch 2.11's Dynamo cannot trace StaticLayer.update (a __dict__.update call:
        # "Unsupported method call"; seen on the H200); 2.13 and 2.14.1 can
        pytest.skip("torch < 2.13: Dynamo cannot trace transformers' StaticLayer.update")
    model = modelzoo.build_llama()
    step = _capture(
        tmp_path,
        modelzoo.lm_step,
        model,
        torch.tensor([[1]]),
        modelzoo.static_cache(model, "cpu"),
        torch.tensor([0]),
        tracer=tracer,
    )
    ids = modelzoo.prompt("cpu", 1)
    with torch.no_grad():
        want = list(
            modelzoo.greedy(
                modelzoo.lm_step,
                modelzoo.lm_step,
                model,
                modelzoo.static_cache(model, "cpu"),
                ids,
                STEPS,
            )
        )
    for _ in range(2):  # a second cache object: a second request
        cache = modelzoo.static_cache(model, "cpu")
        assert list(modelzoo.greedy(step, step, model, cache, ids, STEPS)) == want
        assert int(cache.layers[1].cumulative_length) == 1 + STEPS
        assert cache.layers[1].keys[:, :, : 1 + STEPS].abs().sum() > 0


def test_a_serving_process_without_the_registration_registers_it(tmp_path):
    """A fresh serving process has not registered StaticCache with pytree (the capture
    process did): the pair registers it before its first call flattens one."""
    from torch.utils import _pytree as pytree
    from transformers.cache_utils import StaticCache, StaticLayer

    model = modelzoo.build_llama()
    step = _capture(
        tmp_path,
        modelzoo.lm_step,
        model,
        torch.tensor([[1]]),
        modelzoo.static_cache(model, "cpu"),
        torch.tensor([0]),
    )
    for cls in (StaticCache, StaticLayer):
        pytree._deregister_pytree_node(cls)
    assert StaticCache not in pytree.SUPPORTED_NODES
    cache = modelzoo.static_cache(model, "cpu")
    with torch.no_grad():  # (as captured: a call with grad on is refused)
        want = modelzoo.lm_step(
            model, torch.tensor([[5]]), modelzoo.static_cache(model, "cpu"), torch.tensor([0])
        )
        torch.testing.assert_close(step(model, torch.tensor([[5]]), cache, torch.tensor([0])), want)
    assert StaticCache in pytree.SUPPORTED_NODES and int(cache.layers[0].cumulative_length) == 1


def test_a_returned_model_output_holds_the_callers_cache_tensors(tmp_path):
    model = modelzoo.build_llama()

    def forward(model, ids, cache, pos):
        return model(input_ids=ids, past_key_values=cache, cache_position=pos)

    step = _capture(
        tmp_path,
        forward,
        model,
        torch.tensor([[1]]),
        modelzoo.static_cache(model, "cpu"),
        torch.tensor([0]),
    )
    cache = modelzoo.static_cache(model, "cpu")
    with torch.no_grad():
        out = step(model, torch.tensor([[5]]), cache, torch.tensor([0]))
    assert type(out).__name__ == "CausalLMOutputWithPast"
    assert type(out.past_key_values) is type(cache)
    assert out.past_key_values.layers[0].keys is cache.layers[0].keys  # no copy of the cache
    with torch.no_grad():
        want = forward(
            model, torch.tensor([[5]]), modelzoo.static_cache(model, "cpu"), torch.tensor([0])
        ).logits
    torch.testing.assert_close(out.logits, want)


def test_caches_the_pair_cannot_serve_are_refused(tmp_path):
    from transformers import DynamicCache, MistralConfig, MistralForCausalLM, StaticCache

    model = modelzoo.build_llama()
    lazy = StaticCache(config=model.config, max_cache_len=16)
    with pytest.raises(CaptureError, match=r"not initialized .*cache.early_initialization\("):
        _capture(tmp_path, modelzoo.lm_step, model, torch.tensor([[1]]), lazy, torch.tensor([0]))
    # a sliding-window model's StaticCache: its StaticSlidingWindowLayers keep their position in a Python int
    mistral = MistralForCausalLM(
        MistralConfig(
            vocab_size=modelzoo.VOCAB,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            sliding_window=4,
        )
    ).eval()
    for m, cache, where in (
        (model, DynamicCache(config=model.config), "argument 'cache' is a DynamicCache"),
        (
            mistral,
            modelzoo.static_cache(mistral, "cpu"),
            r"argument 'cache'.layers\[0\] is a StaticSlidingWindowLayer",
        ),
    ):
        with pytest.raises(
            CaptureError,
            match=where + r", a transformers cache the capture cannot take: .*"
            r"Pass a transformers StaticCache allocated before the call \(cache.early_initialization",
        ):
            _capture(tmp_path, modelzoo.lm_step, m, torch.tensor([[1]]), cache, torch.tensor([0]))
    from transformers.integrations.executorch import register_dynamic_cache_export_support

    register_dynamic_cache_export_support()  # (for this check only: other tests take DynamicCache unregistered)
    try:
        with pytest.raises(
            CaptureError, match=r"changes the structure of its arguments.*StaticCache"
        ):
            _capture(
                tmp_path,
                modelzoo.lm_step,
                model,
                torch.tensor([[1]]),
                DynamicCache(config=model.config),
                torch.tensor([0]),
                tracer="make_fx",
            )
    finally:
        torch.utils._pytree._deregister_pytree_node(DynamicCache)
        torch.fx._pytree.SUPPORTED_NODES.pop(DynamicCache, None)
    assert not (tmp_path / "t.py").exists()


def test_only_the_caches_a_served_call_cannot_follow_get_the_static_cache_advice():
    """A layer that keeps its position in tensors (StaticIndexedLayer, not registered by
    precompile-build) gets the advice to register it, not to pass what it is part of."""
    from transformers.cache_utils import DynamicLayer, StaticIndexedLayer

    from precompile_build.capturing.pytree_io import flatten_inputs

    for layer, advice in (
        (DynamicLayer(), "Pass a transformers StaticCache"),
        (StaticIndexedLayer(8), "Register StaticIndexedLayer with torch.utils._pytree"),
    ):
        with pytest.raises(CaptureError, match=advice):
            flatten_inputs((layer,), {}, ["cache"])


def test_a_cache_in_the_result_says_to_pass_a_static_cache(tmp_path):
    model = modelzoo.build_llama()  # (use_cache: the output holds the DynamicCache the call made)
    with pytest.raises(
        CaptureError,
        match=r"the result's part result\['past_key_values'\] is a DynamicCache, a "
        r"model's key/value cache made by the call: pass a transformers StaticCache allocated "
        r"before the call \(cache.early_initialization\(.*\) as an argument, use_cache=False",
    ):
        _capture(
            tmp_path, lambda m, ids: m(input_ids=ids, use_cache=True), model, torch.tensor([[1, 2]])
        )
    assert not (tmp_path / "t.py").exists()


def test_a_cache_of_another_shape_or_kind_is_refused_naming_it(tmp_path):
    from transformers import DynamicCache

    model = modelzoo.build_llama()
    step = _capture(
        tmp_path,
        modelzoo.lm_step,
        model,
        torch.tensor([[1]]),
        modelzoo.static_cache(model, "cpu"),
        torch.tensor([0]),
    )
    with torch.no_grad():  # as captured (a call with grad on is refused first)
        with pytest.raises(
            CallError,
            match=r"argument 'cache'.layers\[0\]: a StaticLayer with batch_size 2 "
            r"\(captured 1\)",
        ):
            step(
                model,
                torch.tensor([[1, 2]]),
                modelzoo.static_cache(model, "cpu", batch=2),
                torch.tensor([0]),
            )
        layers = modelzoo.static_cache(model, "cpu").layers
        for other, got in (
            (DynamicCache(config=model.config), "a DynamicCache"),  # (registered or not)
            (layers, r"a list of \d+ item\(s\)"),
            (layers[0].keys, "a Tensor"),
        ):
            with pytest.raises(
                CallError,
                match=r"argument 'cache': expected a StaticCache of \d+ item\(s\), got " + got,
            ):
                step(model, torch.tensor([[1]]), other, torch.tensor([0]))
        cache = modelzoo.static_cache(model, "cpu")  # and a good call after them is served
        want = modelzoo.lm_step(
            model, torch.tensor([[1]]), modelzoo.static_cache(model, "cpu"), torch.tensor([0])
        )
        torch.testing.assert_close(step(model, torch.tensor([[1]]), cache, torch.tensor([0])), want)


def greedy_step(model, token, cache, pos, tokens):
    """A server loop's whole step in one function: the next token written into ``token``
    and into ``tokens[:, pos + 1]``, the position advanced; returns the stop flag."""
    nxt = modelzoo.lm_step(model, token, cache, pos).argmax(-1)
    tokens.index_copy_(1, pos + 1, nxt[:, None])
    token.copy_(nxt[:, None])
    pos.add_(1)
    return (nxt == -1).all()


def test_a_whole_greedy_step_writes_its_inputs_in_place(tmp_path):
    """The step a CUDA graph can replay whole (bench/decode.py's ``*_greedy`` paths):
    the token, the position and a buffer of results are inputs the frozen pair writes
    in place, beside the cache; two requests (two caches and buffers) decode eager's
    tokens, and the result buffer holds them."""
    model = modelzoo.build_llama()
    step = _capture(
        tmp_path,
        greedy_step,
        model,
        torch.tensor([[1]]),
        modelzoo.static_cache(model, "cpu"),
        torch.tensor([0]),
        torch.zeros(1, modelzoo.MAX_CACHE, dtype=torch.long),
        engine="frozen",
    )
    assert step.uses_kernels
    ids = modelzoo.prompt("cpu", 4)
    with torch.no_grad():
        want = list(
            modelzoo.greedy(
                modelzoo.lm_step,
                modelzoo.lm_step,
                model,
                modelzoo.static_cache(model, "cpu"),
                ids,
                STEPS,
            )
        )
        for _ in range(2):
            cache, tokens = (
                modelzoo.static_cache(model, "cpu"),
                torch.zeros(1, modelzoo.MAX_CACHE, dtype=torch.long),
            )
            token, pos = torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, dtype=torch.long)
            for i in range(ids.shape[1]):  # the prompt a token per call
                token.copy_(ids[:, i : i + 1])
                pos.fill_(i)
                step(model, token, cache, pos, tokens)
            flags = [step(model, token, cache, pos, tokens) for _ in range(STEPS - 1)]
            assert tokens[0, 4 : 4 + STEPS].tolist() == want
            assert int(token) == want[-1] and int(pos) == 4 + STEPS - 1
            assert not any(bool(f) for f in flags)
