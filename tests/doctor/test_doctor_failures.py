"""Failures a user with a broken cloud GPU job hits: a too-old driver that hides CUDA, no NVML, the wheel to
install for older GPUs, arch-specific PTX, bad magic arguments, and a stuck or dead rank in a benchmark."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
from test_doctor_checks import fake_gpu_facts

from gpu_notebook.doctor import ERROR, OK, WARNING, LocalGroup, allreduce_bench, analyze, parse_size
from gpu_notebook.doctor._compat import (
    arch_support,
    max_cuda_for_driver,
    min_driver_for_cuda,
    recommend_wheel,
)


def _by(findings: list[Any], check: str) -> list[Any]:
    return [f for f in findings if f.check == check]


def _cuda_hidden_by_old_driver(**kw: Any) -> dict[str, Any]:
    """What collect_facts() really reports when the driver is too old: torch.cuda.is_available() is False."""
    f = fake_gpu_facts(**kw)
    f.update(cuda_available=False, device_count=0, gpus=[], current_device=None, torch_arch_list=[])
    f["nccl_version"] = None
    f["dist"]["backend"] = "gloo"
    return f


def test_driver_too_old_for_the_wheel_is_named_when_cuda_is_unavailable() -> None:
    # a cu121 wheel on a 470 driver: torch.cuda.is_available() is False; the fix is the driver, not the container
    f = _cuda_hidden_by_old_driver(
        gpu="NVIDIA A100-SXM4-40GB", cc=(8, 0), driver="470.42.01", cuda_driver=11040, torch_cuda="12.1"
    )
    drv = _by(analyze([f]), "cuda-driver")
    assert [x.level for x in drv] == [ERROR]
    assert "470.42.01" in drv[0].message and "older than PyTorch's CUDA 12.1" in drv[0].message
    assert "upgrade the driver to >= 530.30.02" in drv[0].fix
    assert drv[0].fix.endswith("whl/cu113")  # the newest wheel that driver fully supports, with sm_80
    # an H100 has no wheel for CUDA <= 11.4: upgrading the driver is the only fix
    h100 = _by(analyze([_cuda_hidden_by_old_driver(driver="470.42.01", cuda_driver=11040)]), "cuda-driver")
    assert h100[0].level == ERROR and h100[0].fix == "upgrade the driver to >= 530.30.02"


def test_without_pynvml_an_old_driver_is_not_reported_as_no_gpu() -> None:
    # nvidia-ml-py is only in the monitor extra: the doctor has /proc's driver version and GPU count
    f = _cuda_hidden_by_old_driver(driver="470.42.01", torch_cuda="12.1")
    f["nvml"] = {
        "available": False,
        "reason": "pynvml (nvidia-ml-py) is not installed",
        "driver": "470.42.01",
        "gpu_count": 8,
    }
    findings = analyze([f])
    drv = _by(findings, "cuda-driver")
    assert [x.level for x in drv] == [ERROR] and "no GPU" not in drv[0].message
    assert "upgrade the driver to >= 530.30.02" in drv[0].fix
    assert "install a PyTorch build for CUDA <= 11.4" in drv[0].fix
    assert {x.level for x in _by(findings, "gpu-health")} == {WARNING}  # health not checked, said so
    assert {x.level for x in _by(findings, "gpu-assignment")} == {WARNING}


def test_proc_gpu_count(tmp_path) -> None:
    from gpu_notebook.doctor._facts import _proc_gpu_count

    for bus in ("0000:00:1e.0", "0000:00:1f.0"):
        (tmp_path / bus).mkdir()
    assert _proc_gpu_count(str(tmp_path)) == 2
    assert _proc_gpu_count(str(tmp_path / "missing")) is None


def test_wheel_for_volta_and_pascal_is_cu126_not_cu128() -> None:
    # PyTorch's cu128/cu129/cu130 wheels carry no sm_50/sm_60 (and no sm_70 any more): a V100 needs cu126
    assert recommend_wheel((7, 0), (12, 8))[0] == "cu126"
    assert recommend_wheel((7, 0), (13, 0))[0] == "cu126"
    assert recommend_wheel((6, 1), (12, 9))[0] == "cu126"
    assert recommend_wheel((7, 5), (12, 8))[0] == "cu128"  # Turing is in them
    assert recommend_wheel((12, 0), (12, 9))[0] == "cu129"
    # the doctor's fix for a V100 under a cu128 build (no sm_70 in it)
    f = fake_gpu_facts(
        gpu="Tesla V100-SXM2-16GB",
        cc=(7, 0),
        driver="570.124.06",
        cuda_driver=12080,
        torch_cuda="12.8",
        arch_list=["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"],
    )
    arch = _by(analyze([f]), "gpu-arch")
    assert [x.level for x in arch] == [ERROR]
    assert arch[0].fix == "pip install torch --index-url https://download.pytorch.org/whl/cu126"


def test_arch_and_family_specific_ptx_do_not_jit_elsewhere() -> None:
    assert arch_support((9, 0), ["compute_90a"]).how == "ptx"
    assert arch_support((10, 0), ["compute_90a"]).how == "none"
    assert arch_support((10, 3), ["compute_100f"]).how == "ptx"
    assert arch_support((12, 0), ["compute_100f"]).how == "none"
    assert arch_support((12, 0), ["compute_90"]).how == "ptx"  # plain PTX still JITs forward


def test_cuda_11_0_ga_driver() -> None:
    # CUDA 11.0.2 GA needs >= 450.51.05; 450.36.06 was the 11.0.1 release candidate
    assert min_driver_for_cuda("11.0") == (450, 51, 5)
    assert max_cuda_for_driver("450.36.06") == (10, 2)
    assert max_cuda_for_driver("450.51.05") == (11, 0)


def test_parse_size_rejects_infinity() -> None:
    for text in ("inf", "-inf", "1e400", "nan"):
        with pytest.raises(ValueError, match="not a size"):
            parse_size(text)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("bench allreduce --max-bytes inf", "--max-bytes: not a size"),
        ("bench allreduce --iters 0", "--iters: expected a whole number of iterations, at least 1"),
        ("bench scaling --steps -1", "--steps: expected a whole number of steps, at least 1"),
        ("bench scaling --iters 5", "--iters does not apply to bench scaling"),
        ("bench allreduce --steps 5", "--steps does not apply to bench allreduce"),
    ],
)
def test_bad_bench_arguments_print_usage(ip, capsys, line: str, why: str) -> None:
    res = ip.run_cell(f"%gpu_cluster {line}")
    assert res.error_in_exec is not None  # the cell fails
    err = capsys.readouterr().err
    assert "UsageError: " + why in err and "Try %gpu_cluster? for help." in err and "Traceback" not in err


# ---- a stuck or dead rank (a real 2-rank gloo group of its own: these tests leave it broken) -------------------


@pytest.fixture(scope="module")
def scratch_group():
    with LocalGroup(2, "gloo") as g:
        yield g


def _bench_with_stuck_rank1() -> Any:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(4)  # the scenario, not a wait: stuck elsewhere, never joins the benchmark
        return None
    t0 = time.monotonic()
    try:
        allreduce_bench(min_bytes=8, max_bytes=64, iters=1, warmup=0, collective_timeout=1.0)
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__, str(exc), time.monotonic() - t0
    return "finished", "", time.monotonic() - t0


def _exit_on_rank1() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        os._exit(3)
    return 0


def test_stuck_rank_makes_the_benchmark_time_out(scratch_group: LocalGroup) -> None:
    kind, message, elapsed = scratch_group.call(_bench_with_stuck_rank1, timeout=60)[0]
    assert kind == "TimeoutError", message
    assert elapsed < 3.5 and "did not complete within 1 s" in message and "rank 0" in message


def test_dead_rank_fails_the_call_at_once(scratch_group: LocalGroup) -> None:
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 died \(exit code 3\)"):
        scratch_group.call(_exit_on_rank1, timeout=60)
    assert time.monotonic() - t0 < 15


def test_healthy_findings_unchanged() -> None:
    assert {x.level for x in _by(analyze([fake_gpu_facts()]), "cuda-driver")} == {OK}
