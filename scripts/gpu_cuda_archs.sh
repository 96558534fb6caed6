#!/usr/bin/env bash
# On one GPU host (an H200, sm_90): kernels for GPUs the build host lacks.
#   1. example_project's forward + triton_rmsnorm captured with cuda-archs 8.0 9.0 10.0 12.0;
#      the build lines and `inspect`
#   2. every cubin against the target it is filed under: its ELF header (SM and 'a') and
#      cuobjdump (which may drop the 'a' of a ptxas 13 cubin: then the SM must agree)
#   3. the same capture with the build GPU's architecture compiled through the cross path too
#      (PRECOMPILE_TEST_CROSS_NATIVE=1: the compile-only process sees no GPU) and frozen in
#      place of the native cubins: validated at capture, then served here against eager
#   4. the sm_80 PTX of step 1's pairs JIT-compiled by the driver on this GPU
#      (PRECOMPILE_TEST_FORCE_PTX=1) against eager; refused under PRECOMPILE_NO_COMPILE=1
#   5. a user Triton kernel whose fastest config needs more shared memory than sm_86 has:
#      replaced for 8.6 by the next best candidate of the H200's autotuning
#   6. tests/test_cross_arch.py (its compile-only tests run where triton is installed),
#      tests/test_cross_arch_recorded.py, test_gpu_frozen's test_template_is_self_contained
# Each step prints "STEP n ... rc=N" and "RESULT ...: PASS|FAIL"; 8 small files go to $OUT
# (default /tmp/gpu_cuda_archs): summary.txt first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_cuda_archs}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:$PWD/runtime PYTHONUNBUFFERED=1 PRECOMPILE_CACHE=0
W=$(mktemp -d)
cp -r example_project "$W/proj"
SUM="$OUT/summary.txt"
: > "$SUM"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))' 2>&1 | tee -a "$SUM"

echo "== STEP 1: capture with cuda-archs 8.0,9.0,10.0,12.0" | tee -a "$SUM"
PRECOMPILE_CUDA_ARCHS=8.0,9.0,10.0,12.0 timeout 300 python3 -m precompile_build capture \
  --project "$W/proj" --targets forward,triton_rmsnorm --out "$W/archs" > "$OUT/build.log" 2>&1
echo "STEP 1 capture rc=$?" | tee -a "$SUM"
grep -E "precompile: (forward|triton_rmsnorm):" "$OUT/build.log" | cut -c1-600 | tee -a "$SUM"
cp "$W/archs/manifest.json" "$OUT/manifest_archs.json" 2>/dev/null  # a recorded multi-arch manifest
python3 -m precompile_build inspect "$W/archs" > "$OUT/inspect.txt" 2>&1
echo "STEP 1 inspect rc=$?" | tee -a "$SUM"
grep -E "^target|variant|compiled for|binaries|left out|replaced|this host" "$OUT/inspect.txt" | tee -a "$SUM"

cat > "$W/check.py" <<'PY'
"""Helpers of gpu_cuda_archs.sh: cubins vs cuobjdump, and serving pairs against eager."""
import ast, glob, os, re, subprocess, sys
sys.path.insert(0, os.path.join(os.environ["W"], "proj"))
import torch
import tinylm
from tinylm import steps
from precompile_runtime.envelope import loads
from precompile_build.engines.cross_arch import cubin_target

def meta_of(src):
    tree = ast.parse(open(src).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PRECOMPILE_METADATA":
            return ast.literal_eval(node.value)

def cuobjdump():
    """The newest cuobjdump here (Triton's, the CUDA toolkit's, PATH's) and its release."""
    import importlib.util, shutil
    spec = importlib.util.find_spec("triton")
    own = os.path.join(os.path.dirname(spec.origin), "backends/nvidia/bin/cuobjdump") if spec else None
    found = []
    for cand in (own, "/usr/local/cuda/bin/cuobjdump", shutil.which("cuobjdump")):
        if cand and os.path.exists(cand):
            out = subprocess.run([cand, "--version"], capture_output=True, text=True).stdout
            m = re.search(r"release (\d+)\.(\d+)", out)
            found.append(((int(m.group(1)), int(m.group(2))) if m else (0, 0), cand))
    return max(found) if found else ((0, 0), "cuobjdump")

def check_elf(d, label):
    """Each cubin against the target it is filed under: its own ELF header, read by
    cross_arch.cubin_target (SM and the architecture-specific 'a'), must name exactly
    that target; cuobjdump (--list-elf names, -sass "code for sm_XX") must name it too,
    except that a cuobjdump older than the cubin's ptxas may drop the 'a' (cuobjdump
    12.8 on ptxas 13 cubins, whose 'a' is in .nv.compat): then the SM must agree."""
    bad = n = 0
    version, tool = cuobjdump()
    print(f"{label}: cuobjdump {version[0]}.{version[1]} ({tool})")
    for src in sorted(glob.glob(f"{d}/*.py")):
        env = loads(open(src[:-3] + ".cache", "rb").read())
        for k in meta_of(src)["kernels"]:
            for c in k.get("archs", []):
                if c["binary"] != "cubin":
                    continue
                n += 1
                data = env.blobs[c["file"]]
                path = os.path.join(os.environ["W"], f"k{n}.cubin")
                open(path, "wb").write(data)
                listed = subprocess.run([tool, "--list-elf", path], capture_output=True, text=True)
                sass = subprocess.run([tool, "-sass", path], capture_output=True, text=True)
                found = sorted(set(re.findall(r"code for (sm_\d+a?)", sass.stdout)))
                elf = re.findall(r"ELF file\s+\d+: k\d+\.(sm_\d+a?)\.cubin", listed.stdout)
                try:
                    header = cubin_target(data)
                except ValueError as e:
                    header = f"unreadable ({e})"
                layout = f"EI_OSABI {data[7]:#x} e_flags {int.from_bytes(data[0x30:0x34], 'little'):#x}"
                named = found + elf
                tool_ok = len(found) == len(elf) == 1 and all(x in (c["sm"], c["sm"].rstrip("a")) for x in named)
                ok = header == c["sm"] and tool_ok
                bad += not ok
                note = " (cuobjdump drops the 'a')" if ok and any(x != c["sm"] for x in named) else ""
                print(f"{os.path.basename(src)} {k['name']} filed as {c['sm']} ({c['origin']}): "
                      f"ELF header {header} ({layout}); cuobjdump -sass {found}, --list-elf {elf}{note}: "
                      + ("ok" if ok else "MISMATCH " + " ".join((listed.stderr + sass.stderr).split())[:200]))
    print(f"{label}: {n} cubins, {bad} not filed under their architecture")
    return bad == 0 and n > 0

def load(src, chosen):
    env = loads(open(src[:-3] + ".cache", "rb").read())
    kdir = src[:-3] + "-kernels"
    for name, blob in env.blobs.items():
        os.makedirs(os.path.dirname(os.path.join(kdir, name)), exist_ok=True)
        open(os.path.join(kdir, name), "wb").write(blob)
    ns = {"__name__": "pair"}
    exec(compile(open(src).read(), src, "exec"), ns)
    cls = ns["_TritonKernel"]
    orig = cls._choose
    def _choose(self, device):
        e, path = orig(self, device)
        chosen.append((self._entry["name"], e.get("sm", "native (single arch)"), e.get("origin", "native"),
                       os.path.splitext(path)[1]))
        return e, path
    cls._choose = _choose
    return ns["load"](kdir)

def serve(d, label, want_kind, errors=None):
    ok = True
    model = tinylm.build_model(seed=0, device="cuda")
    ids, _ = tinylm.example_batch("cuda")
    refs = {"forward": steps.forward, "triton_rmsnorm": steps.triton_rmsnorm_reference}
    for name, ref in refs.items():
        src = f"{d}/{name}.py"
        if not os.path.exists(src):
            print(f"{label} {name}: NO PAIR"); ok = False; continue
        chosen = []
        try:
            with torch.no_grad():
                got, want = load(src, chosen)(model, ids), ref(model, ids)
            torch.cuda.synchronize()
        except Exception as e:
            print(f"{label} {name}: {type(e).__name__}: {str(e)[:400]}"); ok = False
            if errors is not None:
                errors.append(str(e))
            continue
        err = (got.float() - want.float()).abs().max().item()
        kinds = sorted({(sm, origin, ext) for _, sm, origin, ext in chosen})
        good = torch.allclose(got.float(), want.float(), rtol=1e-3, atol=1e-3) and all(want_kind(k) for k in kinds) and kinds
        ok &= bool(good)
        print(f"{label} {name}: {len(chosen)} kernels loaded as {kinds}; max abs err vs eager {err:.2e}: "
              + ("ok" if good else "FAIL"))
    return ok

if __name__ == "__main__":
    what, d = sys.argv[1], sys.argv[2]
    if what == "elf":
        ok = check_elf(d, f"cuobjdump on {os.path.basename(d)}")
    elif what == "native":
        ok = serve(d, "native pairs", lambda k: k[0] == "sm_90a" and k[1] == "native" and k[2] == ".cubin")
    elif what == "cross":
        ok = serve(d, "cross-compiled sm_90", lambda k: k[0] == "sm_90a" and k[1] == "cross" and k[2] == ".cubin")
    elif what == "ptx":
        ok = serve(d, "sm_80 PTX, driver JIT", lambda k: k[0] == "compute_80" and k[2] == ".ptx")
    elif what == "ptx_refused":
        errors = []
        served = serve(d, "PTX under PRECOMPILE_NO_COMPILE=1 (must be refused)", lambda k: False, errors)
        ok = not served and len(errors) == 2 and all("refused under PRECOMPILE_NO_COMPILE=1" in e for e in errors)
    print(f"RESULT {what}: {'PASS' if ok else 'FAIL'}")
    sys.exit(0 if ok else 1)
PY
export W

echo "== STEP 2: cuobjdump on every cubin" | tee -a "$SUM"
timeout 120 python3 "$W/check.py" elf "$W/archs" > "$OUT/elf.txt" 2>&1
echo "STEP 2 rc=$?" | tee -a "$SUM"
{ grep -E "^cuobjdump on" "$OUT/elf.txt"; grep -m1 "filed as sm_90a (native)" "$OUT/elf.txt" | cut -c1-300
  grep -E "MISMATCH|Error" "$OUT/elf.txt" | head -5; grep "^RESULT" "$OUT/elf.txt"; } | tee -a "$SUM"
timeout 120 python3 "$W/check.py" native "$W/archs" 2>&1 | tail -3 | tee -a "$SUM"

echo "== STEP 3: sm_90 through the cross path (GPU hidden from the compiling process)" | tee -a "$SUM"
PRECOMPILE_TEST_CROSS_NATIVE=1 PRECOMPILE_CUDA_ARCHS=8.0,9.0,10.0,12.0 timeout 300 python3 -m precompile_build capture \
  --project "$W/proj" --targets forward,triton_rmsnorm --out "$W/cross" > "$OUT/build_cross.log" 2>&1
echo "STEP 3 capture (validated at capture) rc=$?" | tee -a "$SUM"
grep -E "precompile: (forward|triton_rmsnorm):|Error" "$OUT/build_cross.log" | cut -c1-400 | tee -a "$SUM"
timeout 120 python3 "$W/check.py" elf "$W/cross" > "$W/elf_cross.txt" 2>&1
echo "STEP 3 cuobjdump rc=$?" | tee -a "$SUM"
cat "$W/elf_cross.txt" >> "$OUT/elf.txt"
{ grep -E "^cuobjdump on" "$W/elf_cross.txt"; grep -m1 "filed as sm_90a (cross)" "$W/elf_cross.txt" | cut -c1-300
  grep -E "MISMATCH|Error" "$W/elf_cross.txt" | head -5; grep "^RESULT" "$W/elf_cross.txt"; } | tee -a "$SUM"
timeout 120 python3 "$W/check.py" cross "$W/cross" 2>&1 | tail -3 | tee -a "$SUM"

echo "== STEP 4: the sm_80 PTX JIT-compiled by the driver on this GPU" | tee -a "$SUM"
PRECOMPILE_TEST_FORCE_PTX=1 timeout 120 python3 "$W/check.py" ptx "$W/archs" 2>&1 | tail -3 | tee -a "$SUM"
PRECOMPILE_TEST_FORCE_PTX=1 PRECOMPILE_NO_COMPILE=1 timeout 120 python3 "$W/check.py" ptx_refused "$W/archs" 2>&1 | tail -3 | tee -a "$SUM"

echo "== STEP 5: a config too big for sm_86's shared memory, replaced" | tee -a "$SUM"
cat > "$W/big_smem.py" <<'PY'
import os, ast, sys
import torch, triton, triton.language as tl
import precompile_build
from torch.library import wrap_triton

# The fast config (BK=256) needs ~128 KiB of shared memory per block: fine on sm_90
# (227 KiB), too much for sm_86 (99 KiB). The other config does 65x the work, so the
# H200's autotuning picks BK=256; for 8.6 the cross compile must fall back to BK=64.
@triton.autotune(configs=[triton.Config({"BK": 256, "SLOW": 0}, num_warps=8, num_stages=1),
                          triton.Config({"BK": 64, "SLOW": 1}, num_warps=8, num_stages=1)], key=["K"])
@triton.jit
def mm(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, SLOW: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(tl.load(a + rm[:, None] * K + (k + rk)[None, :]),
                      tl.load(b + (k + rk)[:, None] * N + rn[None, :]))
    if SLOW:
        extra = tl.zeros((BM, BN), tl.float32)
        for r in range(0, 64):
            for k in range(0, K, BK):
                extra += tl.dot(tl.load(a + rm[:, None] * K + (k + rk)[None, :]),
                                tl.load(b + (k + rk)[:, None] * N + rn[None, :]))
        acc += extra * 0.0
    tl.store(c + rm[:, None] * N + rn[None, :], acc.to(tl.float16))

def f(a, b):
    c = torch.empty_like(a)
    wrap_triton(mm)[(8, 8)](a, b, c, 1024, 1024, 1024, BM=128, BN=128)
    return c

a = torch.randn(1024, 1024, device="cuda", dtype=torch.float16) / 32
b = torch.randn(1024, 1024, device="cuda", dtype=torch.float16) / 32
d = os.environ["W"]
with precompile_build.capture(f, artifact_path=f"{d}/big.py", cache_path=f"{d}/big.cache",
                              engine="frozen", target="big_smem",
                              options={"cuda_archs": ["8.6", "9.0"]}) as g:
    g(a, b)
tree = ast.parse(open(f"{d}/big.py").read())
meta = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
            and getattr(n.targets[0], "id", "") == "PRECOMPILE_METADATA")
print("cuda_archs report:", meta.get("cuda_archs"))
ok = False
for k in meta["kernels"]:
    for c in k.get("archs", []):
        print(f"kernel {k['name']} {c['sm']}: config {c['config']}, shared {c['shared']} B, "
              f"replaced: {c.get('replaced', '-')[:300]}")
    by = {c["sm"]: c for c in k.get("archs", [])}
    if "sm_86" in by and "sm_90a" in by:
        ok = ("BK': 256" in by["sm_90a"]["config"] or "BK: 256" in by["sm_90a"]["config"]) \
             and "replaced" in by["sm_86"] and by["sm_86"]["shared"] <= 99 * 1024
print("RESULT big_smem:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
timeout 300 python3 "$W/big_smem.py" > "$OUT/big_smem.txt" 2>&1
echo "STEP 5 rc=$?" | tee -a "$SUM"
grep -E "kernel|RESULT|Error" "$OUT/big_smem.txt" | cut -c1-400 | tail -8 | tee -a "$SUM"

echo "== STEP 6: tests/test_cross_arch.py, test_cross_arch_recorded.py, the launcher template's self-containment" | tee -a "$SUM"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cross_arch.py tests/test_cross_arch_recorded.py \
  tests/test_gpu_frozen.py::test_template_is_self_contained > "$OUT/pytest.txt" 2>&1
echo "STEP 6 rc=$?" | tee -a "$SUM"
tail -3 "$OUT/pytest.txt" | tee -a "$SUM"
rm -rf "$W"
