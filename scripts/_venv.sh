# Sourced by the scripts here: make_venv DIR [pip requirement...]
# A venv that also sees the packages of $PYTHON's own environment (through a .pth
# file, which works when $PYTHON is itself a venv, as on GPU hosts that ship torch
# in one), so a host whose Python already has torch uses it and needs no package
# registry; elsewhere pip installs what is missing (torch 2.13.0 CPU by default:
# TORCH_SPEC overrides).
# pip runs with --no-warn-conflicts: it checks the dependencies of every package it can
# see, and the venv sees all of $PYTHON's (an AWS CLI, Jupyter, ...), so a conflict
# among those, which this project neither installs nor imports, came out as an
# "ERROR: pip's dependency resolver ..." line during set-up. The packages installed
# here are pinned by the scripts; `DIR/bin/python -m pip check` lists every conflict.
set -euo pipefail
PYTHON=${PYTHON:-python3}
make_venv() {
  local dir=$1; shift
  if [ ! -x "$dir/bin/python" ]; then
    "$PYTHON" -m venv "$dir"
    local parent site
    parent=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$parent" > "$site/_parent_env.pth"
    # Python < 3.12 puts an old setuptools (65.5) into every venv; it would hide a
    # newer one of $PYTHON's environment that the torch seen there requires (>= 77)
    if "$PYTHON" -c "import setuptools" 2>/dev/null && [ -d "$site/setuptools" ]; then
      "$dir/bin/python" -m pip uninstall -q -y setuptools
    fi
  fi
  if ! "$dir/bin/python" -c "import torch" 2>/dev/null; then
    "$dir/bin/python" -m pip install -q --no-warn-conflicts "${TORCH_SPEC:-torch==2.13.0}"
  fi
  if [ $# -gt 0 ]; then
    "$dir/bin/python" -m pip install -q --no-warn-conflicts "$@"
  fi
}
