#!/usr/bin/env bash
# Set everything up from scratch (or reuse it) and run the whole test suite.
# Installs: the .venv with gpu_notebook[dev]; Debian's chromium for the browser test and Debian's prometheus for
# the Grafana dashboard test (both need apt, as root).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh dev
if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> installing Debian's chromium for the browser tests"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
            || echo "!! chromium could not be installed"
    else
        echo "!! /usr/bin/chromium missing and apt-get not usable"
    fi
    if [ ! -x /usr/bin/chromium ]; then
        # in CI the browser test must run (it fails there without chromium): stop before the suite
        case "${CI:-}" in 1|true|TRUE|True|yes) echo "!! CI=$CI: the browser test needs /usr/bin/chromium" >&2; exit 1;; esac
        echo "!! the browser test will be skipped (under CI=true it fails)"
    fi
fi
if [ ! -x /usr/bin/prometheus ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "==> installing Debian's prometheus for the dashboard test"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
            || echo "!! prometheus could not be installed"
    else
        echo "!! /usr/bin/prometheus missing and apt-get not usable"
    fi
    if [ ! -x /usr/bin/prometheus ]; then
        # in CI the Grafana dashboard's queries must run on a real Prometheus (the test fails there without it)
        case "${CI:-}" in 1|true|TRUE|True|yes) echo "!! CI=$CI: tests/monitor/test_prometheus_server.py needs /usr/bin/prometheus" >&2; exit 1;; esac
        echo "!! the Prometheus dashboard test will be skipped (under CI=true it fails)"
    fi
fi
export RAY_USAGE_STATS_ENABLED=0
if [ $# -eq 0 ]; then  # the whole suite: lint and types first (seconds), then every test
    echo "==> ruff, import-linter and mypy"
    .venv/bin/ruff check gpu_notebook tests benchmarks scripts
    .venv/bin/ruff format --check gpu_notebook tests benchmarks scripts
    .venv/bin/lint-imports
    .venv/bin/mypy gpu_notebook
    echo "==> the checkpoint codec's C as strict C99 (-Wall -Wextra -pedantic -Werror)"
    scripts/check_c.sh .venv/bin/python
    echo "==> the pure checkpoint tests once more without the C kernels (the numpy fallback)"
    GPU_NOTEBOOK_NO_C_EXT=1 .venv/bin/python -m pytest -q -p no:cacheprovider \
        tests/checkpoint/test_checkpoint_{codec,format,golden,hostile,local,robustness,sizes}.py
fi
PYTEST=(.venv/bin/python -m pytest --durations=30)  # the slowest tests, to keep the run short
if [ $# -gt 0 ] || [ "$(nproc)" -lt 2 ] || [ "${GPU_NOTEBOOK_TEST_WORKERS:-2}" = 0 ]; then
    exec "${PYTEST[@]}" "$@"  # arguments, one core, or GPU_NOTEBOOK_TEST_WORKERS=0: one process
fi
# The whole suite in two phases. First every file but those that start a Ray, a kernel or a browser of their own,
# on two workers, each file whole on one of them (tests/conftest.py: pytest_xdist_make_scheduler); then those files
# (tests/own_ray_files.txt, the longest first) on two workers of their own, one file beside another: beside the
# first phase's tests, Ray's own 30 s wait for a new node ran out on CI's 2-core machine (CI of f23ba29). One
# process left a core idle a third of the second phase (12 min 41 s); two workers: 8 min 47 s, 8% idle.
mapfile -t OWN < <(grep -v '^#' tests/own_ray_files.txt | grep .)
IGNORE=()
for f in "${OWN[@]}"; do IGNORE+=("--ignore=$f"); done
echo "==> phase 1 of 2: the suite but its own-Ray files, on ${GPU_NOTEBOOK_TEST_WORKERS:-2} workers"
rc1=0
"${PYTEST[@]}" -n "${GPU_NOTEBOOK_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "${IGNORE[@]}" || rc1=$?
echo "==> phase 2 of 2: the ${#OWN[@]} files that start a Ray, a kernel or a browser of their own, on two workers"
rc2=0
"${PYTEST[@]}" -n "${GPU_NOTEBOOK_TEST_WORKERS:-2}" --dist loadscope --no-loadscope-reorder "${OWN[@]}" || rc2=$?
echo "==> phase 1: exit $rc1, phase 2: exit $rc2"
[ "$rc1" = 0 ] && [ "$rc2" = 0 ]
