"""What one rank's facts say about its node's GPUs, whichever probe saw them: torch, else NVML, else ``/proc``.

Several checks need the same answers (how many GPUs, which compute capabilities, what the driver supports,
whether a CUDA kernel ran); they read them here so that a node without NVML, or with CUDA hidden from the
process, is judged the same way everywhere.
"""

from __future__ import annotations

from ._compat import cuda_from_nvml
from ._shapes import Facts, NvmlGpu

__all__ = [
    "driver_max_cuda",
    "gpu_ccs",
    "gpus_label",
    "has_gpu",
    "kernel_runs",
    "node_gpu_count",
    "nvml_gpus",
]


def nvml_gpus(facts: Facts) -> list[NvmlGpu]:
    """The GPUs NVML listed (none when NVML was unavailable)."""
    nvml = facts.get("nvml") or {}
    return list(nvml.get("gpus") or []) if nvml.get("available") else []


def node_gpu_count(facts: Facts) -> int:
    """GPUs on the node: torch's, NVML's, or (without NVML) the kernel module's count in /proc."""
    proc = (facts.get("nvml") or {}).get("gpu_count")
    return max(len(nvml_gpus(facts)), int(facts.get("device_count") or 0), int(proc or 0))


def has_gpu(facts: Facts) -> bool:
    """Whether the node has any NVIDIA GPU, visible to this process or not."""
    return node_gpu_count(facts) > 0


def gpu_ccs(facts: Facts) -> list[tuple[str, tuple[int, int]]]:
    """(name, compute capability) of every GPU on the node, from torch, else NVML."""
    out = []
    gpus: list[NvmlGpu] = list(facts.get("gpus") or []) or nvml_gpus(facts)  # type: ignore[arg-type]
    for g in gpus:
        cc = g.get("cc")
        if cc:
            out.append((g.get("name") or "GPU", (int(cc[0]), int(cc[1]))))
    return out


def driver_max_cuda(facts: Facts) -> tuple[int, int] | None:
    """The newest CUDA the kernel-mode driver supports, from NVML."""
    return cuda_from_nvml((facts.get("nvml") or {}).get("cuda_driver"))


def kernel_runs(facts: Facts) -> bool | None:
    """Did the probe's small CUDA kernel run? ``None`` when it was not tried.

    A kernel that failed only for want of a kernel image counts as run here: the driver loaded and launched
    it (``gpu-arch`` reports the missing architecture).
    """
    probe = facts.get("cuda_kernel")
    if not facts.get("cuda_available") or not isinstance(probe, dict):
        return None
    return bool(probe.get("ok")) or "no kernel image" in str(probe.get("error") or "")


def gpus_label(gpus: list[NvmlGpu]) -> str:
    """``GPU 3 (NVIDIA A100)`` or ``GPUs 0-7 (NVIDIA H100 80GB HBM3)``."""
    indices = [int(g.get("index", 0)) for g in gpus]
    names = ", ".join(dict.fromkeys(str(g.get("name")) for g in gpus))
    if len(indices) == 1:
        return f"GPU {indices[0]} ({names})"
    return f"GPUs {_ranges(indices)} ({names})"


def _ranges(values: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    for v in sorted(set(values)):
        if parts and "-" not in parts[-1].split(",")[-1] and int(parts[-1]) == v - 1:
            parts[-1] = f"{parts[-1]}-{v}"
        elif parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == v - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{v}"
        else:
            parts.append(str(v))
    return ",".join(parts)
