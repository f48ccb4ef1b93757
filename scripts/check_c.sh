#!/usr/bin/env bash
# Build the checkpoint codec's C kernels as strict, portable C99: -std=c99 -Wall -Wextra -pedantic -Werror, with
# this Python's headers, once as the install builds it (per-CPU versions where GCC makes them) and once as the
# portable single version. Exits non-zero when a warning or an error comes up, or when there is no compiler.
# Usage: scripts/check_c.sh [python]   (default: .venv/bin/python, else python3; the compiler: $CC, else cc)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-}"
if [ -z "$PY" ]; then
    if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
CC="${CC:-cc}"
if ! command -v "$CC" >/dev/null 2>&1; then
    echo "check_c.sh: no C compiler ($CC) found" >&2
    exit 1
fi
INC="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
SRC=gpu_notebook/checkpoint/format/_planes.c
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
status=0
for variant in "" "-DGPU_NOTEBOOK_KERNEL_PORTABLE"; do
    echo "==> $CC -std=c99 -Wall -Wextra -pedantic -Werror ${variant:-(as installed)} $SRC"
    # shellcheck disable=SC2086  # an empty variant adds no argument
    if ! "$CC" -std=c99 -Wall -Wextra -pedantic -Werror -O2 -fPIC $variant -I"$INC" -c "$SRC" -o "$OUT/planes.o"; then
        status=1
    fi
done
if [ "$status" -ne 0 ]; then
    echo "check_c.sh: $SRC does not build as strict C99" >&2
fi
exit "$status"
