#!/usr/bin/env bash
# Set everything up (or reuse it) and run examples/quickstart.ipynb end to end on a local Ray cluster,
# headless. Writes examples/quickstart.executed.ipynb and prints a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh all
export RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/python scripts/run_notebook.py examples/quickstart.ipynb "$@"
