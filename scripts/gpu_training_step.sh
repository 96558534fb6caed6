#!/usr/bin/env bash
# On a GPU host: a training step's CUDA test (timm efficientnet_b0 training step,
# fp32, batch 4, 32x32, default settings; a wrong kernel still refused), then the
# CPU-side tests of the issue's items on CUDA's torch (they run on any host).
# Logs and a summary go to $OUT (default /tmp/gpu_training_step).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_training_step}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import torch, timm; print("torch", torch.__version__, "timm", timm.__version__, "cuda", torch.cuda.is_available())' \
  2>&1 | tee "$OUT/summary.txt"

source scripts/_gpu_steps.sh  # step NAME TIMEOUT_S COMMAND...

step gpu_tolerances 330 python3 -m pytest -q -p no:cacheprovider -rs -s tests/test_gpu_tolerances.py
grep -h "efficientnet_b0 worst value" "$OUT/gpu_tolerances.log" | tee -a "$OUT/summary.txt"
step issue27_cpu_tests 120 python3 -m pytest -q -p no:cacheprovider tests/test_tolerances.py \
  tests/test_capture_reliability.py
echo "done" | tee -a "$OUT/summary.txt"
