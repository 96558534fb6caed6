#!/usr/bin/env bash
# The main job: build the example project's wheel with its precompiled artifacts,
# install it into a fresh environment, run its precompiled functions against eager.
#   bash scripts/main_job.sh            (PYTHON=python3.X to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
root=$PWD
dist=$root/dist
rm -rf "$dist" .venv-main-user
mkdir -p "$dist"

echo "== build environment (.venv-main)"
make_venv .venv-main setuptools wheel build packaging filelock
.venv-main/bin/python -m pip wheel -q --no-deps --no-build-isolation -w "$dist" ./runtime .
ours=("$dist"/precompile_runtime-*.whl "$dist"/precompile_build-*.whl)
.venv-main/bin/python -m pip install -q --force-reinstall --no-deps "${ours[@]}"  # this tree's code
.venv-main/bin/python -m pip install -q "${ours[@]}"  # and whatever they need that is missing

echo "== build the tinylm wheel (captures run here)"
.venv-main/bin/python -m build --no-isolation --wheel --outdir "$dist" example_project

echo "== install into a fresh environment (.venv-main-user)"
make_venv .venv-main-user
# the runtime built here, even where $PYTHON's environment has one (an editable
# install there is metadata pip counts as installed, but not importable from here)
.venv-main-user/bin/python -m pip install -q --force-reinstall --no-deps "$dist"/precompile_runtime-*.whl
.venv-main-user/bin/python -m pip install -q --find-links "$dist" "$dist"/tinylm-*.whl

echo "== run the precompiled functions (empty compiler caches)"
export TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) TRITON_CACHE_DIR=$(mktemp -d)
export PRECOMPILE_CACHE_DIR=$(mktemp -d)
cd /tmp && "$root/.venv-main-user/bin/python" -m tinylm.demo
