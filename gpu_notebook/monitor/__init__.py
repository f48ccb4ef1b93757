"""Live GPU monitoring: per-node NVML samplers, one aggregator, Prometheus/CSV exports, under-use advice.

``Monitor(cluster)`` runs one tiny sampler actor per Ray node; ``Monitor.local()`` watches just this machine.
``FakeNVML`` is a scripted stand-in for ``pynvml`` (nvidia-ml-py) for machines without NVIDIA GPUs.
Importing this package is cheap: the submodules (numpy, and Ray only when a cluster is monitored) load on
first use of a name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "Advice",
    "Aggregator",
    "FakeGPU",
    "FakeNVML",
    "GPU_METRICS",
    "HOST_METRICS",
    "Monitor",
    "NodeSampler",
    "PrometheusServer",
    "REMEDIES",
    "RingBuffer",
    "monitor_for",
    "nvidia_smi_csv",
    "prometheus_text",
    "running_monitor",
    "sampler_actor_class",
    "steps",
    "utilisation_summary",
]

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._advice import REMEDIES, Advice
    from gpu_notebook.monitor._aggregator import Aggregator
    from gpu_notebook.monitor._export import PrometheusServer, nvidia_smi_csv, prometheus_text
    from gpu_notebook.monitor._fake_nvml import FakeGPU, FakeNVML, steps
    from gpu_notebook.monitor._monitor import Monitor, monitor_for, running_monitor, utilisation_summary
    from gpu_notebook.monitor._ring import RingBuffer
    from gpu_notebook.monitor._sampler import GPU_METRICS, HOST_METRICS, NodeSampler, sampler_actor_class

_LAZY = {
    "Advice": "_advice",
    "REMEDIES": "_advice",
    "Aggregator": "_aggregator",
    "PrometheusServer": "_export",
    "nvidia_smi_csv": "_export",
    "prometheus_text": "_export",
    "FakeGPU": "_fake_nvml",
    "FakeNVML": "_fake_nvml",
    "steps": "_fake_nvml",
    "Monitor": "_monitor",
    "monitor_for": "_monitor",
    "running_monitor": "_monitor",
    "utilisation_summary": "_monitor",
    "RingBuffer": "_ring",
    "GPU_METRICS": "_sampler",
    "HOST_METRICS": "_sampler",
    "NodeSampler": "_sampler",
    "sampler_actor_class": "_sampler",
}


def __getattr__(name: str) -> Any:
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'gpu_notebook.monitor' has no attribute {name!r}")
    return getattr(importlib.import_module(f"gpu_notebook.monitor.{mod}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)
