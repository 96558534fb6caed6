import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch  # noqa: E402

import fcases  # noqa: E402
import precompile_build  # noqa: E402

torch.manual_seed(2)
with precompile_build.capture(fcases.mixed, engine="frozen") as f:
    f(*fcases.mixed_models(), torch.randn(4, 8))
