"""Capture script for target `forward`: inference logits for a batch of token ids.

Run by the precompile-build backend as `python captures/forward.py` from the project
root, with PRECOMPILE_DEVICE, PRECOMPILE_ARTIFACT_PATH and PRECOMPILE_CACHE_PATH set.
"""

import os
import sys
from pathlib import Path

# The build has not installed tinylm: import it from the project root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import precompile_build  # noqa: E402
import tinylm  # noqa: E402
from tinylm import steps  # noqa: E402

device = os.environ.get("PRECOMPILE_DEVICE", "cpu")
model = tinylm.build_model(seed=0, device=device)
ids, _ = tinylm.example_batch(device)

with precompile_build.capture(steps.forward) as f:
    f(model, ids)
