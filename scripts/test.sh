#!/usr/bin/env bash
# The test suite: installs what the tests need into .venv-test (torch 2.13 CPU) and
# .venv-torch214 (torch 2.14.1, which has torch.compiler.precompile), lints, type-checks,
# builds the docs site, then runs pytest in both. Extra arguments go to pytest (e.g.
# -k runtime, -m "not slow and not gpu": docs/contributing.md says what the marks mean).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
# fastapi + uvicorn: the HTTP server of tests/test_serve_http.py (docs/serving.md).
# pinned: the versions the suite was last run with (a new pytest changed how monkeypatch
# undoes, a new ruff or mypy adds checks); raise a pin in its own commit, after a full run
deps=(pytest==9.0.3 hypothesis==6.155.2 setuptools==84.2.1 wheel==0.48.0 build==1.6.1 packaging==26.2
      filelock==4.3.1 pyproject-hooks==1.3.3 uv==0.13.9 twine==7.0.0 auditwheel==6.8.2 pyelftools==0.33
      typeguard==4.6.0 fastapi==0.165.0 uvicorn==0.54.0)

echo "== lint (ruff, the whole tree) and types (mypy, both packages: [tool.mypy] in pyproject.toml)"
# the backends precompile_build.backend wraps in tests/test_build_backends*.py (editables:
# hatchling's editable wheels; scikit-build-core uses the system's cmake and ninja)
make_venv .venv-test "${deps[@]}" "ruff==0.17.6" "mypy==2.4.1" "mkdocs==1.6.1" \
  hatchling==1.33.0 flit-core==4.2.0 pdm-backend==2.5.0 editables==0.6 scikit-build-core==1.1.2
.venv-test/bin/python -m pip install -q -e ./runtime -e .
.venv-test/bin/python -m ruff check .
.venv-test/bin/python -m mypy
.venv-test/bin/python -m mypy --strict runtime/precompile_runtime  # what a served process imports: strict
.venv-test/bin/python -m ruff format --check .

echo "== the docs site (mkdocs.yml: every page in the nav, every link and anchor resolves)"
# no --quiet: it hides the warnings from --strict too, and the check could not fail;
# the log is kept and any WARNING line fails the check (a link outside docs/ included)
site=$(mktemp -d)
if ! .venv-test/bin/python -m mkdocs build --strict --site-dir "$site" >"$site.log" 2>&1 \
    || grep -q "WARNING" "$site.log"; then
  cat "$site.log"; rm -rf "$site" "$site.log"; echo "docs: mkdocs build --strict failed"; exit 1
fi
rm -rf "$site" "$site.log"

echo "== tests under torch 2.13 (frozen and eager engines, backend, runtime)"
.venv-test/bin/python -m pytest -q -p no:cacheprovider tests example_project/tests "$@"

echo "== tests under torch 2.14.1 (the torch engine; the transformers/timm model matrix)"
# torchvision (timm needs it) exists for this torch; transformers pinned: the matrix's
# tiny configs are tested at this version (the GPU host has it too); peft for the
# adapter state a served call checks (test_assumed_state.py); sentence-transformers (the
# GPU host's version): its forward adds keys to the dict it is given
# pdm-backend: timm's own sdist built with a target (tests/test_real_library.py)
TORCH_SPEC=torch==2.14.1 make_venv .venv-torch214 "${deps[@]}" torchvision==0.29.1 transformers==5.17.0 timm==1.0.31 \
  peft==0.21.2 sentence-transformers==6.0.1 pdm-backend==2.5.0
.venv-torch214/bin/python -m pip install -q -e ./runtime -e .
# the torch engine's tests, the frozen engine's cases, the tracers (and the one-pass export
# on torch's private names), the example project
# built with each engine (the frozen engine must keep working on the newest torch too),
# transformers decoding (StaticCache arguments, the export wrapper) and the model matrix; sizes the
# data decides with torchvision's nms and FasterRCNN, transformers' ModelOutput results, and an
# extern kernel max-autotune picks (bias_addmm) bound as a torch call in this torch's wrapper;
# the tensor-parallel Llama (two gloo ranks under torchrun; transformers is here only, so
# the torch 2.13 run skips it and runs tests/test_tensor_parallel.py's MLP instead)
.venv-torch214/bin/python -m pytest -q -p no:cacheprovider \
  tests/test_torch_engine.py tests/test_frozen_engine.py tests/test_frozen_dynamic_dims.py tests/test_tracers.py \
  tests/test_aten_export.py tests/test_example_project.py tests/test_llm_decode.py tests/test_decode_fast_path.py tests/test_models.py \
  tests/test_assumed_state.py tests/test_data_dependent.py tests/test_results_and_arguments.py \
  tests/test_max_autotune.py::test_an_extern_choice_is_a_plain_torch_call_served_without_the_compiler \
  tests/test_tp_llama.py tests/test_real_library.py tests/test_guards.py tests/test_guards_state_reads.py "$@"

echo "== the guards under torch 2.11 (the GPU host's torch: its Dynamo guards no class attribute)"
# capturing/class_attributes.py checks them there; tests/test_guards.py runs its probe and
# the class-attribute cases on this torch
TORCH_SPEC=torch==2.11.0 make_venv .venv-torch211 \
  pytest==9.0.3 hypothesis==6.155.2 packaging==26.2 filelock==4.3.1 numpy  # (torch 2.11 caps setuptools)
.venv-torch211/bin/python -m pip install -q --no-warn-conflicts -e ./runtime -e .
.venv-torch211/bin/python -m pytest -q -p no:cacheprovider tests/test_guards.py tests/test_guards_state_reads.py "$@"
