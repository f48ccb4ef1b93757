"""Ring buffer, node sampler (fast/slow tiers), aggregator, advice and the utilisation summary.

All with the fake NVML and a simulated clock: time only moves when the test says so.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from _poll import wait_for

from gpu_notebook.monitor import (
    GPU_METRICS,
    HOST_METRICS,
    Aggregator,
    Monitor,
    NodeSampler,
    RingBuffer,
    utilisation_summary,
)
from gpu_notebook.monitor._aggregator import LocalHandle
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML, steps

SLOW_CALLS = ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetPcieThroughput")


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_node(clock: Clock, name: str, gpus: list[FakeGPU], host: bool = False, interval: float = 0.5):
    nv = FakeNVML(gpus, clock=clock)
    return NodeSampler(name, nvml=nv, clock=clock, host=host, interval=interval), nv


# -- ring buffer ---------------------------------------------------------------------------------------------------
def test_ring_buffer_read_since_returns_only_new_rows() -> None:
    rb = RingBuffer(["a", "b"], capacity=5)
    for i in range(3):
        rb.append(float(i), [i, 10 * i])
    r = rb.read_since(0)
    assert r["seq"] == 3 and list(r["t"]) == [0, 1, 2] and r["dropped"] == 0
    rb.append(3.0, [3, 30])
    r2 = rb.read_since(r["seq"])
    assert list(r2["t"]) == [3.0] and list(r2["data"][0]) == [3, 30]
    assert rb.read_since(r2["seq"])["t"].size == 0


def test_ring_buffer_overwrites_oldest_and_reports_drops() -> None:
    rb = RingBuffer(["a"], capacity=4)
    for i in range(10):
        rb.append(float(i), [i])
    assert len(rb) == 4
    r = rb.read_since(0)
    assert list(r["t"]) == [6, 7, 8, 9] and r["dropped"] == 6
    t, data = rb.window(7.5)
    assert list(t) == [8, 9]
    assert rb.latest()[0] == 9.0
    r = rb.read_since(7, max_rows=1)
    assert list(r["t"]) == [9] and r["dropped"] == 2


def test_ring_buffer_append_many_wraps_like_appending_one_by_one() -> None:
    one, many = RingBuffer(["a", "b"], capacity=4), RingBuffer(["a", "b"], capacity=4)
    batches = [3, 0, 2, 6]  # the last batch alone is bigger than the capacity
    k = 0
    for n in batches:
        t = np.arange(k, k + n, dtype=float)
        rows = np.stack([t, 10 * t], axis=1) if n else np.zeros((0, 2))
        many.append_many(t, rows)
        for ti, row in zip(t, rows, strict=True):
            one.append(ti, row)
        k += n
        assert many.seq == one.seq
        assert np.array_equal(many.read_since(0)["data"], one.read_since(0)["data"])
    assert list(many.read_since(0)["t"]) == [7, 8, 9, 10]
    with pytest.raises(ValueError):
        many.append_many(np.arange(2.0), np.zeros((2, 3)))


def test_ring_buffer_rejects_wrong_width() -> None:
    rb = RingBuffer(["a", "b"], capacity=2)
    with pytest.raises(ValueError):
        rb.append(0.0, [1.0])


def test_sampler_capacity_is_an_hour_at_full_rate() -> None:
    clock = Clock()
    s, _ = make_node(clock, "n", [FakeGPU()], interval=0.5)
    assert s.buffer.capacity == 7200
    assert s.buffer.nbytes() < 8 * 7200 * (len(GPU_METRICS) + 1) + 1024


# -- sampler -------------------------------------------------------------------------------------------------------
def test_sampler_reads_all_gpu_metrics() -> None:
    clock = Clock()
    s, nv = make_node(
        clock,
        "n1",
        [FakeGPU(util=55, mem_used_mib=2048, power_w=300, gpm=True, sm_active=0.5), FakeGPU(util=0)],
    )
    info = s.info()
    assert info["has_gpu"] and info["nvml"] == "fake" and len(info["gpus"]) == 2
    assert info["columns"][: len(GPU_METRICS)] == [f"gpu0.{m}" for m in GPU_METRICS]
    clock.t += 0.5
    row = dict(zip(info["columns"], s.tick(), strict=True))
    assert row["gpu0.util_gpu"] == 55 and row["gpu0.mem_used_mib"] == 2048 and row["gpu0.power_w"] == 300
    assert row["gpu0.mem_total_mib"] == 81920 and row["gpu0.power_limit_w"] == 400
    assert row["gpu0.sm_active"] == pytest.approx(0.5)
    assert math.isnan(row["gpu1.sm_active"])  # no GPM on that one
    assert row["gpu1.util_gpu"] == 0 and int(row["gpu1.throttle"]) & 1  # idle throttle reason
    clock.t += 10
    row2 = dict(zip(info["columns"], s.tick(), strict=True))
    assert row2["gpu0.energy_j"] - row["gpu0.energy_j"] == pytest.approx(3000, rel=0.01)


def test_fast_tier_never_makes_slow_calls_and_slow_tier_does() -> None:
    clock = Clock()
    s, nv = make_node(clock, "n1", [FakeGPU(processes=[(1234, 512)]) for _ in range(4)])
    for _ in range(100):
        clock.t += 0.5
        s.tick()
    assert all(nv.calls[c] == 0 for c in SLOW_CALLS)
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 400
    slow = s.slow_tick()
    assert (
        nv.calls["nvmlDeviceGetComputeRunningProcesses"] == 4 and nv.calls["nvmlDeviceGetPcieThroughput"] == 8
    )
    assert slow[0]["processes"] == [{"pid": 1234, "used_mib": 512.0}] and slow[0]["pcie_rx_kBps"] == 2000


def test_slow_interval_is_at_least_ten_seconds() -> None:
    clock = Clock()
    s, _ = make_node(clock, "n", [FakeGPU()])
    assert NodeSampler("x", nvml=None, slow_interval=1, host=False).slow_interval == 10.0
    assert s.slow_interval >= 10.0


def test_unsupported_metric_becomes_nan_and_is_not_retried() -> None:
    clock = Clock()
    s, nv = make_node(clock, "n", [FakeGPU(unsupported=["nvmlDeviceGetTotalEnergyConsumption"])])
    for _ in range(5):
        s.tick()
    col = s.info()["columns"].index("gpu0.energy_j")
    assert np.isnan(s.buffer.latest()[1][col])
    assert nv.calls["nvmlDeviceGetTotalEnergyConsumption"] == 1


def test_node_without_driver_samples_host_metrics() -> None:
    s = NodeSampler("cpu-node", nvml=FakeNVML(2, library_missing=True), host=True)
    info = s.info()
    assert not info["has_gpu"] and info["nvml"] == "none"
    assert info["columns"] == [f"host.{m}" for m in HOST_METRICS]
    s.tick()
    s.tick()
    row = dict(zip(info["columns"], s.buffer.latest()[1], strict=True))
    assert row["host.mem_total_mib"] > 100 and 0 < row["host.mem_used_mib"] < row["host.mem_total_mib"]
    assert row["host.net_rx_Bps"] >= 0


def test_sampler_threads_tick_and_stop() -> None:
    s = NodeSampler("t", nvml=FakeNVML(1), interval=0.1, host=False).start()
    try:
        import time

        deadline = time.monotonic() + 10
        while s.buffer.seq < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.buffer.seq >= 3 and s.running
    finally:
        s.stop()
    assert not s.running
    assert s.stats()["ticks"] >= 3


# -- aggregator ----------------------------------------------------------------------------------------------------
def test_aggregator_pulls_only_new_rows_from_every_node() -> None:
    clock = Clock()
    nodes = [make_node(clock, f"node-{i}", [FakeGPU(util=10 * i)] * 2)[0] for i in range(3)]
    agg = Aggregator([LocalHandle(s) for s in nodes], clock=clock)
    for _ in range(4):
        clock.t += 0.5
        for s in nodes:
            s.tick()
    assert agg.pull() == 12
    assert agg.pull() == 0
    clock.t += 0.5
    nodes[1].tick()
    assert agg.pull() == 1
    assert agg.nodes["node-1"].seq == 5 and agg.nodes["node-0"].seq == 4
    latest = agg.latest()["gpus"]
    assert [(r["node"], r["index"], r["util_gpu"]) for r in latest] == [
        ("node-0", 0, 0),
        ("node-0", 1, 0),
        ("node-1", 0, 10),
        ("node-1", 1, 10),
        ("node-2", 0, 20),
        ("node-2", 1, 20),
    ]


def test_aggregator_rereads_a_restarted_sampler_and_counts_drops() -> None:
    clock = Clock()
    s, _ = make_node(clock, "n", [FakeGPU()], interval=0.5)
    s.buffer = RingBuffer(s.buffer.columns, capacity=3)
    agg = Aggregator([LocalHandle(s)], clock=clock)
    for _ in range(5):
        clock.t += 0.5
        s.tick()
    agg.pull()
    assert agg.nodes["n"].dropped == 2
    s.epoch = "restarted"
    s.buffer = RingBuffer(s.buffer.columns, capacity=3)
    s.tick()
    agg.pull()  # notices the new epoch and resets
    assert agg.pull() == 1


def test_a_failing_node_is_marked_down_not_raised() -> None:
    clock = Clock()
    s, _ = make_node(clock, "n", [FakeGPU()])
    agg = Aggregator([LocalHandle(s)], clock=clock)

    def boom(*a, **k):
        raise RuntimeError("node lost")

    s.read_since = boom
    agg.pull()
    assert agg.nodes["n"].up is False and agg.nodes["n"].errors == 1


# -- advice and summary --------------------------------------------------------------------------------------------
def _monitor_with(clock: Clock, gpus: list[FakeGPU], seconds: float, **kw) -> tuple[Monitor, NodeSampler]:
    s, _ = make_node(clock, "node-a", gpus, host=True)
    mon = Monitor(samplers=[s], clock=clock, autopull=False, **kw).start()
    for _ in range(int(seconds / 0.5)):
        clock.t += 0.5
        s.tick()
    mon.pull()
    return mon, s


def test_advice_names_the_underused_gpu_with_remedies() -> None:
    clock = Clock()
    mon, _ = _monitor_with(
        clock,
        [FakeGPU(util=95), FakeGPU(name="NVIDIA L4", util=lambda t: 40 + (t % 2) * 10)],
        seconds=130,
        advice_window=120,
    )
    adv = mon.advice()
    assert [(a.node, a.gpu) for a in adv] == [("node-a", 1)]
    msg = adv[0].message
    assert "GPU 1 (NVIDIA L4)" in msg and "under 70%" in msg
    for remedy in ("batch size", "DataLoader workers", "pin_memory", "mixed precision"):
        assert remedy in msg


def test_advice_waits_for_a_whole_window_and_ignores_short_dips() -> None:
    clock = Clock()
    mon, s = _monitor_with(clock, [FakeGPU(util=10)], seconds=60, advice_window=120)
    assert mon.advice() == []  # only 60 s of history: not sustained yet
    clock2 = Clock()
    # busy, with a 20 s data-loading stall inside the window: p95 stays high, so no advice
    mon2, _ = _monitor_with(
        clock2, [FakeGPU(util=steps([(0, 90), (50, 5), (70, 90)]))], seconds=150, advice_window=120
    )
    assert mon2.advice() == []
    assert mon2.advice(threshold=95)  # but with a stricter threshold it is flagged


def test_idle_gpu_gets_an_idle_message() -> None:
    clock = Clock()
    mon, _ = _monitor_with(clock, [FakeGPU(util=0)], seconds=70, advice_window=60)
    (a,) = mon.advice()
    assert a.idle and "idle" in a.message


def test_utilisation_summary_per_node_and_gpu() -> None:
    clock = Clock()
    mon, _ = _monitor_with(clock, [FakeGPU(util=steps([(0, 0), (100, 80)])), FakeGPU(util=20)], seconds=200)
    summ = utilisation_summary(mon, 60)
    node = summ["node-a"]
    assert node["has_gpu"] is True
    assert node["gpus"] == {0: pytest.approx(80), 1: pytest.approx(20)}
    assert node["mean_gpu_util"] == pytest.approx(50) and node["max_gpu_util"] == pytest.approx(80)
    assert node["samples"] == 121 and node["span_s"] == pytest.approx(60)
    assert not math.isnan(node["cpu_percent"])
    assert utilisation_summary(mon, 300)["node-a"]["gpus"][0] < 60  # longer window includes the idle part


def test_utilisation_summary_on_cpu_node() -> None:
    clock = Clock()
    s = NodeSampler("laptop", nvml=None, host=True, clock=clock)
    mon = Monitor(samplers=[s], autopull=False, clock=clock).start()
    cpu = HOST_METRICS.index("cpu_percent")

    def tick() -> bool:
        """A sample 0.1 s later; whether it has the host's CPU % (which needs the kernel's CPU time to have moved
        on since the last reading, in real time)."""
        clock.t += 0.1
        return not math.isnan(s.tick()[cpu])

    wait_for(tick, what="a CPU reading of the host")
    mon.pull()
    summ = utilisation_summary(mon, 60)["laptop"]
    assert summ["has_gpu"] is False and summ["gpus"] == {} and math.isnan(summ["mean_gpu_util"])
    assert 0 <= summ["cpu_percent"] <= 100


def test_local_monitor_runs_threads_and_stops() -> None:
    import time

    mon = Monitor.local(nvml=lambda: FakeNVML(2), interval=0.1, pull_interval=0.1).start()
    try:
        deadline = time.monotonic() + 10
        while mon.aggregator.rows_in < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert mon.aggregator.rows_in >= 3 and mon.gpu_count == 2
        assert "2 GPUs" in repr(mon) and "<table>" in mon._repr_html_()
    finally:
        mon.stop()
    assert not mon.started


def test_ring_buffer_window_when_the_clock_went_backwards() -> None:
    rb = RingBuffer(["a"], capacity=10)
    for t in (0.0, 1.0, 2.0, 1.5, 3.0):
        rb.append(t, [t])
    t, data = rb.window(1.2)
    assert list(t) == [2.0, 1.5, 3.0] and list(data[:, 0]) == [2.0, 1.5, 3.0]
    t, _ = RingBuffer(["a"], capacity=3).window(0.0)
    assert t.size == 0


def test_importing_the_monitor_is_cheap() -> None:
    import subprocess
    import sys

    code = (
        "import sys; import gpu_notebook.monitor, gpu_notebook.widgets, gpu_notebook.magics._monitor\n"
        "from gpu_notebook.monitor import Monitor, utilisation_summary\n"
        "from gpu_notebook.testing.nvml import FakeNVML\n"
        "print([m for m in ('ray', 'torch', 'pynvml', 'plotly', 'ipywidgets', 'boto3') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_ring_buffer_oldest_time() -> None:
    rb = RingBuffer(["a"], capacity=3)
    assert rb.oldest_t() is None
    for t in range(5):
        rb.append(float(t), [0])
    assert rb.oldest_t() == 2.0


def test_old_driver_without_clock_event_reasons_falls_back_to_throttle_reasons() -> None:
    clock = Clock()
    s, nv = make_node(clock, "n", [FakeGPU(util=0, unsupported=["nvmlDeviceGetCurrentClocksEventReasons"])])
    for _ in range(3):
        s.tick()
    col = s.info()["columns"].index("gpu0.throttle")
    assert int(s.buffer.latest()[1][col]) & 1  # GPU idle reason, read through the older call
    assert nv.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert nv.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3


def test_gpu_processes_are_attributed_to_cluster_ranks() -> None:
    from types import SimpleNamespace

    clock = Clock()
    s, _ = make_node(
        clock, "node-a", [FakeGPU(processes=[(111, 2048), (999, 10)]), FakeGPU(processes=[(222, 4096)])]
    )

    class StubCluster:  # only what gpu_processes reads: status().workers
        def status(self):
            return SimpleNamespace(
                workers=[
                    SimpleNamespace(rank=0, node_id="node-a", pid=111),
                    SimpleNamespace(rank=1, node_id="node-a", pid=222),
                ]
            )

    mon = Monitor(samplers=[s], clock=clock, autopull=False).start()
    mon.cluster = StubCluster()
    assert mon.gpu_processes() == []  # the slow tier has not run yet
    s.slow_tick()
    mon.pull()
    rows = mon.gpu_processes()
    assert {(r["gpu"], r["pid"], r["rank"]) for r in rows} == {(0, 111, 0), (0, 999, None), (1, 222, 1)}
    assert next(r for r in rows if r["pid"] == 222)["used_mib"] == 4096
