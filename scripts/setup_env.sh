#!/usr/bin/env bash
# Create (or reuse) the virtual environment at .venv and install gpu_notebook into it.
# Usage: scripts/setup_env.sh [EXTRAS]   (default extras: all; the test script passes dev)
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-all}"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "==> creating .venv"
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
echo "==> installing gpu_notebook[$EXTRAS] into .venv (torch pinned by constraints-dev.txt)"
# the checkpoint codec's C kernels must build here (a failed build would otherwise leave an older one in place)
GPU_NOTEBOOK_BUILD_NATIVE="${GPU_NOTEBOOK_BUILD_NATIVE:-require}" \
    .venv/bin/python -m pip install -q -c constraints-dev.txt -e ".[$EXTRAS]"
# A kernel spec inside the venv, so notebooks executed by nbclient use this interpreter.
.venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gpu_notebook)" >/dev/null
