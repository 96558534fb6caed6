#!/usr/bin/env bash
# On one GPU (H100 or H200): the guards' CUDA path and their per-call cost on the host's CPU.
#   tests: the guard tests (CPU_TESTS) beside the GPU tests of the driver and assumed state
#     on this torch (GPU_TESTS: graphs from four threads, grad modes, decode, frozen pairs)
#   parts: bench/guard_parts.py at 2 and 8 layers (where the guard check's time goes, on a
#     server CPU rather than the 2-core dev machine)
#   8b: an 8B Llama (Llama-3-8B shapes, bf16) captured and loaded, checks counted
# PARTS="tests parts 8b" (default), in that order; BUDGET seconds in all (default 560). Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_guards}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PARTS="${PARTS:-tests parts 8b}"
# the two halves of `tests`, run side by side: the guards' (CPU) and the GPU paths'
CPU_TESTS="${CPU_TESTS:-tests/test_guards.py tests/test_guards_state_reads.py tests/test_guards_dict_watch.py}"
GPU_TESTS="${GPU_TESTS:-tests/test_gpu_assumed_state.py tests/test_gpu_cudagraphs.py \
  tests/test_gpu_grad_modes.py tests/test_gpu_decode.py tests/test_gpu_frozen.py tests/test_decode_fast_path.py}"
BUDGET="${BUDGET:-560}"
SECONDS=0
source scripts/_gpu_steps.sh  # budget_step NAME LIMIT_S COMMAND...
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name(0))"
for part in $PARTS; do
  case "$part" in
    tests) budget_step tests 420 bash -c "
        python3 -m pytest -q -rfE -p no:cacheprovider $CPU_TESTS > '$OUT/tests_cpu.log' 2>&1 & cpu=\$!
        python3 -m pytest -q -rfE -p no:cacheprovider $GPU_TESTS > '$OUT/tests_gpu.log' 2>&1; rc=\$?
        wait \$cpu; rc=\$((rc | \$?))
        for f in tests_cpu tests_gpu; do grep -E '^(FAILED|ERROR)' '$OUT/'\$f.log; tail -1 '$OUT/'\$f.log; done; exit \$rc" ;;
    parts) budget_step parts 90 bash -c "for l in 2 8; do python3 bench/guard_parts.py --layers \$l; done \
        > '$OUT/parts.log' 2>&1; rc=\$?; cat '$OUT/parts.log' | tail -40; exit \$rc" ;;
    8b) budget_step 8b 200 python3 bench/scale.py --device cuda --llama --sizes 8b --modes capture,load \
        --tag 8b_guards --out "$OUT" ;;
    *) echo "== unknown part $part" ;;
  esac
done
