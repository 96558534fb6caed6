"""The public-model matrix: transformers and timm models (tests/packages/modelzoo,
tiny random configs, no downloads) built into one wheel by the real backend,
installed, then served in a fresh process with empty caches and
PRECOMPILE_NO_COMPILE=1 and compared with eager (outputs; parameters and buffers
after 3 training steps), with no import of the compiler stack at load or call.
On a GPU host the same cases capture and serve on CUDA (device = "auto")."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip(
    "transformers", reason="the model matrix needs transformers (scripts/test.sh installs it)"
)
pytest.importorskip("timm", reason="the model matrix needs timm (scripts/test.sh installs it)")

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "tests" / "packages" / "modelzoo"
sys.path.insert(0, str(ZOO))
import modelzoo  # noqa: E402
from _build_helpers import build_and_install  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 on both devices; Inductor's kernels reorder reductions
TOL = 1e-4 if DEVICE == "cpu" else 1e-3


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("models")
    _, site, build_log = build_and_install(ZOO, tmp)
    run_env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "runtime")]),
        HOME=str(tmp / "home"),
        TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
        TRITON_CACHE_DIR=str(tmp / "triton"),
        PRECOMPILE_CACHE_DIR=str(tmp / "kernels"),
        PRECOMPILE_NO_COMPILE="1",
    )
    # run from tmp: a script's own folder comes first on sys.path, and the source tree's
    # modelzoo (no _precompiled/) must not shadow the installed one
    shutil.copy(ZOO / "serve_check.py", tmp / "serve_check.py")
    serve = subprocess.run(
        [sys.executable, str(tmp / "serve_check.py"), DEVICE, *modelzoo.CASES],
        env=run_env,
        capture_output=True,
        text=True,
        cwd=tmp,
    )
    assert serve.returncode == 0, serve.stderr[-6000:]
    decode = subprocess.run(
        [sys.executable, str(tmp / "serve_check.py"), DEVICE, "--decode"],
        env=run_env,
        capture_output=True,
        text=True,
        cwd=tmp,
    )
    assert decode.returncode == 0, decode.stderr[-6000:]
    results = json.loads(serve.stdout.strip().splitlines()[-1])
    results["decoding"] = json.loads(decode.stdout.strip().splitlines()[-1])
    return results, build_log


@pytest.mark.slow
@pytest.mark.parametrize("name", list(modelzoo.CASES))
def test_model_serves_like_eager(served, name):
    results, _ = served
    r = results[name]
    assert "error" not in r, r.get("error")
    assert r["max_abs_err"] <= TOL, r
    # loading and calling imported nothing of the compiler stack (and compiled
    # nothing: PRECOMPILE_NO_COMPILE=1 turns any compile into an error)
    assert r["new_compiler_modules"] == [], r["new_compiler_modules"]
    assert [s for s in r["sizes"]] == modelzoo.CASES[name].serve_sizes


@pytest.mark.slow
def test_model_outputs_keep_their_class(served):
    results, _ = served
    assert results["gpt2_forward"]["type"] == "CausalLMOutputWithCrossAttentions"
    assert results["llama_forward"]["type"] == "CausalLMOutputWithPast"
    assert results["bart_forward"]["type"] == "Seq2SeqModelOutput"


@pytest.mark.slow
def test_build_summary_names_every_model_target(served):
    _, log = served
    for name in (*modelzoo.CASES, *modelzoo.DECODING):
        assert name in log, log[-3000:]


@pytest.mark.slow
def test_greedy_decoding_from_the_wheel_gives_eagers_tokens(served):
    """A StaticCache argument (prefill with a dynamic prompt length, then one-token
    steps; two requests with two caches, interleaved) and transformers' unmodified
    export wrapper (its cache buffers also held by its static_cache object): 32 greedy
    tokens each, equal to eager's; the writes land in the callers' caches."""
    r = served[0]["decoding"]
    assert "error" not in r, r["error"]
    assert r["served"] == r["eager"] and len(r["served"][0]) == modelzoo.DECODE_STEPS
    assert r["eager"][0] != r["eager"][1]  # two requests, two token streams
    # prefill, then a step after each token but the last
    assert r["cache_lengths"] == [6 + modelzoo.DECODE_STEPS - 1, 11 + modelzoo.DECODE_STEPS - 1]
    assert r["served_wrapper"] == r["eager_wrapper"]
    assert r["wrapper_buffer_is_cache"] and r["wrapper_cache_written"]


@pytest.mark.slow
def test_no_model_is_said_to_change_python_state(served):
    """Library models keep caches and flags of their own (transformers' and timm's
    code is not looked into): no PythonStateWarning for any case of the matrix."""
    _, log = served
    assert "changed Python state" not in log and "PythonStateWarning" not in log, log[-3000:]
