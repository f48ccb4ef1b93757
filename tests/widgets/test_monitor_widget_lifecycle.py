"""Dashboard edge cases: NVML_ERROR_NOT_SUPPORTED numbers in the header, and refresh threads that must end."""

from __future__ import annotations

import re
import time

import pytest

from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")


class Clock:
    def __init__(self, t: float = 1_764_400_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _cells(html: str) -> dict[str, str]:
    text = re.findall(r">([^<>]+)<", html)
    return dict(zip(text[0::2], text[1::2], strict=False))


def test_header_says_unknown_not_zero_when_nvml_does_not_support_a_metric() -> None:
    """Power on some GPUs and utilisation on MIG-enabled ones raise NVML_ERROR_NOT_SUPPORTED: no "0 W", no "nan%"."""
    from gpu_notebook.widgets import MonitorWidget

    clock = Clock()
    gpu = FakeGPU(util=50, unsupported=["nvmlDeviceGetPowerUsage", "nvmlDeviceGetUtilizationRates"])
    s = NodeSampler("n", nvml=FakeNVML([gpu, gpu], clock=clock), clock=clock, host=False)
    mon = Monitor(samplers=[s], clock=clock, autopull=False).start()
    s.tick()
    mon.pull()
    w = MonitorWidget(mon, autostart=False, clock=clock)
    cells = _cells(w.header.value)
    assert cells["power"] == "–" and cells["mean util"] == "–"
    assert cells["memory"] == "1.0/160 GiB"  # what NVML did report still shows
    mon.stop()


def _wait(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def test_refresh_thread_ends_when_the_monitor_stops_or_the_widget_closes() -> None:
    from gpu_notebook.widgets import MonitorWidget

    clock = Clock()
    s = NodeSampler("n", nvml=FakeNVML(1, clock=clock), clock=clock, host=False)
    mon = Monitor(samplers=[s], clock=clock, autopull=False).start()
    w = MonitorWidget(mon, interval=0.1, busy_interval=None)
    thread = w._thread
    assert thread is not None and thread.is_alive()
    mon.stop()  # e.g. the cluster stopped
    assert _wait(lambda: not thread.is_alive())

    mon2 = Monitor(
        samplers=[NodeSampler("m", nvml=FakeNVML(1, clock=clock), clock=clock, host=False)],
        clock=clock,
        autopull=False,
    ).start()
    try:
        w2 = MonitorWidget(mon2, interval=0.1, busy_interval=None)
        t2 = w2._thread
        w2.box.close()  # the user closed the output / Widget.close_all()
        assert _wait(lambda: not t2.is_alive())
        w3 = MonitorWidget(mon2, interval=0.1, busy_interval=None)
        t3 = w3._thread
        w3.close()
        assert not t3.is_alive() and w3.box.comm is None and w3.fig.comm is None and mon2.started
    finally:
        mon2.stop()


def test_cost_widget_thread_ends_when_closed() -> None:
    from gpu_notebook.cost import CostMeter
    from gpu_notebook.widgets import CostWidget

    w = CostWidget(CostMeter(clock=Clock()), interval=0.2)
    t = w._thread
    w.box.close()
    assert _wait(lambda: not t.is_alive())
    w2 = CostWidget(CostMeter(clock=Clock()), interval=0.2)
    t2 = w2._thread
    w2.close()
    assert not t2.is_alive() and w2.box.comm is None
