#!/usr/bin/env bash
# On one GPU (H200): validation within the memory the model needs, at real size.
#   1. tests/test_gpu_memory.py: a CUDA capture's GPU peak <= 1.5x its eager call's (each
#      step's peak recorded); a reference the GPU cannot hold moves to the CPU, in fp64
#      (and the CPU tests of the fp64-view kind)
#   2. a 1B Llama (Llama-3.2-1B shapes): capture, load, eager, torch.compile cold
#   3. an 8B Llama (Llama-3-8B shapes, bf16): capture with validation on, then load with
#      PRECOMPILE_NO_COMPILE=1 (compiler modules imported by the load counted), eager,
#      torch.compile cold last (if the step's limit cuts it, the other modes are kept)
#   4. a 3B Llama (Llama-3.2-3B shapes) captured under a 24 GiB cap, if time is left
# Budget ~9 minutes in all: each step gets at most its share of what is left.
# PARTS="tests 1b 8b 3b" (default: all) picks steps. Results: $OUT/scale_cuda.md,
# $OUT/scale_cuda_llama_*.json, $OUT/tests.log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_memory_at_size}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/runtime${PYTHONPATH:+:$PYTHONPATH}"
PARTS="${PARTS:-tests 1b 8b 3b}"
BUDGET="${BUDGET:-540}"
SECONDS=0

source scripts/_gpu_steps.sh  # budget_step NAME LIMIT_S COMMAND...

python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name(0))"
for part in $PARTS; do
  case "$part" in
    tests) budget_step tests 120 bash -c "python3 -m pytest -q -p no:cacheprovider tests/test_gpu_memory.py tests/test_reference.py > '$OUT/tests.log' 2>&1; rc=\$?; tail -5 '$OUT/tests.log'; exit \$rc" ;;
    1b) budget_step 1b 220 python3 bench/scale.py --device cuda --llama --sizes 1b --modes capture,load,eager,compile --tag 1b --out "$OUT" ;;
    8b) budget_step 8b 280 python3 bench/scale.py --device cuda --llama --sizes 8b --modes capture,load,eager,compile --tag 8b --out "$OUT" ;;
    3b) if (($(left 150) < 90)); then echo "== 3b-cap24: skipped (under 90 s left; PARTS=3b runs it alone)"; continue; fi
        budget_step 3b-cap24 150 python3 bench/scale.py --device cuda --llama --sizes 3b --modes capture --cap-gib 24 --tag 3b_cap24 --out "$OUT" ;;
    *) echo "== unknown part $part" ;;
  esac
done
echo "== numbers per size (capture peak vs its eager call; first result vs eager; capture s vs torch.compile cold)"
python3 - "$OUT" <<'EOF'
import json, pathlib, sys
sys.path.insert(0, "bench")
from scale_llama import _PEAK_STEPS, peak_step
for p in sorted(pathlib.Path(sys.argv[1]).glob("scale_cuda_llama_*.json")):
    for size, r in json.loads(p.read_text())["rows"].items():
        c, ld, e, cc = (r.get(m, {}) for m in ("capture", "load", "eager", "compile"))
        if "error" in c:
            print(f"{p.stem} {size}: capture FAILED: {c['error'].strip().splitlines()[-1][:300]}")
        elif c.get("eager_gpu_bytes"):
            ratio = c["gpu_bytes"] / c["eager_gpu_bytes"]
            print(f"{p.stem} {size}: capture peak {c['gpu_bytes'] / 2**30:.2f} GiB = {ratio:.2f}x eager's "
                  f"{c['eager_gpu_bytes'] / 2**30:.2f} GiB [{'ok' if ratio <= 1.5 else 'OVER 1.5x'}], in "
                  f"{peak_step(c)}; reference {c['validation'].get('reference')}"
                  f"{' (spilled to CPU)' if c['validation'].get('spilled_to_cpu') else ''}")
            print(f"{p.stem} {size}:   GPU GiB per step: " + ", ".join(
                f"{s} {c[s + '_gpu_bytes'] / 2**30:.2f}" for s in _PEAK_STEPS if s + "_gpu_bytes" in c))
        if "capture_s" in c:
            cold = cc.get("first_result_s")
            print(f"{p.stem} {size}: capture {c['capture_s']:.0f} s (Inductor compile {c.get('compile_s', 0):.0f} s), "
                  "torch.compile cold first result " + ("-" if cold is None else
                  f"{cold:.0f} s [{'ok' if c['capture_s'] <= cold else 'capture slower'}]"))
        for name, m in (("load", ld), ("eager", e), ("compile", cc)):
            if "error" in m:
                print(f"{p.stem} {size}: {name} FAILED: {m['error'].strip().splitlines()[-1][:300]}")
        if ld and "error" not in ld:
            eager = e.get("first_result_s")
            print(f"{p.stem} {size}: load first result {ld['first_result_s']:.2f} s (eager "
                  + ("-" if eager is None else f"{eager:.2f} s [{'ok' if ld['first_result_s'] <= eager else 'slower'}]")
                  + f"), compiler modules imported: {len(ld['compiler_modules_imported'])}, max |loaded - eager| "
                  f"{ld['max_abs_vs_eager']:.3g}")
EOF
python3 bench/scale.py --device cuda --llama --rewrite --out "$OUT" > /dev/null  # the table, from every JSON
[ -f "$OUT/scale_cuda.md" ] && cat "$OUT/scale_cuda.md"
echo "== done in ${SECONDS} s"
