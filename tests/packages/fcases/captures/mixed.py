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

torch.manual_seed(2)
with precompile_build.capture(fcases.mixed, engine="frozen") as f:
    f(*fcases.mixed_models(device=dev), torch.randn(4, 8).to(dev))
