"""A shown live view whose cluster or monitor stops leaves its static snapshot in its output, as ``stop()`` does.

Otherwise the output keeps only the widget, and a saved notebook opened again (or exported without widget
state) shows "Loading widget..." / an empty box there.
"""

from __future__ import annotations

import time

import pytest
from IPython.utils.capture import capture_output

from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeNVML

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")


def _wait(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.05)
    return cond()


def _left(cap, display_id: str) -> list[dict]:
    """The updates of display ``display_id`` (what its output holds afterwards)."""
    return [o.data for o in cap.outputs if o.update and o.transient.get("display_id") == display_id]


def test_a_shown_dashboard_turns_into_its_snapshot_when_its_monitor_stops(ip) -> None:
    from gpu_notebook.widgets import MonitorWidget

    s = NodeSampler("n", nvml=FakeNVML(2), host=False)
    mon = Monitor(samplers=[s], autopull=False).start()
    s.tick()
    mon.pull()
    try:
        with capture_output() as cap:
            w = MonitorWidget(mon, interval=0.1, busy_interval=None)
            w.show()
            thread = w._thread
            assert thread is not None and not _left(cap, w._handle.display_id)
            mon.stop()  # what %gpu_cluster stop does to the cluster's monitor
            assert _wait(lambda: not thread.is_alive())
        (data,) = _left(cap, w._handle.display_id)
        assert "gpu-notebook-monitor-snapshot" in data["text/html"]
        assert "application/vnd.jupyter.widget-view+json" not in data
        assert data["text/plain"].startswith("GPU monitor snapshot")
    finally:
        mon.stop()


@pytest.mark.timeout(90)
def test_a_shown_cost_view_turns_into_its_card_when_its_cluster_stops(ip, ray_session) -> None:
    from gpu_notebook import Cluster
    from gpu_notebook.cost import cost_meter_for
    from gpu_notebook.widgets import CostWidget

    c = Cluster(name="cost-view-card", workers=1, cpus_per_worker=0.25).start()
    try:
        with capture_output() as cap:
            w = CostWidget(cost_meter_for(c), interval=0.2)
            w.show()
            thread = w._thread
            assert thread is not None and not _left(cap, w._handle.display_id)
            c.stop()
            assert _wait(lambda: not thread.is_alive(), 15.0)
    finally:
        c.stop()
    (data,) = _left(cap, w._handle.display_id)
    assert "application/vnd.jupyter.widget-view+json" not in data
    assert "<" in data["text/html"] and data["text/plain"]
