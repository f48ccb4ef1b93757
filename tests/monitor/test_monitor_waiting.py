"""A monitor with no data yet says what it waits for: in its charts (on today's time axis, not plotly's empty
year-2000 one) and in its HTML and text fallbacks; the first sample replaces the note by the data."""

from __future__ import annotations

import time

import pytest

from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeNVML

WAITING = "waiting for the first sample"


def _notes(fig) -> list[str]:
    return [a.text for a in fig.layout.annotations if a.name == "waiting"]


@pytest.mark.parametrize("gpus", [1, 0])
def test_an_empty_chart_says_waiting_on_the_current_window_until_the_first_sample(gpus) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")
    s = NodeSampler("n", nvml=FakeNVML(gpus) if gpus else None, interval=1)
    mon = Monitor(samplers=[s], autopull=False).start()
    try:
        w = mon.widget(autostart=False)
        rows = 3
        assert _notes(w.fig) == [WAITING] * rows
        lo, hi = (t / 1000 - time.localtime().tm_gmtoff for t in w.fig.layout.xaxis.range)
        assert abs(hi - time.time()) < 60 and hi - lo == pytest.approx(w.window_s)  # now, not Jan 2000
        assert WAITING in mon.snapshot_html() and WAITING in mon.snapshot_text()
        s.tick()
        mon.pull()
        w.refresh(force=True)
        assert _notes(w.fig) == []
        assert w.fig.layout.xaxis.range is None and w.fig.layout.xaxis.autorange is True
        assert len(w.fig.data[0].x) == 1
        assert WAITING not in mon.snapshot_html() and WAITING not in mon.snapshot_text()
        w.close()
    finally:
        mon.stop()


def test_a_chart_built_with_data_has_no_note() -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")
    s = NodeSampler("n", nvml=FakeNVML(1), interval=1)
    s.tick()
    mon = Monitor(samplers=[s], autopull=False).start()
    try:
        w = mon.widget(autostart=False)
        assert _notes(w.fig) == [] and w.fig.layout.xaxis.range is None
        w.close()
    finally:
        mon.stop()
