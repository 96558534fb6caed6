# Sourced by the scripts here: make_venv DIR [pip requirement...]
# A venv that sees the system's site-packages, so a host whose Python already has
# torch (a GPU host without a package registry) uses it; elsewhere pip installs what
# is missing (torch 2.13.0 CPU by default: TORCH_SPEC overrides).
set -euo pipefail
PYTHON=${PYTHON:-python3}
make_venv() {
  local dir=$1; shift
  if [ ! -x "$dir/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$dir"
  fi
  if ! "$dir/bin/python" -c "import torch" 2>/dev/null; then
    "$dir/bin/python" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}"
  fi
  if [ $# -gt 0 ]; then
    "$dir/bin/python" -m pip install -q "$@"
  fi
}
