#!/usr/bin/env bash
# On a GPU build host: the main job with CUDA targets, then a wheel merged from a CUDA
# build and a CPU build of the same host (CUDA hidden), served both ways, then the
# GPU tests, then the model matrix on CUDA (GPU_CHECK_MODELS=0 skips it; GPU_CHECK_BENCH=a,b
# also runs bench/models.py for those cases). Logs go to $OUT (default /tmp/gpu_check). A host without a package
# registry can bring missing wheels in .whl/ (PIP_FIND_LINKS, --no-index).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then export PIP_FIND_LINKS=$PWD/.whl PIP_NO_INDEX=1; fi
nvidia-smi -L | tee "$OUT/gpus.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpus.txt"

echo "== 1. main job (CUDA targets)"
bash scripts/main_job.sh > "$OUT/main_job.log" 2>&1; echo "main_job rc=$?" | tee -a "$OUT/summary.txt"
grep -E "engine=|skip|ERROR|match" "$OUT/main_job.log" | tee -a "$OUT/summary.txt"

echo "== 2. CPU variant (CUDA hidden), merged with the CUDA wheel"
rm -rf dist-cpu dist-merged .venv-merged
CUDA_VISIBLE_DEVICES= .venv-main/bin/python -m build --no-isolation --wheel --outdir dist-cpu example_project > "$OUT/merge.log" 2>&1
.venv-main/bin/python -m precompile_build merge dist/tinylm-*.whl dist-cpu/tinylm-*.whl -o dist-merged >> "$OUT/merge.log" 2>&1
echo "merge rc=$?" | tee -a "$OUT/summary.txt"
.venv-main/bin/python -m precompile_build inspect dist-merged/tinylm-*.whl | tee -a "$OUT/summary.txt"
source scripts/_venv.sh
make_venv .venv-merged
.venv-merged/bin/python -m pip install -q --force-reinstall --no-deps dist/precompile_runtime-*.whl >> "$OUT/merge.log" 2>&1
.venv-merged/bin/python -m pip install -q --find-links dist dist-merged/tinylm-*.whl >> "$OUT/merge.log" 2>&1
(cd /tmp && PRECOMPILE_CACHE_DIR=$(mktemp -d) "$OLDPWD/.venv-merged/bin/python" -m tinylm.demo --strict) 2>&1 | sed 's/^/merged, GPU visible: /' | tee -a "$OUT/summary.txt"
(cd /tmp && CUDA_VISIBLE_DEVICES= PRECOMPILE_CACHE_DIR=$(mktemp -d) "$OLDPWD/.venv-merged/bin/python" -m tinylm.demo --strict) 2>&1 | sed 's/^/merged, CUDA hidden: /' | tee -a "$OUT/summary.txt"

echo "== 3. GPU tests"
PYTHONPATH=$PWD:$PWD/runtime .venv-main/bin/python -m pytest -q -p no:cacheprovider \
  tests/test_gpu_frozen.py tests/test_gpu_cudagraphs.py tests/test_driver_fast_path.py tests/test_distributed.py \
  ${GPU_CHECK_TESTS:-} > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?" | tee -a "$OUT/summary.txt"
tail -5 "$OUT/pytest.log" | tee -a "$OUT/summary.txt"

echo "== 4. captures spread over the GPUs; artifacts served on each device"
.venv-main/bin/python - <<'PY' 2>&1 | tee -a "$OUT/summary.txt"
import glob, json, zipfile
whl = glob.glob("dist/tinylm-*.whl")[0]
m = json.loads(zipfile.ZipFile(whl).read("tinylm/_precompiled/manifest.json"))
total = 0.0
for name, t in sorted(m["targets"].items()):
    for v in t["variants"]:
        total += v.get("capture_seconds") or 0
        print(f"{name}: engine={v['engine']} capture_device={v.get('capture_device')} "
              f"gpu={v['fingerprint'].get('gpu_name')} sm_{v['fingerprint'].get('compute_capability')} "
              f"capture_seconds={v.get('capture_seconds')}")
print(f"sum of capture seconds: {total:.1f}")
PY
grep -E "precompile: summary|captured|reused" "$OUT/main_job.log" | tail -8 | tee -a "$OUT/summary.txt"
(cd /tmp && "$OLDPWD/.venv-main-user/bin/python" - <<'PY') 2>&1 | tee -a "$OUT/summary.txt"
import torch, tinylm, precompile_runtime
from tinylm import steps
fwd = precompile_runtime.load_packaged("forward", package="tinylm", strict=True)
for dev in [f"cuda:{i}" for i in range(torch.cuda.device_count())]:
    model = tinylm.build_model(seed=0, device=dev)
    ids, _ = tinylm.example_batch(dev)
    got, want = fwd(model, ids), steps.forward(model, ids)
    print(f"forward on {dev}: output device {got.device}, max abs err {(got - want).abs().max().item():.2e}")
PY

if [ "${GPU_CHECK_MODELS:-1}" = 1 ]; then
  echo "== 5. the transformers/timm model matrix on CUDA (built, installed, served like eager)"
  PYTHONPATH=$PWD:$PWD/runtime .venv-main/bin/python -m pytest -q -p no:cacheprovider \
    tests/test_models.py tests/test_tracers.py > "$OUT/models.log" 2>&1
  echo "models rc=$?" | tee -a "$OUT/summary.txt"
  grep -E "passed|failed|Error" "$OUT/models.log" | tail -8 | tee -a "$OUT/summary.txt"
fi
if [ -n "${GPU_CHECK_BENCH:-}" ]; then  # the CUDA section of bench/results/models.md
  .venv-main/bin/python bench/models.py --cases "$GPU_CHECK_BENCH" > "$OUT/bench_models.log" 2>&1
  echo "bench/models.py rc=$?" | tee -a "$OUT/summary.txt"
fi
