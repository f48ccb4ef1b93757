"""The named shapes of what a monitor hands out (``gpu_notebook.monitor.Latest``, ...) match what it builds."""

from __future__ import annotations

from typing import get_args

from gpu_notebook.monitor import (
    GPU_METRICS,
    HOST_METRICS,
    GpuInfo,
    GpuMetric,
    GpuReading,
    GpuSeries,
    HostMetric,
    HostReading,
    Latest,
    Monitor,
    NodeUtilisation,
    SamplerInfo,
)
from gpu_notebook.testing.nvml import FakeNVML


def test_the_metric_literals_list_the_sampled_metrics_in_order() -> None:
    assert get_args(GpuMetric) == GPU_METRICS
    assert get_args(HostMetric) == HOST_METRICS


def test_a_reading_a_series_and_a_summary_have_the_named_keys() -> None:
    t = [1_700_000_000.0]
    mon = Monitor.local(nvml=lambda: FakeNVML(2), clock=lambda: t[0], autopull=False).start()
    try:
        for _ in range(4):
            t[0] += 0.5
            mon._own_local[0].tick(t[0])
        mon.pull()
        (state,) = [s for _, s in mon.aggregator.states()]
        assert set(state.info) == set(SamplerInfo.__annotations__)
        for gpu in state.gpus:
            assert set(gpu) == set(GpuInfo.__annotations__)
        latest = mon.latest()
        assert set(latest) == set(Latest.__annotations__)
        assert len(latest["gpus"]) == 2
        for row in latest["gpus"]:
            assert set(row) == set(GpuReading.__annotations__)
        for host in latest["hosts"]:
            assert set(host) == set(HostReading.__annotations__)
        for s in mon.gpu_series("util_gpu", window_s=60):
            assert set(s) == set(GpuSeries.__annotations__)
        for node in mon.utilisation_summary(60).values():
            assert set(node) == set(NodeUtilisation.__annotations__)
    finally:
        mon.stop()
