#!/usr/bin/env bash
# Decoding on a CUDA host (python3 with torch, transformers), alone on the GPU, about 8
# minutes: the decoding tests on CUDA, then bench/decode.py (a 1.1B-parameter Llama,
# bf16) at batches 1 and 8 on the paths eager, load_packaged_graphs_greedy (the whole
# greedy step in one target: one graph replay a token), generate, generate_compile_ro,
# generate_compile (run path-major: a budget cut drops the last paths at both batches).
# The wheel has one target per batch (greedy_b1, greedy_b8: the prompt goes through it
# a token per call; about 2 min to build; a load_packaged* path of the decode target in
# DECODE_PATHS adds decode_b<B>, about 2 min more).
# Each step prints its rc and the script goes on after a failed step. Files in $OUT:
# summary.txt, pytest.log, pytest_cpu.log, decode.log, decode_cuda.md.
#   DECODE_BATCHES ("1 8"), DECODE_PATHS (the five above), DECODE_STEPS (128),
#   DECODE_PREFILL (decode; "target": the decode target's paths get prefill_b<B> too),
#   DECODE_TIMEOUT (seconds per path, 100), BENCH_BUDGET (seconds for the bench, the
#   wheel's build included, 310), TEST_TIMEOUT (150; the two test runs go side by side).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_decoding}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/runtime:${PYTHONPATH:-}
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' | tee "$OUT/summary.txt"

echo "== 1. tests: the CUDA decoding tests, and beside them (CPU only) pytree arguments, aliased tensors, the decode fast path"
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_gpu_decode.py \
  > "$OUT/pytest.log" 2>&1 &
gpu_pid=$!
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_pytree_args.py \
  tests/test_llm_decode.py tests/test_decode_fast_path.py > "$OUT/pytest_cpu.log" 2>&1
echo "pytest (cpu tests) rc=$?" | tee -a "$OUT/summary.txt"
wait "$gpu_pid"
echo "pytest (tests/test_gpu_decode.py) rc=$?" | tee -a "$OUT/summary.txt"
for log in pytest.log pytest_cpu.log; do
  grep -E "passed|failed|^FAILED|^ERROR" "$OUT/$log" | tail -6 | tee -a "$OUT/summary.txt"
done

BATCHES=${DECODE_BATCHES:-1 8}
PATHS=${DECODE_PATHS:-eager load_packaged_graphs_greedy generate generate_compile_ro generate_compile}
echo "== 2. bench/decode.py on CUDA (batches $BATCHES; $PATHS)"
# --budget stops the bench itself (a path past it is skipped, a running one killed);
# the outer timeout is only a safety net
# shellcheck disable=SC2086
timeout $(( ${BENCH_BUDGET:-310} + 40 )) python3 bench/decode.py --device cuda --batches $BATCHES \
  --steps "${DECODE_STEPS:-128}" --timeout "${DECODE_TIMEOUT:-100}" --budget "${BENCH_BUDGET:-310}" \
  --prefill "${DECODE_PREFILL:-decode}" --paths $PATHS --work "$OUT/work" --out "$OUT/decode_cuda.md" > "$OUT/decode.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/summary.txt"
# (SUMMARY lines come at the end; a bench stopped early has its per-path JSON lines)
grep -E '^SUMMARY' "$OUT/decode.log" | tee -a "$OUT/summary.txt" \
  || grep -E '^\{' "$OUT/decode.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
grep -E '^Traceback|Error' "$OUT/decode.log" | tail -5 | tee -a "$OUT/summary.txt"
[ -f "$OUT/decode_cuda.md" ] && cat "$OUT/decode_cuda.md" | tee -a "$OUT/summary.txt"
rm -rf "$OUT/work"  # the wheel, sources, logits and compiler caches: not to be brought back
echo "done" | tee -a "$OUT/summary.txt"
