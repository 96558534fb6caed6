"""Capture one case of the model matrix: `python captures/capture.py CASE`."""

import os
import sys

import modelzoo

import precompile_build

name = sys.argv[1]
device = os.environ.get("PRECOMPILE_DEVICE", "cpu")
model, inputs = modelzoo.example(name, device)
modelzoo.mark(name, inputs)
with precompile_build.capture(modelzoo.CASES[name].fn) as f:
    f(model, *inputs)
