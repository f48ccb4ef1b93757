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
export GPU_NOTEBOOK_BUILD_NATIVE="${GPU_NOTEBOOK_BUILD_NATIVE:-require}"
# uv resolves and installs the same pins in about a tenth of pip's time (18 s against 2.5 min here); it does not
# read pip's configuration, so pip's find-links (where the CPU build of torch lies) are passed on. pip is the
# fallback when uv cannot be installed.
FIND_LINKS="${PIP_FIND_LINKS:-$(.venv/bin/python -m pip config get global.find-links 2>/dev/null || true)}"
UV_ARGS=()
for d in $FIND_LINKS; do UV_ARGS+=(--find-links "$d"); done
# --compile-bytecode: uv writes no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (as on the development
# machine) Python never writes them either: every process (kernel, Ray daemon, rank, test worker) then compiled
# torch, Ray and transformers from source on each import. Importing torch and Ray took 5.0 s there instead of 3.7,
# a local Ray start 8-9 s instead of 5.5-6.5. uv compiles the whole site-packages: about 40 s on 2 cores the first
# time, seconds for an up-to-date .venv.
if [ "${GPU_NOTEBOOK_NO_UV:-}" != 1 ] && { [ -x .venv/bin/uv ] || .venv/bin/python -m pip install -q uv; }; then
    .venv/bin/uv pip install -q --compile-bytecode --python .venv/bin/python "${UV_ARGS[@]}" -c constraints-dev.txt \
        -e ".[$EXTRAS]"
else
    .venv/bin/python -m pip install -q -c constraints-dev.txt -e ".[$EXTRAS]"
fi
# our own modules too (an editable install: their .pyc go to gpu_notebook/**/__pycache__, ignored by git)
.venv/bin/python -m compileall -q gpu_notebook >/dev/null
# A kernel spec inside the venv, so notebooks executed by nbclient use this interpreter.
.venv/bin/python -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (gpu_notebook)" >/dev/null

# The JupyterLab panel: the server extension is enabled by the config file a wheel installs into etc/jupyter (an
# editable install places no data files, so it is copied here); the front end is built from labextension/ by node
# (JupyterLab's builder, from the npm registry, pinned by labextension/yarn.lock) and linked into .venv as a wheel
# would install it. Skipped when the build is newer than its sources; without node the package works without it.
mkdir -p .venv/etc/jupyter/jupyter_server_config.d
cp jupyter-config/jupyter_server_config.d/gpu_notebook.json .venv/etc/jupyter/jupyter_server_config.d/
BUILT=gpu_notebook/labextension/package.json
LABSRC=(labextension/src labextension/style labextension/package.json labextension/yarn.lock labextension/tsconfig.json)
if ! command -v node >/dev/null 2>&1; then
    echo "==> node not found: the JupyterLab panel is not built (everything else works; install node >= 18 and rerun)"
elif ! node -e 'process.exit(+process.versions.node.split(".")[0] >= 18 ? 0 : 1)'; then
    echo "==> node $(node --version) is older than 18: the JupyterLab panel is not built (everything else works)"
elif [ -f "$BUILT" ] && [ -z "$(find "${LABSRC[@]}" -newer "$BUILT" -print -quit)" ]; then
    echo "==> the JupyterLab panel is built and up to date"
else
    echo "==> building the JupyterLab panel (labextension/ -> gpu_notebook/labextension/)"
    LOG="$(mktemp)"
    if ! (cd labextension && export PATH="$PWD/../.venv/bin:$PATH" && jlpm install --immutable && jlpm build) \
        >"$LOG" 2>&1; then
        tail -40 "$LOG"
        echo "!! the JupyterLab panel did not build (the log's end is above)" >&2
        exit 1
    fi
    rm -f "$LOG"
    touch "$BUILT"
fi
if [ -f "$BUILT" ]; then
    .venv/bin/jupyter-builder develop --overwrite . >/dev/null 2>&1 \
        || .venv/bin/jupyter labextension develop --overwrite . >/dev/null
fi
