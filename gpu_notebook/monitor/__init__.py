"""Live GPU monitoring: per-node NVML samplers, one aggregator, Prometheus/CSV exports, under-use advice.

``Monitor(cluster)`` runs one tiny sampler actor per Ray node; ``Monitor.local()`` watches just this machine.
``nvml=`` also takes a scripted fake of ``pynvml``: :class:`gpu_notebook.testing.nvml.FakeNVML`.
Importing this package is cheap: the submodules (numpy, and Ray only when a cluster is monitored) load on
first use of a name. The shared monitor of each cluster (what :func:`monitor_for` hands out) lives in
:mod:`gpu_notebook._registry`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_notebook._lazy import lazy_module

__all__ = [
    "Advice",
    "Aggregator",
    "GPU_METRICS",
    "GpuInfo",
    "GpuMetric",
    "GpuProcess",
    "GpuReading",
    "GpuSeries",
    "HOST_METRICS",
    "HostMetric",
    "HostReading",
    "HostSeries",
    "Latest",
    "Monitor",
    "MonitoredCluster",
    "NodeSampler",
    "NodeUtilisation",
    "PrometheusServer",
    "REMEDIES",
    "RingBuffer",
    "Rows",
    "SamplerInfo",
    "SamplerReply",
    "busiest_utilisation",
    "grafana_dashboard",
    "monitor_for",
    "nvidia_smi_csv",
    "prometheus_text",
    "running_monitor",
    "sampler_actor_class",
    "stop_monitors",
    "utilisation_summary",
    "UtilisationSummary",
]

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._advice import REMEDIES, Advice
    from gpu_notebook.monitor._aggregator import Aggregator
    from gpu_notebook.monitor._export import (
        PrometheusServer,
        grafana_dashboard,
        nvidia_smi_csv,
        prometheus_text,
    )
    from gpu_notebook.monitor._monitor import (
        Monitor,
        busiest_utilisation,
        monitor_for,
        running_monitor,
        stop_monitors,
        utilisation_summary,
    )
    from gpu_notebook.monitor._ring import RingBuffer
    from gpu_notebook.monitor._sampler import GPU_METRICS, HOST_METRICS, NodeSampler, sampler_actor_class
    from gpu_notebook.monitor._shapes import (
        GpuInfo,
        GpuMetric,
        GpuProcess,
        GpuReading,
        GpuSeries,
        HostMetric,
        HostReading,
        HostSeries,
        Latest,
        MonitoredCluster,
        NodeUtilisation,
        Rows,
        SamplerInfo,
        SamplerReply,
        UtilisationSummary,
    )

__getattr__, __dir__ = lazy_module(
    __name__,
    __all__,
    {
        "Advice": "._advice",
        "REMEDIES": "._advice",
        "Aggregator": "._aggregator",
        "PrometheusServer": "._export",
        "grafana_dashboard": "._export",
        "nvidia_smi_csv": "._export",
        "prometheus_text": "._export",
        "Monitor": "._monitor",
        "busiest_utilisation": "._monitor",
        "monitor_for": "._monitor",
        "running_monitor": "._monitor",
        "stop_monitors": "._monitor",
        "utilisation_summary": "._monitor",
        "RingBuffer": "._ring",
        "GPU_METRICS": "._sampler",
        "HOST_METRICS": "._sampler",
        "NodeSampler": "._sampler",
        "sampler_actor_class": "._sampler",
        "GpuInfo": "._shapes",
        "GpuMetric": "._shapes",
        "GpuProcess": "._shapes",
        "GpuReading": "._shapes",
        "GpuSeries": "._shapes",
        "HostMetric": "._shapes",
        "HostReading": "._shapes",
        "HostSeries": "._shapes",
        "Latest": "._shapes",
        "MonitoredCluster": "._shapes",
        "NodeUtilisation": "._shapes",
        "Rows": "._shapes",
        "SamplerInfo": "._shapes",
        "SamplerReply": "._shapes",
        "UtilisationSummary": "._shapes",
    },
)
