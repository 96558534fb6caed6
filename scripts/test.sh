#!/usr/bin/env bash
# The test suite: installs what the tests need into .venv-test (torch 2.13 CPU) and
# .venv-torch214 (torch 2.14.1, which has torch.compiler.precompile), then runs
# pytest in both. Extra arguments go to pytest (e.g. -k runtime, -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
deps=(pytest hypothesis setuptools wheel build packaging filelock pyproject-hooks uv twine auditwheel pyelftools)

echo "== lint (ruff, the whole tree) and types (mypy, runtime/: [tool.mypy] in pyproject.toml)"
make_venv .venv-test "${deps[@]}" "ruff==0.17.6" "mypy==2.4.1"  # pinned: a new release may add checks
.venv-test/bin/python -m pip install -q -e ./runtime -e .
.venv-test/bin/python -m ruff check .
.venv-test/bin/python -m mypy

echo "== tests under torch 2.13 (frozen and eager engines, backend, runtime)"
.venv-test/bin/python -m pytest -q -p no:cacheprovider tests example_project/tests "$@"

echo "== tests under torch 2.14.1 (the torch engine; the transformers/timm model matrix)"
# torchvision (timm needs it) exists for this torch; transformers pinned: the matrix's
# tiny configs are tested at this version (the GPU host has it too)
TORCH_SPEC=torch==2.14.1 make_venv .venv-torch214 "${deps[@]}" torchvision==0.29.1 transformers==5.17.0 timm==1.0.31
.venv-torch214/bin/python -m pip install -q -e ./runtime -e .
# the torch engine's tests, the frozen engine's cases, the tracers (and the one-pass export
# on torch's private names), the example project
# built with each engine (the frozen engine must keep working on the newest torch too),
# transformers decoding (StaticCache arguments, the export wrapper), the model matrix and
# the tensor-parallel Llama (two gloo ranks under torchrun; transformers is here only, so
# the torch 2.13 run skips it and runs tests/test_tensor_parallel.py's MLP instead)
.venv-torch214/bin/python -m pytest -q -p no:cacheprovider \
  tests/test_torch_engine.py tests/test_frozen_engine.py tests/test_frozen_dynamic_dims.py tests/test_tracers.py \
  tests/test_aten_export.py tests/test_example_project.py tests/test_llm_decode.py tests/test_decode_fast_path.py tests/test_models.py \
  tests/test_tp_llama.py "$@"
