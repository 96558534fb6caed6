#!/usr/bin/env bash
# On one GPU host (an H200): a loaded function behind FastAPI on uvicorn.
#   1. tests/test_gpu_serve.py: a CUDA out-of-memory error in a call (the allocator capped
#      at the first call, the recording call, inside the capture, a replay) leaves the
#      loaded function usable, graphs included; with test_gpu_cudagraphs.py (graphs as
#      before) and test_cuda_graph_keys.py (the bookkeeping)
#   2. tests/test_serve_http.py: the HTTP server tests (16 clients, reloads, faults)
#   3. bench/serve_http.py --device cuda: greedy decoding of a 1.1B Llama-shaped model
#      behind the server, load_packaged with CUDA graphs (one per request slot's
#      StaticCache) against eager and torch.compile (default, reduce-overhead);
#      the table goes to $OUT/serve_http_cuda.md (commit it as bench/results/serve_http_cuda.md)
# fastapi and uvicorn: the host Python's where it has them (e.g. installed with --target from
# .whl/ and put on PYTHONPATH); else from .whl/ when the host has no registry
# (scripts/fetch_serve_wheels.sh, run where one is, fills it), into .venv-serve, which sees
# the host Python's torch. BUDGET (default 3600) caps the bench's seconds.
# Each step prints "NAME rc=N: <pytest count line>" to $OUT/summary.txt (default /tmp/gpu_serving).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_serving}
mkdir -p "$OUT"
: > "$OUT/summary.txt"
export PYTHONPATH=$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d .whl ]; then export PIP_FIND_LINKS=$PWD/.whl PIP_NO_INDEX=1; fi
source scripts/_venv.sh
set +e  # (_venv.sh turns -e on) every step runs and reports its rc
source scripts/_gpu_steps.sh
if python3 -c "import fastapi, uvicorn, build" 2>/dev/null; then
  PY=python3
else
  (set -e; make_venv .venv-serve "fastapi==0.165.0" "uvicorn==0.54.0" build) > "$OUT/venv.log" 2>&1
  echo "venv rc=$?" | tee -a "$OUT/summary.txt"
  PY=.venv-serve/bin/python
fi
$PY -c 'import torch, fastapi, uvicorn; print("torch", torch.__version__, "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__, torch.cuda.get_device_name(0))' 2>&1 | tee -a "$OUT/summary.txt"
PARTS=${PARTS:-tests bench}  # "tests": 1 and 2; "bench": 3
if [[ " $PARTS " == *" tests "* ]]; then
  step gpu_tests 240 $PY -m pytest -q -p no:cacheprovider tests/test_gpu_serve.py tests/test_gpu_cudagraphs.py tests/test_cuda_graph_keys.py
  grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -10 | tee -a "$OUT/summary.txt"
  step serve_http_tests 240 $PY -m pytest -q -p no:cacheprovider tests/test_serve_http.py
  grep -E "^(FAILED|ERROR)" "$OUT/serve_http_tests.log" | head -10 | tee -a "$OUT/summary.txt"
fi
if [[ " $PARTS " == *" bench "* ]]; then
  step bench "${BUDGET:-3600}" $PY bench/serve_http.py --device cuda --out "$OUT/serve_http_cuda.md"
  cat "$OUT/serve_http_cuda.md" 2>/dev/null | tee -a "$OUT/summary.txt" || tail -20 "$OUT/bench.log" | tee -a "$OUT/summary.txt"
fi
