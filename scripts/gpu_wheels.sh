#!/usr/bin/env bash
# Wheels the GPU machine's image lacks (it has torch and numpy, but not zstandard, blake3 or xxhash, and cannot reach
# PyPI): downloaded here into .gpu_wheels/ (git-ignored) for its Python (3.12, x86-64); the device tool carries
# that folder (carry: [".gpu_wheels"]) and scripts/gpu_check.sh installs them there.
#   scripts/gpu_wheels.sh [PYTHON_VERSION]     # default 3.12
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${1:-3.12}"
ABI="cp${PYV/./}"
PIP=".venv/bin/pip"; [ -x "$PIP" ] || PIP="python3 -m pip"
rm -rf .gpu_wheels && mkdir -p .gpu_wheels
$PIP download -q --only-binary=:all: --no-deps --python-version "$PYV" --implementation cp --abi "$ABI" \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu_wheels zstandard blake3 xxhash
ls -la .gpu_wheels
