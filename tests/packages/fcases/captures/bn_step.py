import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fcases  # noqa: E402
import torch  # noqa: E402

import precompile_build  # noqa: E402

dev = os.environ.get(
    "PRECOMPILE_DEVICE", "cpu"
)  # the target's device = "auto": cuda where there is one

torch.manual_seed(1)
with precompile_build.capture(fcases.bn_step, engine="frozen") as f:
    f(fcases.bn_model(device=dev), torch.randn(8, 16).to(dev), 0.5)
