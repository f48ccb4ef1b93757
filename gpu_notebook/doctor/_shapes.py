"""The shapes of the doctor's facts: what one rank reports about itself and its node, as ``TypedDict``\\s.

Facts travel as plain dictionaries (they are pickled back from every rank's worker, saved, or written by hand
in tests), so every key is optional (``total=False``) and the checks read them with ``.get``: a probe that
failed leaves its key at a default and records why under ``probe_errors``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NotRequired, Protocol, TypedDict

__all__ = [
    "BenchRow",
    "DiskUsage",
    "DistFacts",
    "Endpoint",
    "Facts",
    "FiInfo",
    "Interface",
    "KernelProbe",
    "LinkRow",
    "NvmlFacts",
    "NvmlGpu",
    "PeerProbe",
    "PairTiming",
    "PeerResult",
    "RankBench",
    "RankCaller",
    "Route",
    "ScalingRow",
    "ShmFacts",
    "SizeTiming",
    "TcpProbe",
    "TorchGpu",
    "Where",
    "WorkersTiming",
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


class Where(TypedDict):
    """Where a benchmark rank ran: its host, node address (None outside Ray) and process."""

    hostname: str
    node_ip: str | None
    pid: int


class SizeTiming(TypedDict):
    """One rank's all-reduce of one message size."""

    bytes: int
    count: int  # elements
    time_us: float  # per all-reduce
    wrong: int  # result elements that were not the expected sum


class RankBench(Where):
    """What :func:`~gpu_notebook.doctor._bench.allreduce_bench` returns on one rank."""

    rank: int
    world_size: int
    backend: str
    dtype: str
    rows: list[SizeTiming]


class PairTiming(TypedDict):
    """One rank's 2-rank all-reduce with the other rank of ``pair``."""

    pair: list[int]
    bytes: int
    time_us: float


class BenchRow(TypedDict):
    """One message size of a :class:`~gpu_notebook.doctor.BenchResult`, over every rank (as nccl-tests prints)."""

    bytes: int
    count: int
    type: str  # nccl-tests' name of the dtype
    redop: str
    time_us: float  # mean over the ranks
    algbw: float  # GB/s
    busbw: float  # GB/s
    wrong: int  # summed over the ranks
    time_us_per_rank: list[float]


class LinkRow(TypedDict):
    """One timed pair of nodes (or ranks) of a :class:`~gpu_notebook.doctor.BenchResult`."""

    ranks: list[int]
    names: list[str]
    bytes: int
    time_us: float
    algbw: float
    busbw: float


class WorkersTiming(TypedDict):
    """One rank's training on one worker count (:func:`~gpu_notebook.doctor._scaling.scaling_train`)."""

    workers: int
    elapsed: float  # seconds for the timed steps
    samples: int  # this rank's samples in them
    steps: NotRequired[int]  # absent in timings made before it was recorded: read as 1


class ScalingRow(TypedDict):
    """One worker count of a :class:`~gpu_notebook.doctor.ScalingResult`."""

    workers: int
    throughput: float  # samples/s of all members
    speedup: float  # against one worker
    efficiency: float  # speedup / workers
    step_ms: float
