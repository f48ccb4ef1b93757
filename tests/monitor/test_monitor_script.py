"""scripts/gpu_check_monitor.py (the GPU-machine check) runs end to end against the fake NVML here."""

from __future__ import annotations

import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gpu_check_monitor.py"


def test_gpu_check_script_with_fake_nvml() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--fake", "2", "--seconds", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("nvml=fake") and out.stdout.rstrip().endswith("OK")
    assert out.stdout.count("gpu_notebook_gpu_utilization_percent{") == 2
    assert "timestamp, name, utilization.gpu [%], memory.used [MiB]" in out.stdout


def test_gpu_check_script_fails_without_nvml() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "0.5"], capture_output=True, text=True, timeout=120
    )
    import importlib.util

    if importlib.util.find_spec("pynvml") is not None:
        try:
            import pynvml

            pynvml.nvmlInit()
            return  # a real GPU machine: covered by scripts/gpu_check.sh
        except pynvml.NVMLError:  # no driver: the script must fail
            pass
    assert out.returncode == 1 and "FAIL: no GPU visible through NVML" in out.stdout
