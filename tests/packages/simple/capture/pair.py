"""Fixture capture script: writes a valid eager pair without compiling anything.

``--mode`` picks a behaviour for the failure tests; see the branches below.
The fingerprint comes from FIXTURE_FINGERPRINT (JSON) when set, so no torch import.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from precompile_runtime.envelope import Envelope, dumps

SOURCE = """PRECOMPILE_METADATA = {{"format": "precompile-build.source", "version": 1,
    "engine": {engine!r}, "target": {target!r}, "device": "cpu"}}


def load(kernel_dir):
    return lambda x: x * {factor}
"""

p = argparse.ArgumentParser()
p.add_argument("--mode", default="ok")
p.add_argument("--factor", default="2")
p.add_argument("--pid-file")
p.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep before writing")
a = p.parse_args()
target = os.environ["PRECOMPILE_TARGET"]
src_path = os.environ["PRECOMPILE_ARTIFACT_PATH"]
cache_path = os.environ["PRECOMPILE_CACHE_PATH"]
print(
    f"fixture capture of {target} (mode {a.mode}) on {os.environ['PRECOMPILE_DEVICE']}", flush=True
)
if "FIXTURE_MARK" in os.environ:  # lets a test see that the script ran
    open(os.environ["FIXTURE_MARK"], "w").close()

if os.environ.get("PRECOMPILE_CUDA_GRAPHS") == "1" and os.environ["PRECOMPILE_DEVICE"] != "cuda":
    sys.exit("CaptureError: cuda-graphs = true needs a CUDA inference target")  # as the capture
if a.mode == "raise":
    raise RuntimeError("boom from capture script")
if a.mode == "longerror":  # a long one-line error whose advice comes last (over a log line's cap)

    class CaptureError(Exception):
        pass

    raise CaptureError(f"target {target!r}: " + "detail " * 80 + "ADVICE AT THE END")
if a.mode == "exit":
    sys.exit(3)
if a.mode == "faketrace":  # output that looks like a traceback, then a plain exit
    print(
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "PrintedError: only printed",
        flush=True,
    )
    sys.exit(3)
if a.mode == "segv":
    os.kill(os.getpid(), 11)
if a.mode == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(a.pid_file, "w") as f:
        f.write(str(child.pid))
    time.sleep(600)
if a.mode == "spam":
    line = "x" * 999 + "\n"
    for _ in range(5000):  # ~5 MB
        sys.stdout.write(line)
    print("last words before failing")
    sys.exit(1)
if a.mode == "nothing":
    sys.exit(0)
if a.mode == "pywarn":  # what precompile_build.capture prints for random.random() in fn
    print(
        f"capture.py:9: PythonStateWarning: target {target!r}: the function drew from "
        "random while it was captured; Python code runs once, at capture",
        file=sys.stderr,
    )
if a.mode == "fallbackwarn":  # what precompile_build.capture prints where auto traced with make_fx
    print(
        f"capture.py:9: TracerFallbackWarning: target {target!r}: torch.export failed (RuntimeError: "
        "x); traced with make_fx, which specialises data-dependent branches to the example's path",
        file=sys.stderr,
    )
if a.sleep:
    print(f"sleeping {a.sleep} s", flush=True)
    time.sleep(a.sleep)

engine = "frozen" if a.mode.startswith("frozen") else "eager"
source = SOURCE.format(engine=engine, target=target, factor=a.factor).encode()
if "FIXTURE_FINGERPRINT" in os.environ:
    fp = json.loads(os.environ["FIXTURE_FINGERPRINT"])
else:
    from precompile_runtime.fingerprint import host_fingerprint

    fp = host_fingerprint("cpu")
if a.mode in ("cuda-fp", "frozen-cuda-fp"):
    fp.update(device_type="cuda", compute_capability="9.0", gpu_name="Fixture GPU")
code_hash = hashlib.sha256(source if a.mode != "badhash" else b"other").hexdigest()
kernel = b"\x7fELF fixture kernel"
if "FIXTURE_KERNEL" in os.environ:  # a real ELF file, for the platform tag tests
    with open(os.environ["FIXTURE_KERNEL"], "rb") as f:
        kernel = f.read()
blobs = {"kernel.so": kernel} if engine == "frozen" else {}
cache = dumps(Envelope(engine=engine, code_hash=code_hash, fingerprint=fp, meta={}, blobs=blobs))
if a.mode != "cache-only":
    with open(src_path, "wb") as f:
        f.write(source)
if a.mode != "source-only":
    with open(cache_path, "wb") as f:
        f.write(cache)
