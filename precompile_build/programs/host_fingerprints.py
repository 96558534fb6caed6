"""The host fingerprint per device type, printed as JSON (builder/capture_cache.py:
host_fingerprints starts it as ``python host_fingerprints.py DEVICE...``, so that the
build process neither imports torch nor creates a CUDA context on a GPU the captures
need). For ``cuda``, one fingerprint per visible GPU (or the one without a GPU)."""

import json
import sys
from typing import Any

from precompile_runtime.fingerprint import host_fingerprint


def main() -> None:
    out: dict[str, list[Any]] = {}
    for dev in sys.argv[1:]:
        if dev == "cuda":
            import torch

            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            out[dev] = [host_fingerprint("cuda", i) for i in range(n)] or [host_fingerprint("cuda")]
        else:
            out[dev] = [host_fingerprint(dev)]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
