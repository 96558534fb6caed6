"""Capture script for target `forward`: inference logits for a batch of token ids.

Run by the precompile-build backend as `python captures/forward.py` from the project
root, with PRECOMPILE_DEVICE, PRECOMPILE_ARTIFACT_PATH and PRECOMPILE_CACHE_PATH set,
and the project root first on PYTHONPATH: tinylm imports from the source tree,
uninstalled.
"""

import os

import precompile_build
import tinylm
from tinylm import steps

device = os.environ.get("PRECOMPILE_DEVICE", "cpu")
model = tinylm.build_model(seed=0, device=device)
ids, _ = tinylm.example_batch(device)

with precompile_build.capture(steps.forward) as f:
    f(model, ids)
