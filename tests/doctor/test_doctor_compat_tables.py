"""Driver and wheel facts the doctor must get right: CUDA forward compatibility (cuda-compat) is not a too-old
driver, no PyTorch wheel runs a Kepler sm_35 GPU, and a wheel's lower-minor cubin runs on a newer GPU."""

from __future__ import annotations

from typing import Any

from test_doctor_checks import fake_gpu_facts

from gpu_notebook.doctor import ERROR, OK, WARNING, analyze
from gpu_notebook.doctor._compat import recommend_wheel


def _driver(facts: dict[str, Any]) -> list[Any]:
    return [f for f in analyze([facts]) if f.check == "cuda-driver"]


def _forward_compat_node(**kw: Any) -> dict[str, Any]:
    """An H100 on a 470 kernel-mode driver (CUDA 11.4) running a cu121 build through cuda-compat-12-2."""
    f = fake_gpu_facts(driver="470.42.01", cuda_driver=11040, torch_cuda="12.1", **kw)
    f.update(libcuda_cuda=12020, cuda_kernel={"ok": True, "error": None})
    return f


def test_forward_compatibility_is_not_a_too_old_driver() -> None:
    drv = _driver(_forward_compat_node())
    assert [x.level for x in drv] == [OK]
    assert "forward compatibility" in drv[0].message and "data-center GPUs only" in drv[0].message
    assert "470.42.01" in drv[0].message and "CUDA 12.2" in drv[0].message  # cudaDriverGetVersion's answer
    # the kernel failed for want of sm_XY: the driver ran it (gpu-arch reports the architecture)
    f = _forward_compat_node()
    f["cuda_kernel"] = {"ok": False, "error": "RuntimeError: CUDA error: no kernel image is available ..."}
    assert [x.level for x in _driver(f)] == [OK]


def test_forward_compatibility_needs_a_kernel_that_runs() -> None:
    f = _forward_compat_node()
    f["cuda_kernel"] = {
        "ok": False,
        "error": "RuntimeError: CUDA error: system has unsupported display driver / cuda driver combination",
    }
    drv = _driver(f)
    assert [x.level for x in drv] == [ERROR] and "unsupported display driver" in drv[0].message
    assert "upgrade the driver to >= 530.30.02" in drv[0].fix


def test_newer_libcuda_within_a_major_is_not_minor_version_compatibility() -> None:
    # 535 driver (CUDA 12.2) with cuda-compat-12-4: the cu124 build runs with a full 12.4 libcuda, PTX JIT included
    f = fake_gpu_facts(driver="535.54.03", cuda_driver=12020, torch_cuda="12.4")
    f["libcuda_cuda"] = 12040
    drv = _driver(f)
    assert [x.level for x in drv] == [OK] and "forward compatibility" in drv[0].message
    f["libcuda_cuda"] = 12020  # the driver's own libcuda: minor version compatibility, as before
    assert [x.level for x in _driver(f)] == [WARNING]


def test_no_wheel_for_kepler_sm_35() -> None:
    # PyTorch's pip wheels carry sm_37 (K80) at the lowest since 1.3.1: cu102 does not run a K40 (3.5)
    for driver_max in (None, (10, 2), (11, 8), (12, 4)):
        tag, how = recommend_wheel((3, 5), driver_max)
        assert tag is None, (driver_max, tag)
        assert how.startswith("no current PyTorch wheel supports compute capability 3.5")
        assert "build PyTorch from source with CUDA <= 11.8 and TORCH_CUDA_ARCH_LIST=3.5" in how
    assert recommend_wheel((3, 7))[0] == "cu102"  # the K80 still has wheels, up to cu118
    assert recommend_wheel((3, 7), (12, 4))[0] == "cu118"
    # the doctor's fix for a K40 under a cu102 build
    f = fake_gpu_facts(
        gpu="Tesla K40m", cc=(3, 5), driver="470.42.01", cuda_driver=11040, torch_cuda="10.2",
        arch_list=["sm_37", "sm_50", "sm_60", "sm_70"],
    )  # fmt: skip
    arch = [x for x in analyze([f]) if x.check == "gpu-arch"]
    assert [x.level for x in arch] == [ERROR] and "no current PyTorch wheel" in arch[0].fix
    assert "download.pytorch.org" not in arch[0].fix


def test_lower_minor_cubin_in_a_wheel_runs_newer_gpus() -> None:
    # cu117 wheels have sm_86, which runs an RTX 4090 (8.9) on a 515 driver; sm_120 in cu128 runs a GB10 (12.1)
    assert recommend_wheel((8, 9), (11, 7))[0] == "cu117"
    assert recommend_wheel((12, 1), (12, 8))[0] == "cu128"
    assert recommend_wheel((10, 3), (12, 8))[0] == "cu128"
    assert recommend_wheel((9, 0), (11, 7))[0] is None  # nothing below sm_90 in Hopper's major


def test_a_kernel_that_fails_on_a_good_driver_is_an_error() -> None:
    f = fake_gpu_facts()
    f["cuda_kernel"] = {"ok": False, "error": "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy"}
    drv = _driver(f)
    assert [x.level for x in drv] == [ERROR] and "is/are busy" in drv[0].message
    assert "exclusive-process" in drv[0].fix


def test_the_kernel_probe_leaves_no_cuda_context_in_the_notebook():
    """diagnose_local() runs in the notebook's kernel: its kernel probe runs in a short-lived process unless CUDA
    is already initialised here (a context costs hundreds of MiB of GPU memory, and on a GPU in exclusive-process
    mode no worker could use it). A rank's worker probes in place."""
    import types

    from gpu_notebook.doctor._facts import _kernel_probe_subprocess, _probe_here

    def fake_torch(initialised: bool):
        return types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: initialised))

    assert _probe_here("auto", fake_torch(False)) is False
    assert _probe_here("auto", fake_torch(True)) is True
    assert (
        _probe_here("here", fake_torch(False)) is True
        and _probe_here("subprocess", fake_torch(True)) is False
    )
    # the subprocess really runs the probe: on this CPU-only torch the kernel cannot run, and it says why
    errors: dict[str, str] = {}
    result = _kernel_probe_subprocess(0, errors)
    assert result is not None and result["ok"] is False and "CUDA" in result["error"], (result, errors)
    assert errors == {}
    # a probe process that cannot answer is "unknown" (None), never a failed kernel
    errors = {}
    assert _kernel_probe_subprocess(0, errors, timeout=0.001) is None
    assert "Timeout" in errors["cuda_kernel"]
