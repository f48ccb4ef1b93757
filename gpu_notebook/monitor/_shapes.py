"""The shapes of what a monitor hands out: newest readings, time series, the utilisation summary.

They are plain dictionaries at runtime (a widget, an export or a test reads them with ``[...]``), named here as
``TypedDict``\\s so every reader sees the same keys. The metric names are ``Literal`` types: a reading has one
key per name in :data:`~gpu_notebook.monitor._sampler.GPU_METRICS` (or ``HOST_METRICS``), and a reader that
picks a metric by variable names it with these types so the key is checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NotRequired, Protocol, TypedDict

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

__all__ = [
    "GpuInfo",
    "GpuMetric",
    "GpuProcess",
    "GpuReading",
    "GpuSeries",
    "HostMetric",
    "HostReading",
    "HostSeries",
    "Latest",
    "MonitoredCluster",
    "NodeUtilisation",
    "Rows",
    "SamplerInfo",
    "SamplerReply",
    "UtilisationSummary",
]

#: A per-GPU metric, as sampled (the order of ``GPU_METRICS``; ``tests/monitor`` checks they match).
GpuMetric = Literal[
    "util_gpu",
    "util_mem",
    "mem_used_mib",
    "mem_total_mib",
    "power_w",
    "power_limit_w",
    "temp_c",
    "sm_clock_mhz",
    "throttle",
    "energy_j",
    "sm_active",
]
#: A per-node host metric, as sampled (the order of ``HOST_METRICS``).
HostMetric = Literal["cpu_percent", "mem_used_mib", "mem_total_mib", "net_rx_Bps", "net_tx_Bps", "load1"]


class GpuInfo(TypedDict):
    """What a sampler knows of one of its GPUs once (NaN where NVML did not say)."""

    index: int
    name: str
    uuid: str
    mem_total_mib: float
    power_limit_w: float


class SamplerInfo(TypedDict):
    """A sampler's description of itself and its node (:meth:`NodeSampler.info`): what the aggregator keeps."""

    node: str
    hostname: str
    epoch: str  # new each time the sampler starts: a reader then reads again from the first row
    has_gpu: bool
    gpus: list[GpuInfo]
    driver: str
    nvml: str  # "nvml", "fake" or "none"
    columns: list[str]  # of the rows: ``gpu<i>.<metric>`` and ``host.<metric>``
    gpu_metrics: list[GpuMetric]
    host_metrics: list[HostMetric]
    interval: float
    slow_interval: float
    capacity: int  # rows kept
    labels: dict[str, str]


class Rows(TypedDict):
    """Rows of a ring buffer since a sequence number (:meth:`RingBuffer.read_since`)."""

    seq: int  # pass it next time
    t: np.ndarray  # (n,) epoch seconds
    data: np.ndarray  # (n, columns)
    dropped: int  # rows overwritten before this read


class SamplerReply(Rows):
    """What a sampler sends the aggregator on a pull (:meth:`NodeSampler.read_since`)."""

    node: str
    epoch: str
    slow_seq: int
    info: NotRequired[SamplerInfo]  # with the rows from 0 (a first read, or after a restart)
    slow: NotRequired[dict[str, Any]]  # the slow tier, when it changed since ``slow_seq``


class GpuReading(TypedDict):
    """The newest reading of one GPU (:meth:`Monitor.latest`); a metric is NaN where NVML did not report it."""

    node: str
    index: int
    name: str
    uuid: str
    t: float  # epoch seconds of the sample
    up: bool  # the node's sampler answered the last pull
    util_gpu: float
    util_mem: float
    mem_used_mib: float
    mem_total_mib: float
    power_w: float
    power_limit_w: float
    temp_c: float
    sm_clock_mhz: float
    throttle: float
    energy_j: float
    sm_active: float


class HostReading(TypedDict):
    """The newest host reading of one node."""

    node: str
    t: float
    up: bool
    has_gpu: bool
    cpu_percent: float
    mem_used_mib: float
    mem_total_mib: float
    net_rx_Bps: float
    net_tx_Bps: float
    load1: float


class Latest(TypedDict):
    """What :meth:`Monitor.latest` returns: every GPU's and every host's newest reading."""

    gpus: list[GpuReading]
    hosts: list[HostReading]


class GpuSeries(TypedDict):
    """One GPU's series of one metric (:meth:`Monitor.gpu_series`): ``t`` epoch seconds, ``y`` values."""

    node: str
    index: int
    name: str
    uuid: str
    t: np.ndarray
    y: np.ndarray


class HostSeries(TypedDict):
    """One node's series of one host metric (:meth:`Monitor.host_series`)."""

    node: str
    t: np.ndarray
    y: np.ndarray


class NodeUtilisation(TypedDict):
    """One node's utilisation over a window (:func:`utilisation_summary`); NaN where there is no data."""

    has_gpu: bool
    gpus: dict[int, float]  # GPU index -> mean utilisation %
    mean_gpu_util: float
    max_gpu_util: float
    cpu_percent: float
    samples: int
    span_s: float  # how much of the window the samples cover
    up: bool


#: node id -> its utilisation over the window
UtilisationSummary = dict[str, NodeUtilisation]


class GpuProcess(TypedDict):
    """A process on a GPU (:meth:`Monitor.gpu_processes`), with its rank when it is one of the cluster's workers."""

    node: str
    gpu: int
    pid: int
    used_mib: float
    rank: int | None


class MonitoredCluster(Protocol):
    """What a :class:`Monitor` needs of a cluster: its Ray nodes (``ray.nodes()`` entries, one sampler each).

    A :class:`gpu_notebook.Cluster` is one. The monitor also uses, where the cluster has them, ``add_stop_hook(fn)``
    (it stops with the cluster), ``status()`` (which GPU process is which rank), ``running`` and ``name``.
    """

    def ray_nodes(self) -> list[dict[str, Any]]: ...
