"""Capture `forward` of the model named by argv[1] (see benchmodels.build)."""

import os
import sys
from pathlib import Path

here = Path(__file__).resolve()
sys.path[:0] = [str(here.parents[1]), str(here.parents[3] / "example_project")]

import benchmodels  # noqa: E402

import precompile_build  # noqa: E402

device = os.environ.get("PRECOMPILE_DEVICE", "cpu")
model, args = benchmodels.build(sys.argv[1], device)
with precompile_build.capture(
    benchmodels.forward, engine=os.environ.get("BENCH_ENGINE", "auto")
) as f:
    f(model, *args)
