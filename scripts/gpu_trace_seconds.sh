#!/usr/bin/env bash
# Capture seconds: the trace step of a 1B-shaped Llama on the GPU host, the
# export before (two passes, stack traces), the two passes without stack traces and
# the one pass (aten_export.py's default), in one process (bench/trace_speed.py; under
# torch.no_grad(), as bench/scale_llama.py captures);
# then the GPU frozen-engine tests and the export tests under this host's torch.
# Prints one line per result; under 4 minutes. Results: $OUT/trace_speed_cuda.md,
# $OUT/<step>.log, $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_trace_seconds}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}"
source scripts/_gpu_steps.sh
SECONDS=0

python3 - <<'EOF' | tee -a "$OUT/summary.txt"
import torch
import torch.fx.config
from precompile_build.capturing import aten_export
print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU'}: "
      f"one-pass export {'available' if aten_export._one_pass_export() else 'MISSING (two passes)'}, "
      f"fx do_not_emit_stack_traces {'available' if hasattr(torch.fx.config, 'do_not_emit_stack_traces') else 'MISSING'}")
EOF
step trace_1b 110 python3 bench/trace_speed.py --device cuda --dtype bfloat16 --hidden 2048 --layers 16 \
  --heads 32 --kv-heads 8 --intermediate 8192 --vocab 32000 --tokens 128 --reps 2 --no-grad --md "$OUT/trace_speed_cuda.md"
grep -E "^(median|same ops)" "$OUT/trace_1b.log" | sed 's/^/trace_1b: /' | tee -a "$OUT/summary.txt"
step gpu_frozen 110 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_frozen.py
step export_tests 40 python3 -m pytest -q -p no:cacheprovider tests/test_aten_export.py tests/test_tracers.py
echo "done in ${SECONDS} s" | tee -a "$OUT/summary.txt"
