#!/usr/bin/env bash
# Issue 25 on a CUDA host (python3 with torch, transformers): the decoding tests on
# CUDA, then bench/decode.py (a 1.1B-parameter Llama, bf16). Each step prints its rc
# and the script goes on after a failed step. Logs and results go to $OUT.
#   DECODE_BATCHES="1" (default; "1 8" or "8" for batch 8: each batch builds two more
#   targets, about 1.5 min each on the H200), DECODE_PATHS (default: every path),
#   DECODE_STEPS (128), DECODE_TIMEOUT (seconds per path, 150), BENCH_BUDGET (seconds for
#   the paths after the build, 200; the build of the wheel comes first and is not in it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_issue25}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/runtime:${PYTHONPATH:-}
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' | tee "$OUT/summary.txt"

echo "== 1. tests (CUDA decoding; pytree arguments; aliased tensors; every tracer)"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_decode.py tests/test_pytree_args.py \
  tests/test_llm_decode.py > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/summary.txt"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest.log" | tail -8 | tee -a "$OUT/summary.txt"

echo "== 2. bench/decode.py on CUDA (batches ${DECODE_BATCHES:-1})"
# shellcheck disable=SC2086
# --budget stops the bench itself (a path past it is skipped, a running one killed);
# the outer timeout (the build of the wheel, about 3 min, comes first) is only a safety net
timeout $(( ${BENCH_BUDGET:-200} + 480 )) python3 bench/decode.py --device cuda --batches ${DECODE_BATCHES:-1} \
  --steps "${DECODE_STEPS:-128}" --timeout "${DECODE_TIMEOUT:-150}" --budget "${BENCH_BUDGET:-200}" \
  ${DECODE_PATHS:+--paths $DECODE_PATHS} --work "$OUT/work" --out "$OUT/decode_cuda.md" > "$OUT/decode.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/summary.txt"
grep -E '^\{' "$OUT/decode.log" | cut -c1-400 | tee -a "$OUT/summary.txt"
[ -f "$OUT/decode_cuda.md" ] && cat "$OUT/decode_cuda.md" | tee -a "$OUT/summary.txt"
rm -rf "$OUT/work"  # the wheel, sources and compiler caches: not to be brought back
echo "done" | tee -a "$OUT/summary.txt"
