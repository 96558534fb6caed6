"""Capture one decoding target of the model matrix: `python captures/decode.py NAME`."""

import os
import sys

import modelzoo

modelzoo.capture_decoding(sys.argv[1], os.environ.get("PRECOMPILE_DEVICE", "cpu"))
