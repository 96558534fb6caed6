"""A tiny transformers Llama at TP = 2 (the torch 2.14.1 venv, which has
transformers): q/k/v/gate/up colwise, o/down rowwise, captured by the build on the
CPU with `distributed = real` (two ranks with gloo, each validated: the prompt's
logits and a StaticCache decode step) and `fake` (rank 0 alone, compile-only: the
decode step), and served by `torchrun --nproc_per_node 2` from each wheel: logits and
the decode step equal to eager TP = 2 on each rank, 16 greedy tokens equal to eager's;
every load refused before init_process_group and in a world of one process."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers", reason="needs transformers (scripts/test.sh installs it)")

from _build_helpers import manifest_of  # noqa: E402
from _tp_helpers import built_both_ways, check_refusals, check_world_of_one, torchrun, unpack  # noqa: E402

# the fake build captures the decode step only: the forward adds nothing the real build
# does not check, and CI time
TARGETS = {"real": ["llama_forward", "llama_decode"], "fake": ["llama_decode"]}


@pytest.mark.usefixtures("build_env")
def test_a_tensor_parallel_llama_serves_every_rank(tmp_path, monkeypatch):
    wheels = built_both_ways(
        tmp_path, monkeypatch, *(",".join(TARGETS[m]) for m in ("real", "fake"))
    )
    for mode, wheel in wheels.items():
        targets = manifest_of(wheel)["targets"]
        for name in TARGETS[mode]:
            (variant,) = targets[name]["variants"]
            assert variant["engine"] == "frozen"
            assert variant["distributed"]["validated"] is (mode == "real")
            assert variant["distributed"]["ranks_captured"] == (2 if mode == "real" else 1)
        results = torchrun(
            unpack(wheel, tmp_path / f"site-{mode}"), tmp_path / f"served-{mode}", TARGETS[mode]
        )
        for rank, r in enumerate(results):
            if "llama_forward" in TARGETS[mode]:
                forward = r["llama_forward"]
                assert forward["kernels"] and forward["shape"] == [1, 8, 128]
                assert forward["max_diff"] <= 1e-5, (mode, rank, r)
            decode = r["llama_decode"]
            assert decode["kernels"] and decode["step_max_diff"] <= 1e-5, (mode, rank, r)
            assert decode["tokens"] == decode["eager_tokens"] and len(decode["tokens"]) == 16, (
                mode,
                rank,
                r,
            )
        assert (
            results[0]["llama_decode"]["tokens"] == results[1]["llama_decode"]["tokens"]
        )  # one model
        check_refusals(results, TARGETS[mode])
    one = torchrun(tmp_path / "site-real", tmp_path / "one", TARGETS["real"], nproc=1)[0]
    check_world_of_one(one, TARGETS["real"])
