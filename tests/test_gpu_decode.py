"""transformers decoding on CUDA with the frozen engine, CUDA graphs off and on: a
StaticCache argument (two requests, two caches, interleaved) and the unmodified export
wrapper, 32 greedy tokens each equal to eager's (the tiny model of
tests/packages/modelzoo; skipped without CUDA or transformers)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="needs transformers")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from _pairs import load_pair  # noqa: E402

import precompile_build  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "packages" / "modelzoo"))
import modelzoo  # noqa: E402

DEV = "cuda"
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(autouse=True)
def _no_tf32():
    torch.backends.cuda.matmul.allow_tf32 = False
    yield


def _capture(tmp_path, fn, *args, name="t"):
    src, cache = tmp_path / f"{name}.py", tmp_path / f"{name}.cache"
    with (
        torch.no_grad(),
        precompile_build.capture(
            fn, artifact_path=src, cache_path=cache, target=name, engine="frozen"
        ) as f,
    ):
        f(*args)
    return load_pair(src, cache)


@pytest.mark.parametrize("graphs", [False, True])
def test_static_cache_decoding_on_cuda(tmp_path, graphs):
    model = modelzoo.build_llama().to(DEV)
    step = _capture(
        tmp_path,
        modelzoo.lm_step,
        model,
        torch.tensor([[1]], device=DEV),
        modelzoo.static_cache(model, DEV),
        torch.tensor([0], device=DEV),
    )
    step = step.with_cuda_graphs(graphs)
    prompts = [modelzoo.prompt(DEV, 1, seed=3), modelzoo.prompt(DEV, 1, seed=4)]
    with torch.no_grad():
        want = [
            list(
                modelzoo.greedy(
                    modelzoo.lm_step, modelzoo.lm_step, model, modelzoo.static_cache(model, DEV), p
                )
            )
            for p in prompts
        ]
    runs = [
        modelzoo.greedy(step, step, model, modelzoo.static_cache(model, DEV), p) for p in prompts
    ]
    got = [[], []]
    for _ in range(modelzoo.DECODE_STEPS):
        for i, r in enumerate(runs):
            got[i].append(next(r))
    assert got == want
    assert step.cuda_graphs is graphs


@pytest.mark.parametrize("graphs", [False, True])
def test_export_wrapper_decoding_on_cuda(tmp_path, graphs):
    model = modelzoo.build_llama().to(DEV)
    step = _capture(
        tmp_path,
        modelzoo.wrapper_step,
        modelzoo.export_wrapper(model, DEV),
        torch.tensor([[1]], device=DEV),
        torch.tensor([0], device=DEV),
    )
    step = step.with_cuda_graphs(graphs)
    ids = modelzoo.prompt(DEV, 6)
    with torch.no_grad():
        want = modelzoo.wrapper_greedy(
            modelzoo.wrapper_step, modelzoo.export_wrapper(model, DEV), ids
        )
    wrapper = modelzoo.export_wrapper(model, DEV)
    assert modelzoo.wrapper_greedy(step, wrapper, ids) == want
    assert int(wrapper.cumulative_length_0) == 6 + modelzoo.DECODE_STEPS
