"""Idle stop on a GPU cluster whose head node has no GPU: the head's CPU must not keep idle GPUs "busy"."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu_notebook.cost import IdleStopPolicy, MonitorUtilisation
from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_idle_gpus_stop_even_when_the_cpu_head_node_is_busy() -> None:
    clock = Clock()
    t0 = clock.t
    gpu_node = NodeSampler(
        "gpu-node", nvml=FakeNVML([FakeGPU(util=0.0)] * 2, clock=clock), clock=clock, host=False
    )
    head = NodeSampler("head-node", nvml=None, clock=clock, host=True)  # Ray's GCS/raylet and the notebook
    cpu_col = head.buffer.columns.index("host.cpu_percent")
    mon = Monitor(samplers=[gpu_node, head], clock=clock, autopull=False).start()
    stopped: list[float] = []
    pol = IdleStopPolicy(
        5,
        None,
        utilisation=MonitorUtilisation(mon),
        stop=lambda reason: stopped.append(clock.t),
        notify=lambda m: None,
    )
    try:
        while clock.t < t0 + 400 and not stopped:
            for _ in range(10):
                clock.t += 1.0
                gpu_node.tick()
                row = np.full(len(head.buffer.columns), math.nan)
                row[cpu_col] = 25.0  # the head's CPU is busy with Ray itself, not with training
                head.buffer.append(clock.t, row)
            mon.pull()
            pol.check(clock())
        assert pol.utilisation.kind == "gpu" and pol.threshold == 5.0
        assert pol.last_utilisation == pytest.approx(0.0)
        assert stopped and stopped[0] <= t0 + 5 * 60 + 10
    finally:
        mon.stop()


def test_cpu_decides_only_when_no_node_has_a_gpu() -> None:
    class FakeMonitor:
        def __init__(self, summary: dict) -> None:
            self.summary = summary

        def utilisation_summary(self, window_s: float) -> dict:
            return self.summary

    nan = math.nan
    cpu_only = MonitorUtilisation(
        FakeMonitor(
            {
                "a": {"has_gpu": False, "max_gpu_util": nan, "cpu_percent": 30.0, "samples": 3},
                "b": {"has_gpu": False, "max_gpu_util": nan, "cpu_percent": 12.0, "samples": 3},
            }
        )
    )
    assert cpu_only(60) == 30.0 and cpu_only.kind == "cpu"
    # GPUs whose utilisation NVML cannot read (MIG): unknown, not the head's CPU
    mig = MonitorUtilisation(
        FakeMonitor(
            {
                "gpu": {"has_gpu": True, "max_gpu_util": nan, "cpu_percent": 50.0, "samples": 3},
                "head": {"has_gpu": False, "max_gpu_util": nan, "cpu_percent": 40.0, "samples": 3},
            }
        )
    )
    assert mig(60) is None and mig.kind == "gpu"
