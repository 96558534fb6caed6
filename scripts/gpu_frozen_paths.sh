#!/usr/bin/env bash
# On a GPU host: the frozen CUDA paths that the serving-template refactors touched (the serving
# templates assembled without their stand-ins blocks, the pair format check at load, the
# Triton freezing errors with target/where fields, CUDA graphs), then the CPU tests of the
# issue on CUDA's torch. Logs and a summary go to $OUT (default /tmp/gpu_frozen_paths).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_frozen_paths}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  2>&1 | tee "$OUT/summary.txt"

source scripts/_gpu_steps.sh  # step NAME TIMEOUT_S COMMAND...

step gpu_frozen 330 python3 -m pytest -q -p no:cacheprovider -x tests/test_gpu_frozen.py \
  tests/test_gpu_cudagraphs.py tests/test_cuda_graph_keys.py
step issue28_cpu_tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_templates.py \
  tests/test_pair_format.py tests/test_errors.py tests/test_capture_options.py \
  tests/test_shared_helpers.py tests/test_cross_arch_recorded.py tests/test_driver_fast_path.py
echo "done" | tee -a "$OUT/summary.txt"
