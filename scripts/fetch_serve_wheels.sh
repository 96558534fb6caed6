#!/usr/bin/env bash
# Run where a package registry is reachable: the wheels the HTTP server tests need
# (fastapi, uvicorn and what they require, plus build), for the GPU host's Python 3.12 on
# x86_64 and aarch64, into .whl/ (scripts/gpu_serving.sh installs from there with --no-index).
set -euo pipefail
cd "$(dirname "$0")/.."
for plat in manylinux_2_17_x86_64 manylinux_2_17_aarch64; do
  python3 -m pip download -q --dest .whl --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --platform "$plat" "fastapi==0.165.0" "uvicorn==0.54.0" build
done
ls .whl
