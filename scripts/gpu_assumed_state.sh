#!/usr/bin/env bash
# On one GPU (H200): a served call checks what the trace assumed.
#   1. tests/test_gpu_assumed_state.py (a frozen CUDA pair with graphs from four threads,
#      peft's adapter state on CUDA), tests/test_assumed_state.py and test_tracers.py on
#      this torch (2.11), the GPU tests of the driver (test_gpu_cudagraphs, test_gpu_frozen,
#      test_gpu_decode)
#   2. dd: sizes the data decides on CUDA (nms with 0, 1 and many boxes, x[x > 0], nonzero,
#      the CUDA graphs refusal), and the CPU data-dependent and result/argument tests on
#      this torch (FasterRCNN, sentence-transformers where installed)
#   3. an 8B Llama (Llama-3-8B shapes, bf16) captured with the recorder on, then loaded with
#      PRECOMPILE_NO_COMPILE=1: capture seconds against session 12's 41.6 s, the checks the
#      pair records, the compiler modules the load imports
#   gpu: only the GPU tests of 1 and 2 (test_gpu_assumed_state, test_gpu_data_dependent),
#      where the CPU ones ran on this torch elsewhere (a CPU venv with the same torch)
# PARTS="tests dd 8b" (default; or "gpu 8b"); BUDGET seconds in all (default 500). Results in $OUT
# (default /tmp/gpu_assumed_state): tests.log, dd.log, scale_cuda_llama_8b_s13.json, checks.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_assumed_state}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PARTS="${PARTS:-tests dd 8b}"
BUDGET="${BUDGET:-500}"
SECONDS=0
source scripts/_gpu_steps.sh  # budget_step NAME LIMIT_S COMMAND...
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
for part in $PARTS; do
  case "$part" in
    tests) budget_step tests 280 bash -c "python3 -m pytest -q -p no:cacheprovider tests/test_gpu_assumed_state.py \
        tests/test_assumed_state.py tests/test_tracers.py tests/test_gpu_cudagraphs.py tests/test_gpu_frozen.py \
        tests/test_gpu_decode.py > '$OUT/tests.log' 2>&1; rc=\$?; grep -E '^(FAILED|ERROR)' '$OUT/tests.log'; tail -1 '$OUT/tests.log'; exit \$rc" ;;
    gpu) budget_step gpu 200 bash -c "python3 -m pytest -q -p no:cacheprovider tests/test_gpu_assumed_state.py \
        tests/test_gpu_data_dependent.py > '$OUT/gpu.log' 2>&1; rc=\$?; grep -E '^(FAILED|ERROR)' '$OUT/gpu.log'; tail -1 '$OUT/gpu.log'; exit \$rc" ;;
    dd) budget_step dd 240 bash -c "python3 -m pytest -q -p no:cacheprovider tests/test_gpu_data_dependent.py \
        tests/test_data_dependent.py tests/test_results_and_arguments.py > '$OUT/dd.log' 2>&1; rc=\$?; grep -E '^(FAILED|ERROR)' '$OUT/dd.log'; tail -1 '$OUT/dd.log'; exit \$rc" ;;
    8b) budget_step 8b 260 python3 bench/scale.py --device cuda --llama --sizes 8b --modes capture,load --tag 8b_s13 --out "$OUT" ;;
    *) echo "== unknown part $part" ;;
  esac
done
python3 - "$OUT" <<'PY' | tee "$OUT/checks.txt"
import json, pathlib, sys
for p in sorted(pathlib.Path(sys.argv[1]).glob("scale_cuda_llama_*.json")):
    for size, r in json.loads(p.read_text())["rows"].items():
        c, ld = r.get("capture", {}), r.get("load", {})
        if "error" in c:
            print(f"{size}: capture FAILED: {c['error'].strip().splitlines()[-1][:300]}")
            continue
        print(f"{size}: capture {c.get('capture_s', 0):.1f} s (session 12: 41.6 s), checks {c.get('checks')}")
        if ld and "error" not in ld:
            print(f"{size}: load first result {ld['first_result_s']:.2f} s, compiler modules imported: "
                  f"{len(ld['compiler_modules_imported'])}, max |loaded - eager| {ld['max_abs_vs_eager']:.3g}")
        elif ld:
            print(f"{size}: load FAILED: {ld['error'].strip().splitlines()[-1][:300]}")
PY
