"""The cluster doctor and communication benchmarks (``%gpu_cluster doctor`` / ``%gpu_cluster bench``).

``diagnose(cluster)`` checks every rank of a cluster: NVIDIA driver vs the CUDA build of PyTorch, the GPU's
architecture vs the architectures compiled into PyTorch, GPU assignment, ECC, throttling, persistence mode,
NCCL settings and network interfaces, reachability between nodes, InfiniBand/EFA, identical package
versions, disk and ``/dev/shm``. ``bench_allreduce(cluster)`` measures all-reduce like nccl-tests'
``all_reduce_perf``; ``bench_scaling(cluster)`` trains one small model on 1..N workers.

Importing this package is cheap: torch, NVML and plotly load inside the functions that need them.
"""

from __future__ import annotations

from gpu_notebook.doctor._bench import (
    BenchResult,
    algbw_gbps,
    allreduce_bench,
    bench_allreduce,
    busbw_gbps,
    message_sizes,
    parse_size,
)
from gpu_notebook.doctor._checks import analyze, compare_versions, nccl_select_interfaces
from gpu_notebook.doctor._compat import (
    NO_KERNEL_IMAGE,
    arch_support,
    driver_runs_cuda,
    max_cuda_for_driver,
    min_driver_for_cuda,
    recommend_wheel,
)
from gpu_notebook.doctor._diagnose import diagnose, diagnose_facts, diagnose_local
from gpu_notebook.doctor._facts import collect_facts
from gpu_notebook.doctor._local import LocalGroup
from gpu_notebook.doctor._report import ERROR, OK, WARNING, DoctorReport, Finding
from gpu_notebook.doctor._scaling import ScalingResult, bench_scaling

__all__ = [
    "diagnose",
    "diagnose_local",
    "diagnose_facts",
    "collect_facts",
    "analyze",
    "compare_versions",
    "DoctorReport",
    "Finding",
    "OK",
    "WARNING",
    "ERROR",
    "NO_KERNEL_IMAGE",
    "driver_runs_cuda",
    "max_cuda_for_driver",
    "min_driver_for_cuda",
    "arch_support",
    "recommend_wheel",
    "nccl_select_interfaces",
    "allreduce_bench",
    "bench_allreduce",
    "BenchResult",
    "algbw_gbps",
    "busbw_gbps",
    "message_sizes",
    "parse_size",
    "bench_scaling",
    "ScalingResult",
    "LocalGroup",
]
