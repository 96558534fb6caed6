"""Capture script for target `train_step`: loss, backward, gradients accumulated onto
the model's parameters like eager.

Run by the precompile-build backend as `python captures/train_step.py` from the
project root, with PRECOMPILE_DEVICE, PRECOMPILE_ARTIFACT_PATH and
PRECOMPILE_CACHE_PATH set, and the project root first on PYTHONPATH: tinylm
imports from the source tree, uninstalled.
"""

import os

import precompile_build
import tinylm
from tinylm import steps

device = os.environ.get("PRECOMPILE_DEVICE", "cpu")
model = tinylm.build_model(seed=0, device=device)
ids, targets = tinylm.example_batch(device)

with precompile_build.capture(steps.train_step) as f:
    f(model, ids, targets)
