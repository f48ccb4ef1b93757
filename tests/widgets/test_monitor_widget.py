"""The dashboard widget: message cap under load (counted, not timed), structure, capped buffers, fallbacks."""

from __future__ import annotations

import threading
import time

import comm
import numpy as np
import pytest
from _poll import wait_for

from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML, steps

pytest.importorskip("plotly")
pytest.importorskip("ipywidgets")


class Clock:
    def __init__(self, t: float = 1_764_400_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Wire:
    """Records every message our widgets would put on the wire, with the simulated time it was sent."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.msgs: list[tuple[float, str, list[str]]] = []
        wire = self

        class CountingComm(comm.DummyComm):
            def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
                state = list(((data or {}).get("state") or {}).keys())
                wire.msgs.append((wire.clock(), msg_type, state))

        self.comm_cls = CountingComm

    def comm_msgs(self, after: float = -np.inf) -> list[float]:
        return [t for t, kind, _ in self.msgs if kind == "comm_msg" and t > after]

    def max_in_any_second(self, after: float = -np.inf) -> int:
        ts = np.array(self.comm_msgs(after))
        if ts.size == 0:
            return 0
        return int(max(((ts > t - 1.0) & (ts <= t)).sum() for t in ts))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def wire(clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Wire:
    w = Wire(clock)
    monkeypatch.setattr(comm, "create_comm", lambda *a, **k: w.comm_cls(*a, **k))
    return w


def fake_cluster(clock: Clock, nodes: int, gpus: int, util=None, host: bool = False):
    samplers = []
    for n in range(nodes):
        fg = [
            FakeGPU(
                name="NVIDIA H100 80GB HBM3",
                util=(util(n, i) if util else (lambda t, n=n, i=i: (n * 7 + i * 11 + 3 * t) % 100)),
            )
            for i in range(gpus)
        ]
        samplers.append(NodeSampler(f"node-{n:02d}", nvml=FakeNVML(fg, clock=clock), clock=clock, host=host))
    mon = Monitor(samplers=samplers, clock=clock, autopull=False).start()
    return mon, samplers


def advance(clock: Clock, mon: Monitor, samplers, seconds: float, step: float = 0.5) -> None:
    for _ in range(int(round(seconds / step))):
        clock.t += step
        for s in samplers:
            s.tick()
    mon.pull()


def test_load_64_nodes_x_8_gpus_stays_within_message_cap(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon, samplers = fake_cluster(clock, 64, 8)
    advance(clock, mon, samplers, 2)
    w = MonitorWidget(mon, autostart=False, clock=clock, max_msgs_per_s=5)
    start = clock.t
    own_before, wire_before = w.messages_sent, len(wire.comm_msgs())
    attempts = 0
    for k in range(300):  # 30 simulated seconds, the UI timer firing at 10 Hz (far too fast on purpose)
        clock.t += 0.1
        if k % 5 == 0:
            for s in samplers:
                s.tick()
        if k % 10 == 0:
            mon.pull()
        w.refresh()
        attempts += 1
    sent = wire.comm_msgs(after=start)
    assert wire.max_in_any_second(after=start) <= 5
    assert len(sent) <= 5 * 30 + 5
    # data kept flowing, ~1 Hz; every other tick was held back by the cap or had nothing new to send
    assert w.refreshes >= 25 and w.skipped + w.unchanged >= attempts - w.refreshes - 1
    assert w.unchanged > 0 and w.skipped > 0
    assert w.messages_sent - own_before == len(wire.comm_msgs()) - wire_before  # our own counter agrees


def test_many_gpus_get_a_heat_map_and_aggregated_lines(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon, samplers = fake_cluster(clock, 20, 8, util=lambda n, i: float(n + i))
    advance(clock, mon, samplers, 5)
    w = MonitorWidget(mon, autostart=False, clock=clock, max_traces=16)
    kinds = [type(t).__name__ for t in w.fig.data]
    assert kinds.count("Heatmap") == 1
    assert len([t for t in w.fig.data if type(t).__name__ == "Scatter"]) == 3 * 3  # mean/min/max x 3 charts
    heat = next(t for t in w.fig.data if type(t).__name__ == "Heatmap")
    z = np.array(heat.z, dtype=float)
    assert z.shape == (20, 8) and z[3, 5] == 8.0 and list(heat.y[:2]) == ["node-00", "node-01"]
    util_mean = w.fig.data[0]
    assert util_mean.name == "cluster mean" and np.nanmax(
        np.array(util_mean.y, dtype=float)
    ) == pytest.approx(13.0)


def test_few_gpus_one_line_each_and_the_data_changes(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon, samplers = fake_cluster(clock, 2, 2, util=lambda n, i: steps([(0, 10 * (n * 2 + i)), (20, 99)]))
    advance(clock, mon, samplers, 5)
    w = MonitorWidget(mon, autostart=False, clock=clock)
    util = [t for t in w.fig.data if t.yaxis == "y"]
    assert [t.name for t in util] == ["node-00/gpu0", "node-00/gpu1", "node-01/gpu0", "node-01/gpu1"]
    assert [t.y[-1] for t in util] == [0, 10, 20, 30]
    assert not any(type(t).__name__ == "Heatmap" for t in w.fig.data)
    advance(clock, mon, samplers, 20)
    assert w.refresh()
    assert [t.y[-1] for t in util] == [99, 99, 99, 99]
    assert "GPUs" in w.header.value and "99%" in w.header.value


def test_points_per_trace_are_capped(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon, samplers = fake_cluster(clock, 1, 1)
    advance(clock, mon, samplers, 1200)  # 2400 samples in the window
    w = MonitorWidget(mon, autostart=False, clock=clock, window_s=1800, max_points=200)
    assert all(len(t.y) <= 200 for t in w.fig.data)
    assert len(w.fig.data[0].y) >= 150


def test_cpu_only_nodes_show_host_metrics(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    s = NodeSampler("laptop", nvml=None, clock=clock, host=True)
    mon = Monitor(samplers=[s], clock=clock, autopull=False).start()
    for _ in range(3):
        time.sleep(0.05)
        clock.t += 0.5
        s.tick()
    mon.pull()
    w = MonitorWidget(mon, autostart=False, clock=clock)
    titles = [a.text for a in w.fig.layout.annotations]
    assert titles[0] == "host CPU %" and len(w.fig.data) == 3
    assert len(w.fig.data[0].y) == 3 and "none (host metrics)" in w.header.value


def test_advice_shows_in_header_naming_the_gpu(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon, samplers = fake_cluster(clock, 1, 2, util=lambda n, i: 95 if i == 0 else 35)
    mon.advice_window = 60
    advance(clock, mon, samplers, 70)
    w = MonitorWidget(mon, autostart=False, clock=clock)
    assert "node-00/gpu1 35%" in w.header.value and "NVIDIA H100 80GB HBM3" in w.header.value
    assert "batch size" in w.header.value and "mixed precision" in w.header.value
    assert "node-00/gpu0" not in w.header.value


def test_mime_bundle_has_a_static_html_snapshot(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon, samplers = fake_cluster(clock, 1, 2, util=lambda n, i: 42.0)
    advance(clock, mon, samplers, 2)
    w = MonitorWidget(mon, autostart=False, clock=clock)
    bundle = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    html = bundle["text/html"]
    assert "<table>" in html and "<td>42</td>" in html and "<script" not in html and "<img" not in html
    assert bundle["text/plain"].startswith("MonitorWidget(1 nodes, 2 GPUs")


def test_background_thread_refreshes(wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon = Monitor.local(nvml=lambda: FakeNVML(1), interval=0.1, pull_interval=0.1).start()
    try:
        others = set(threading.enumerate())
        w = MonitorWidget(mon, interval=0.1)
        deadline = time.monotonic() + 20
        while w.refreshes < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert w.refreshes >= 3 and "live" in repr(w)
        refreshers = [t for t in threading.enumerate() if t.name == w.thread_name and t not in others]
        assert len(refreshers) == 1  # this widget's
        w.stop()
        n = w.refreshes
        wait_for(lambda: not refreshers[0].is_alive(), what="the refresh thread to end")
        assert w.refreshes == n and "paused" in repr(w)  # nothing refreshes it any more
    finally:
        mon.stop()


def test_nothing_new_sends_nothing_and_stale_traces_are_not_resent(clock: Clock, wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon, samplers = fake_cluster(clock, 2, 1)
    advance(clock, mon, samplers, 3)
    w = MonitorWidget(mon, autostart=False, clock=clock)
    n0 = len(wire.comm_msgs())
    clock.t += 1.0
    assert not w.refresh() and w.unchanged == 1  # no new rows: no work, no message
    assert len(wire.comm_msgs()) == n0
    updates: list[tuple[dict, list[int]]] = []
    orig = w.fig._send_update_msg
    w.fig._send_update_msg = lambda style, layout, idx=None, **k: (
        updates.append((layout, list(idx))),
        orig(style, layout, idx, **k),
    )
    clock.t += 0.5
    samplers[0].tick()  # only node-00 has something new
    mon.pull()
    assert w.refresh() and len(wire.comm_msgs()) > n0
    layout, idx = updates[-1]
    assert {w._traces[i][2][1] for i in idx} == {"node-00"}  # node-01's traces did not change: not resent
    # plotly.js resets an axis type when x is restyled; the same message must name the date type again
    assert layout == {"xaxis.type": "date", "xaxis2.type": "date", "xaxis3.type": "date"}
    y = np.asarray(w.fig.data[0].y)
    assert y.dtype == np.float64 and len(y) >= 6  # binary float64 buffers, not lists of objects
    x = np.asarray(w.fig.data[0].x)
    assert x.dtype == np.float64 and x[-1] > x[0] and w.fig.layout.xaxis.type == "date"


def test_busy_kernel_refreshes_less_often(wire: Wire) -> None:
    from gpu_notebook.widgets import MonitorWidget

    mon = Monitor.local(nvml=lambda: FakeNVML(1), interval=0.1, pull_interval=0.1).start()
    try:
        w = MonitorWidget(mon, interval=0.1, busy_interval=2.0)
        t_end = time.monotonic() + 1.5
        x = 0
        while time.monotonic() < t_end:  # this (main) thread computes: the kernel is busy
            x += 1
        busy_refreshes, deferred = w.refreshes, w.deferred
        w.stop(snapshot=False)
        assert deferred >= 3 and busy_refreshes <= 3  # at most the first one plus one per busy_interval
    finally:
        mon.stop()


def test_busy_kernel_defers_timer_ticks(wire: Wire) -> None:
    # the same policy as above without depending on how much CPU this machine gives the main thread
    from gpu_notebook.widgets import MonitorWidget

    mon = Monitor.local(nvml=lambda: FakeNVML(1), interval=0.1, pull_interval=0.1).start()
    try:
        now = [1000.0]
        w = MonitorWidget(mon, interval=0.1, busy_interval=2.0, autostart=False, clock=lambda: now[0])
        load = [0.9]
        w._load.share = lambda: load[0]  # the main thread used 90% of a core since the last tick
        refreshes = w.refreshes
        for _ in range(5):
            now[0] += 0.1
            w._tick()
        assert w.deferred == 5 and w.refreshes == refreshes  # busy, and the last refresh is under 2 s old
        now[0] += 2.0
        w._tick()  # busy, but busy_interval has passed: one refresh
        load[0] = 0.1
        w._tick()  # idle: refresh at interval
        assert w.deferred == 5 and w.refreshes + w.unchanged + w.skipped == refreshes + 2  # both ticks tried
    finally:
        mon.stop()
