import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fcases  # noqa: E402

import precompile_build  # noqa: E402

dev = os.environ.get(
    "PRECOMPILE_DEVICE", "cpu"
)  # the target's device = "auto": cuda where there is one

with precompile_build.capture(fcases.tied_forward, engine="frozen") as f:
    f(fcases.tied_model(device=dev), fcases.example_ids(dev))
