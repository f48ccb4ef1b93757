"""The shapes of the doctor's facts: what one rank reports about itself and its node, as ``TypedDict``\\s.

Facts travel as plain dictionaries (they are pickled back from every rank's worker, saved, or written by hand
in tests), so every key is optional (``total=False``) and the checks read them with ``.get``: a probe that
failed leaves its key at a default and records why under ``probe_errors``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypedDict

__all__ = [
    "DiskUsage",
    "DistFacts",
    "Endpoint",
    "Facts",
    "FiInfo",
    "Interface",
    "KernelProbe",
    "NvmlFacts",
    "NvmlGpu",
    "PeerProbe",
    "PeerResult",
    "RankCaller",
    "Route",
    "ShmFacts",
    "TcpProbe",
    "TorchGpu",
]


class TorchGpu(TypedDict, total=False):
    """One GPU as ``torch.cuda.get_device_properties`` describes it."""

    index: int
    name: str
    cc: list[int]  # compute capability [major, minor]
    uuid: str | None
    memory_gib: float


class NvmlGpu(TypedDict, total=False):
    """One GPU as NVML describes it (``None`` where the query is not supported)."""

    index: int
    name: str | None
    uuid: str | None
    cc: list[int] | None
    pci_bus_id: str | None
    ecc_mode: int | None
    ecc_uncorrected_volatile: int | None
    ecc_uncorrected_aggregate: int | None
    remap_pending: bool | None
    remap_failure: bool | None
    throttle_mask: int | None
    persistence: int | None
    temperature_c: int | None


class NvmlFacts(TypedDict, total=False):
    """NVML's view of the node; without NVML, ``available`` is False and ``/proc`` fills driver and count."""

    available: bool
    reason: str
    driver: str | None
    cuda_driver: int | None  # nvmlSystemGetCudaDriverVersion: 12040 is CUDA 12.4
    gpu_count: int | None
    gpus: list[NvmlGpu]


class KernelProbe(TypedDict):
    """Whether a tiny CUDA kernel ran on this rank's GPU."""

    ok: bool
    error: str | None


class DistFacts(TypedDict, total=False):
    """``torch.distributed`` as this process sees it."""

    initialized: bool
    backend: str
    rank: int
    world_size: int


class Interface(TypedDict, total=False):
    """A network interface and its IPv4 address."""

    name: str
    ipv4: str | None
    up: bool | None
    speed_mbps: int | None


class Route(TypedDict):
    """The local address and interface the kernel routes ``MASTER_ADDR`` through."""

    ip: str | None
    interface: str | None


class TcpProbe(TypedDict):
    """One TCP connect attempt."""

    ok: bool
    ms: float | None
    error: str | None


class FiInfo(TypedDict, total=False):
    """libfabric's ``fi_info``: whether the EFA provider is there."""

    found: bool
    efa: bool
    output: str


class DiskUsage(TypedDict):
    """Free and total bytes of one file system."""

    free: int
    total: int


class ShmFacts(TypedDict):
    """Size of ``/dev/shm`` in bytes."""

    total: int
    free: int


class Facts(TypedDict, total=False):
    """Everything one rank reports (:func:`gpu_notebook.doctor.collect_facts`)."""

    rank: int | None
    local_rank: int | None
    world_size: int | None
    hostname: str
    pid: int
    platform: str
    node_ip: str | None
    env: dict[str, str | None]  # the NCCL / CUDA / rendezvous variables
    versions: dict[str, str | None]  # python, torch, ray, gpu_notebook, numpy
    dist: DistFacts
    torch_cuda: str | None  # the CUDA version PyTorch was built with
    cuda_available: bool
    device_count: int
    torch_arch_list: list[str]
    gpus: list[TorchGpu]
    current_device: int | None
    libcuda_cuda: int | None  # cudaDriverGetVersion of the libcuda this process loaded
    cuda_kernel: KernelProbe | None
    nccl_version: str | None
    nvml: NvmlFacts
    interfaces: list[Interface]
    route: Route | None
    infiniband: list[str]
    fi_info: FiInfo
    storage: dict[str, DiskUsage]
    shm: ShmFacts | None
    master_probe: TcpProbe | None
    listen_port: int | None
    listener: dict[str, int] | None
    probe_errors: dict[str, str]  # probe name -> "ExcType: message"


class Endpoint(TypedDict):
    """One node's test listener, for :func:`gpu_notebook.doctor._facts.probe_peers`."""

    node: str
    ip: str
    port: int


class PeerResult(TypedDict, total=False):
    """One rank's connect attempt to one node's listener."""

    node: str
    ip: str
    port: int
    ok: bool
    ms: float | None
    error: str | None


class PeerProbe(TypedDict):
    """What :func:`gpu_notebook.doctor._facts.probe_peers` returns for one rank."""

    rank: int | None
    results: list[PeerResult]


class RankCaller(Protocol):
    """What the doctor runs its probes and benchmarks through: anything that runs ``fn(*args, **kwargs)`` in
    every rank's process and returns the values in rank order, raising when a rank failed.

    :class:`gpu_notebook.Cluster` and :class:`gpu_notebook.doctor.LocalGroup` are such callers (a
    ``WorkerGroup`` is not: its ``call`` takes ``args`` as one tuple and returns a ``CellResult``).
    """

    def call(
        self, fn: Callable[..., Any], *args: Any, timeout: float | None = ..., **kwargs: Any
    ) -> list[Any]: ...
