#!/usr/bin/env bash
# On one GPU host (an H200): max-autotune on the frozen engine, and the roofline
# bench. Each step is one command that ends within about 9 minutes:
#   bash scripts/gpu_max_autotune_roofline.sh tests                 tests/test_gpu_max_autotune.py (GPT block
#                                                     8x512x1024 under max-autotune; templates with
#                                                     CUDA graphs and cuda-archs; bias_addmm; conv;
#                                                     flex attention), then test_gpu_frozen's
#                                                     forward/train cases (the default mode still serves)
#   bash scripts/gpu_max_autotune_roofline.sh roofline ROWS SIZES [BUDGET_S]
#                                                     bench/roofline.py --rows ROWS --sizes SIZES,
#                                                     merged into $OUT/roofline_h200.{json,md}
#   bash scripts/gpu_max_autotune_roofline.sh cold SIZES MODES FIRST_RUNS [BUDGET_S [ARGS...]]
#                                                     bench/llama_cold.py: capture time against
#                                                     torch.compile cold for MODES (default,max-autotune),
#                                                     then FIRST_RUNS rounds of first results (ARGS go
#                                                     to the bench, e.g. --no-compile: uv's install);
#                                                     $OUT/llama_cold_h200_SIZES.{json,md}
#   bash scripts/gpu_max_autotune_roofline.sh decode-kernels SIZE [LABEL=JSON ...]
#                                                     the decode step at batch 1 (SIZE: 8b): the
#                                                     max-autotune pair and, without LABEL=JSON, one
#                                                     without coordinate descent (matrix products kept)
#                                                     and the default pair; else a pair per LABEL=JSON
#                                                     (roofline.py --variant); all under CUDA graphs,
#                                                     kernels profiled
#   bash scripts/gpu_max_autotune_roofline.sh bandwidth SIZE        bench/bandwidth_probe.py: the memory's stream rate,
#                                                     the SIZE step's products alone (cuBLAS, one graph),
#                                                     cuBLAS per weight shape (Inductor too: not run here, slow)
# Wheels the host lacks (platformdirs, filelock) come from .whl/ (carried) into /tmp/site.
# Logs and results go to $OUT (default /tmp/gpu_max_autotune_roofline): summary.txt first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_max_autotune_roofline}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/runtime:/tmp/site PYTHONUNBUFFERED=1
if [ -d .whl ] && ! python3 -c "import platformdirs, filelock" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links .whl --target /tmp/site platformdirs filelock
fi
SUM="$OUT/summary.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0))' 2>&1 | tee -a "$SUM"
case "${1:-}" in
  tests)
    timeout "${TESTS_TIMEOUT:-540}" python3 -m pytest -q -p no:cacheprovider -s tests/test_gpu_max_autotune.py \
      "tests/test_gpu_frozen.py::test_forward_mlp" "tests/test_gpu_frozen.py::test_train_step" > "$OUT/pytest.log" 2>&1
    echo "tests rc=$?" | tee -a "$SUM"
    grep -E "^(templates|kernels|cuda_archs):|passed|failed|Error" "$OUT/pytest.log" | cut -c1-400 | tail -20 | tee -a "$SUM"
    ;;
  roofline)
    timeout 575 python3 bench/roofline.py --rows "${2:?rows}" --sizes "${3:-1b}" --budget-s "${4:-470}" \
      --out "$OUT/roofline_h200" > "$OUT/roofline_${2//,/_}_${3:-1b}.log" 2>&1
    echo "roofline $2 $3 rc=$?" | tee -a "$SUM"
    grep -E "^\| " "$OUT/roofline_h200.md" | head -20 | tee -a "$SUM"
    ;;
  decode-kernels)
    variants=("${@:3}")
    [ ${#variants[@]} -gt 0 ] || variants=('no-cdt={"mode": "max-autotune", "inductor": {"coordinate_descent_tuning": false}}'
                                         'plain={}')
    mechs="eager,load_packaged max-autotune + graphs" vargs=()
    for v in "${variants[@]}"; do mechs+=",load_packaged ${v%%=*} + graphs"; vargs+=(--variant "$v"); done
    timeout "${DECODE_TIMEOUT:-575}" python3 bench/roofline.py --rows decode_b1 --sizes "${2:-8b}" \
      --budget-s "${DECODE_BUDGET_S:-470}" --kernels 20 --mechanisms "$mechs" "${vargs[@]}" \
      --out "$OUT/roofline_decode_kernels" > "$OUT/decode_kernels.log" 2>&1
    echo "decode-kernels ${2:-8b} rc=$?" | tee -a "$SUM"
    grep -E "^\| |^- " "$OUT/roofline_decode_kernels.md" | head -20 | tee -a "$SUM"
    ;;
  bandwidth)
    timeout 300 python3 bench/bandwidth_probe.py --size "${2:-8b}" --out "$OUT/bandwidth_h200_${2:-8b}" \
      > "$OUT/bandwidth_${2:-8b}.log" 2>&1
    echo "bandwidth ${2:-8b} rc=$?" | tee -a "$SUM"
    grep -E "^\| " "$OUT/bandwidth_h200_${2:-8b}.md" | tee -a "$SUM"
    ;;
  cold)
    timeout 580 python3 bench/llama_cold.py --sizes "${2:?sizes}" --capture-modes "${3:-default}" \
      --first-runs "${4:-5}" --budget-s "${5:-500}" "${@:6}" --out "$OUT/llama_cold_h200_${2//,/_}" > "$OUT/cold_${2//,/_}.log" 2>&1
    echo "cold $2 $3 rc=$?" | tee -a "$SUM"
    grep -E "^\| " "$OUT/llama_cold_h200_${2//,/_}.md" | tee -a "$SUM"
    ;;
  *)
    echo "usage: $0 tests | roofline ROWS SIZES [BUDGET_S] | decode-kernels SIZE | bandwidth SIZE | cold SIZES MODES FIRST_RUNS [BUDGET_S]" >&2
    exit 2
    ;;
esac
