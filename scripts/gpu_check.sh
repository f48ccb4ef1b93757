#!/usr/bin/env bash
# The GPU check: run on a machine with NVIDIA GPUs (e.g. the device tool's machine) from the repository root.
# Exercises the real GPU paths that CI cannot: NCCL ranks on their own GPUs, NVML sampling, the doctor and
# the all-reduce benchmark over NCCL, checkpoints of GPU state (page-locked asynchronous snapshot, restore onto
# the GPU), and how checkpoint restore scales with the machine's cores. Uses the machine's own python3 (with torch);
# what its image lacks (zstandard, blake3) comes as wheels carried in .gpu_wheels (scripts/gpu_wheels.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" RAY_USAGE_STATS_ENABLED=0
status=0
if [ -d .gpu_wheels ]; then  # carried wheels (scripts/gpu_wheels.sh): the checkpoint codec's zstandard and blake3
    echo "== wheels from .gpu_wheels"
    "$PY" -m pip install -q --no-index --find-links .gpu_wheels --target /tmp/gnb-wheels zstandard blake3 xxhash \
        && export PYTHONPATH="/tmp/gnb-wheels:$PYTHONPATH" || echo "!! could not install the carried wheels"
fi
if command -v gcc >/dev/null && "$PY" -c "import numpy" 2>/dev/null; then  # the codec's C kernels, in place
    GPU_NOTEBOOK_BUILD_NATIVE=require "$PY" setup.py -q build_ext --inplace >/tmp/gnb-build.log 2>&1 \
        && echo "== C kernels built" || { echo "!! C kernels did not build (numpy path):"; tail -5 /tmp/gnb-build.log; }
fi
echo "== nvidia-smi"; nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv || status=1
echo "== python/torch"; "$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.device_count(), torch.cuda.get_arch_list())" || status=1
for step in gpu_check_distributed gpu_check_monitor gpu_check_doctor gpu_check_checkpoint gpu_check_restore; do
    if [ -f "scripts/$step.py" ]; then
        echo "== $step"
        timeout 300 "$PY" "scripts/$step.py" || { echo "!! $step failed"; status=1; }
    fi
done
echo "== gpu_check: $([ $status = 0 ] && echo OK || echo FAILED)"
exit $status
