"""Capture script for target `triton_rmsnorm` (CUDA only): a custom @triton.jit
kernel (fused RMSNorm) called through torch.library.wrap_triton, applied to the
model's embeddings.

Run by the precompile-build backend as `python captures/triton_rmsnorm.py` from the
project root, with PRECOMPILE_DEVICE=cuda, PRECOMPILE_ARTIFACT_PATH and
PRECOMPILE_CACHE_PATH set, and the project root first on PYTHONPATH: tinylm
imports from the source tree, uninstalled.
"""

import os
import sys

import torch

import precompile_build
import tinylm
from tinylm import steps

device = os.environ.get("PRECOMPILE_DEVICE", "cuda")
if not torch.cuda.is_available() or not device.startswith("cuda"):
    sys.exit(
        f"triton_rmsnorm needs a CUDA device (PRECOMPILE_DEVICE={device!r}, "
        f"torch.cuda.is_available()={torch.cuda.is_available()})"
    )
model = tinylm.build_model(seed=0, device=device)
ids, _ = tinylm.example_batch(device)

with precompile_build.capture(steps.triton_rmsnorm) as f:
    f(model, ids)
