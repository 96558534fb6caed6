"""Regenerates the cubins of this folder (tests/test_cubin_target.py reads them):
a one-store Triton kernel compiled by Triton (compile-only, no GPU) for sm_80, sm_90a,
sm_100a, sm_120a, plus sm_90 and sm_100 from the same PTX by ptxas directly (Triton
compiles 9.0 and above for the 'a' targets only), once with Triton's own ptxas (CUDA
12.8; 12.9 for sm_100 and later) and once with CUDA 13.0's (torch's cu130 wheels ship
one, which Inductor sets as TRITON_PTXAS_PATH: the H200's native cubins), whose ELF
headers differ.

    CUDA_VISIBLE_DEVICES= python regenerate.py /usr/local/cuda-13.0/bin/ptxas

(run with triton 3.6; the files are written next to this script).
"""

import os
import subprocess
import sys
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import get_ptxas
from triton.compiler import ASTSource

HERE = os.path.dirname(os.path.abspath(__file__))


@triton.jit
def one(y):
    tl.store(y, 1.0)


def compiled(cc):
    src = ASTSource(fn=one, signature={"y": "*fp32"}, constexprs={})
    return triton.compile(src, target=GPUTarget("cuda", cc, 32)).asm


def ptxas(tool, ptx, target, out):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(
                "\n".join(
                    f".target {target}" if line.startswith(".target ") else line
                    for line in ptx.splitlines()
                )
                + "\n"
            )
        subprocess.run([tool, f"--gpu-name={target}", path, "-o", out], check=True)


def main(cuda13_ptxas):
    for cc, other in ((80, None), (90, "sm_90"), (100, "sm_100"), (120, None)):
        for version, tool in ((None, None), ("13.0", cuda13_ptxas)):
            for knob in (
                "TRITON_PTXAS_PATH",
                "TRITON_PTXAS_BLACKWELL_PATH",
            ):  # read at each compile
                os.environ.pop(knob, None)
                if tool:
                    os.environ[knob] = tool
            os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp()
            asm = compiled(cc)
            version = version or get_ptxas(cc).version
            target = f"sm_{cc}{'a' if cc >= 90 else ''}"
            with open(os.path.join(HERE, f"ptxas{version}-{target}.cubin"), "wb") as f:
                f.write(asm["cubin"])
            if other:
                ptxas(
                    get_ptxas(cc).path,
                    asm["ptx"],
                    other,
                    os.path.join(HERE, f"ptxas{version}-{other}.cubin"),
                )


if __name__ == "__main__":
    main(sys.argv[1])
