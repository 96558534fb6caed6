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

ids, targets = fcases.attn_batch(3, 5, device=dev)
for t in (ids, targets):  # batch in [2, 8], sequence length in [2, 16]
    torch._dynamo.mark_dynamic(t, 0, min=2, max=8)
    torch._dynamo.mark_dynamic(t, 1, min=2, max=16)
with precompile_build.capture(fcases.attn_step, engine="frozen") as f:
    f(fcases.attn_model(device=dev), ids, targets)
