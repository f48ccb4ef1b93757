"""Budget cap and idle stop with simulated time: against a small stand-in object, then on a REAL local cluster."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest

from gpu_notebook.catalog import Catalog
from gpu_notebook.cost import (
    BudgetPolicy,
    CostMeter,
    CpuUtilisation,
    IdleStopPolicy,
    MonitorUtilisation,
    PolicyWatcher,
    attach_policies,
    watcher_for,
)

G5 = ("aws", "g5.xlarge", "us-east-1", "on_demand")  # 1.006 USD/h in the shipped catalog


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Stub:
    """The attributes of gpu_notebook.Cluster the policies read and call."""

    def __init__(self) -> None:
        self.busy = False
        self.last_activity = 0.0
        self.state = "running"
        self.stopped_with: list[str] = []
        self.options: dict = {}
        self.hooks: list = []

    def ray_nodes(self) -> list[dict]:
        return [] if self.state == "stopped" else [{"NodeID": "node-a", "Alive": True}]

    def add_stop_hook(self, fn) -> None:
        self.hooks.append(fn)

    def stop(self, reason: str = "stopped by the user") -> str:
        for h in self.hooks:
            h(reason)
        self.stopped_with.append(reason)
        self.state = "stopped"
        return "stopped"


class Scripted:
    """A scripted utilisation source: returns the next value each call (the last one repeats)."""

    kind = "gpu"

    def __init__(self, *values: float | None) -> None:
        self.values = list(values)
        self.windows: list[float] = []

    def __call__(self, window_s: float) -> float | None:
        self.windows.append(window_s)
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


# -- budget ----------------------------------------------------------------------------------------------------
def test_budget_warns_at_80_then_checkpoints_and_stops_at_100() -> None:
    clock = Clock()
    stub = Stub()
    meter = CostMeter(stub, node_pricing={"node-a": G5}, clock=clock, catalog=Catalog.shipped())
    order: list[str] = []
    msgs: list[str] = []
    pol = BudgetPolicy(
        10.0,
        meter,
        stub,
        on_budget_checkpoint=lambda: order.append(f"ckpt {stub.state}") or "ckpt-7",
        notify=msgs.append,
    )
    w = PolicyWatcher(meter, [pol], clock=clock)
    w.tick()
    assert pol.state == "ok" and "runs out in ~9h56m" in pol.message
    clock.t += 7.9 * 3600
    assert w.tick() == [] and pol.state == "ok"
    clock.t += 0.1 * 3600 + 60  # 8.0 h x 1.006 = 8.05 USD > 80%
    out = w.tick()
    assert (
        pol.state == "warned"
        and len(out) == 1
        and out[0].startswith("budget warning: $8.06 of $10.00 spent (81%); runs out in ~1h55m")
    )
    assert w.tick() == []  # warned once
    clock.t += 2 * 3600
    out = w.tick()
    assert pol.state == "stopped" and stub.state == "stopped"
    assert order == ["ckpt running"]  # the checkpoint came before the stop
    assert out[0].startswith(
        "budget of $10.00 reached: $10.08 spent (estimate); checkpoint saved: ckpt-7; workers stopped"
    )
    assert stub.stopped_with[0].startswith("budget of $10.00 reached")
    assert msgs == [m for m in msgs if m] and len(msgs) == 2
    clock.t += 3600
    assert w.tick() == []  # nothing more after the stop
    assert meter.usd_per_hour() == 0.0  # a stopped cluster stops accruing


def test_budget_checkpoint_failure_does_not_prevent_stop_and_local_says_zero() -> None:
    clock = Clock()
    stub = Stub()
    meter = CostMeter(stub, node_pricing={"node-a": G5}, clock=clock, catalog=Catalog.shipped())

    def broken() -> None:
        raise OSError("disk full")

    pol = BudgetPolicy(1.0, meter, stub, on_budget_checkpoint=broken, notify=lambda m: None)
    meter.poll()
    clock.t += 3600
    msg = pol.check(clock())
    assert "checkpoint FAILED (OSError: disk full); workers stopped" in msg and stub.state == "stopped"

    local = CostMeter(Stub(), clock=clock)
    lp = BudgetPolicy(5.0, local, notify=lambda m: None)
    local.poll()
    clock.t += 1e6
    assert lp.check(clock()) is None and "local cluster costs $0" in lp.message
    with pytest.raises(ValueError):
        BudgetPolicy(0, local)


def test_a_checkpoint_callback_that_blocks_does_not_hold_the_budget_stop() -> None:
    """A callback queued behind a long training cell (what ``lambda: cluster.run(...)`` does) blocks: the stop
    waits ``budget_checkpoint_timeout_s``, says so, and stops anyway."""
    import threading

    clock = Clock()
    stub = Stub()
    stub.options["budget_checkpoint_timeout_s"] = 0.5  # Cluster(..., budget_checkpoint_timeout_s=0.5)
    meter = CostMeter(stub, node_pricing={"node-a": G5}, clock=clock, catalog=Catalog.shipped())
    release = threading.Event()
    entered = threading.Event()

    def queued_behind_training() -> str:
        entered.set()
        release.wait(20)  # the training cell ends
        return "too late"

    w = attach_policies(
        stub,
        budget_usd=1.0,
        node_pricing={"node-a": G5},
        clock=clock,
        start=False,
        on_budget_checkpoint=queued_behind_training,
        notify=lambda m: None,
    )
    try:
        w.tick()
        clock.t += 3600  # 1.006 USD > the 1 USD budget
        t0 = time.monotonic()
        out = w.tick()
        waited = time.monotonic() - t0
        assert entered.is_set() and 0.4 < waited < 10
        assert stub.state == "stopped" and w.policies[0].state == "stopped"
        assert "checkpoint NOT finished after 1s (budget_checkpoint_timeout_s)" in out[0]
        assert "stopping anyway; workers stopped" in out[0]
    finally:
        release.set()
        w.stop()
    # the default, and as an argument
    assert BudgetPolicy(1.0, meter).checkpoint_timeout_s == 120.0
    w2 = attach_policies(
        Stub(), budget_usd=1.0, start=False, notify=lambda m: None, budget_checkpoint_timeout_s=7
    )
    assert w2.policies[0].checkpoint_timeout_s == 7.0
    w2.stop()
    with pytest.raises(ValueError):
        BudgetPolicy(1.0, meter, checkpoint_timeout_s=0)


def test_the_budget_says_which_nodes_have_no_known_price() -> None:
    clock = Clock()
    stub = Stub()
    meter = CostMeter(
        stub, node_pricing={"node-a": ("kubernetes", "pod:A100x8", "ml", "on_demand")}, clock=clock
    )
    pol = BudgetPolicy(5.0, meter, stub, notify=lambda m: None)
    meter.poll()
    clock.t += 3600
    assert pol.check(clock()) is None
    assert "not counted: nodes with no known price (pod:A100x8)" in pol.message
    assert meter.unknown_prices() == ["pod:A100x8"]


# -- idle stop --------------------------------------------------------------------------------------------------
def test_idle_stop_counts_down_and_stops() -> None:
    clock = Clock()
    stub = Stub()
    msgs: list[str] = []
    util = Scripted(1.0)
    pol = IdleStopPolicy(60, stub, utilisation=util, notify=msgs.append)
    assert pol.warn_before_s == 600 and pol.threshold == 5.0
    for _ in range(50):  # checks at 0..49 min: 1% GPU, no cell
        pol.check(clock())
        clock.t += 60
    assert pol.state == "idle" and "idle for 49m00s (GPU 1%)" in pol.message and msgs == []
    pol.check(clock())  # 50 min: the countdown shows
    assert pol.state == "countdown" and pol.remaining_s == 600
    assert msgs == ["idle for 50m00s (GPU 1%): stopping the workers in 10m00s unless a cell runs"]
    clock.t += 540
    pol.check(clock())
    assert pol.status()["remaining_s"] == 60 and "in 1m00s" in pol.message and len(msgs) == 1
    clock.t += 60
    out = pol.check(clock())
    assert stub.state == "stopped" and pol.state == "stopped"
    assert out.startswith(
        "idle for 1h00m (no cell running, utilisation under 5%): --idle-stop 60 min; workers stopped"
    )
    assert util.windows[1] == 60  # each check asks about the time since the previous one


def test_a_cell_busy_gpu_or_touch_resets_the_idle_window() -> None:
    clock = Clock()
    stub = Stub()
    util = Scripted(0.0)
    pol = IdleStopPolicy(10, stub, utilisation=util, notify=lambda m: None)

    def advance(minutes: float) -> None:
        for _ in range(int(minutes)):
            clock.t += 60
            pol.check(clock())

    pol.check(clock())
    advance(9)
    assert pol.state == "countdown"
    stub.last_activity = 12345.0  # a %%distributed cell finished
    advance(1)
    assert pol.state == "active" and stub.state == "running"
    advance(9)
    assert pol.state == "countdown"
    stub.busy = True  # a long cell (e.g. a data-loading stall) is never idle
    advance(30)
    assert pol.state == "active" and stub.state == "running"
    stub.busy = False
    util.values = [50.0]  # GPUs busy without a cell (a background job)
    advance(30)
    assert stub.state == "running"
    util.values = [2.0]
    advance(9)
    pol.touch()  # any notebook cell (IPython post_run_cell)
    advance(1)
    assert pol.state == "active" and stub.state == "running"
    util.values = [None]  # unknown utilisation does not count as busy
    advance(10)
    assert stub.state == "stopped"


def test_idle_stop_uses_a_stop_callable_and_reports_failures() -> None:
    clock = Clock()
    calls: list[str] = []
    pol = IdleStopPolicy(1, None, utilisation=Scripted(0.0), stop=calls.append, notify=lambda m: None)
    pol.check(clock())
    clock.t += 61
    assert "workers stopped" in pol.check(clock()) and calls and calls[0].startswith("idle for 1m01s")

    def boom(reason: str) -> None:
        raise RuntimeError("no route")

    pol2 = IdleStopPolicy(1, None, utilisation=Scripted(0.0), stop=boom, notify=lambda m: None)
    pol2.check(clock())
    clock.t += 61
    assert "FAILED (RuntimeError: no route); stop them yourself" in pol2.check(clock())


def test_cpu_fallback_and_monitor_adapter() -> None:
    cpu = CpuUtilisation()
    first = cpu(10.0)
    second = cpu(10.0)
    assert first is None or 0.0 <= first <= 100.0
    assert second is not None and 0.0 <= second <= 100.0
    assert IdleStopPolicy(5, utilisation=cpu).threshold == 10.0

    class FakeMonitor:  # the shape of gpu_notebook.monitor.Monitor.utilisation_summary()
        def __init__(self, summary: dict) -> None:
            self.summary = summary

        def utilisation_summary(self, window_s: float) -> dict:
            return self.summary

    nan = math.nan
    m = MonitorUtilisation(
        FakeMonitor(
            {
                "n1": {
                    "has_gpu": True,
                    "gpus": {0: 3.0, 1: 40.0},
                    "mean_gpu_util": 21.5,
                    "max_gpu_util": 40.0,
                    "cpu_percent": 90.0,
                    "samples": 5,
                },
                "n2": {
                    "has_gpu": False,
                    "gpus": {},
                    "mean_gpu_util": nan,
                    "max_gpu_util": nan,
                    "cpu_percent": 12.0,
                    "samples": 5,
                },
                "n3": {
                    "has_gpu": True,
                    "gpus": {0: nan},
                    "mean_gpu_util": nan,
                    "max_gpu_util": nan,
                    "cpu_percent": nan,
                    "samples": 0,
                },
            }
        )
    )
    assert m(60) == 40.0 and m.kind == "gpu"
    assert (
        MonitorUtilisation(FakeMonitor({"n": {"has_gpu": False, "cpu_percent": nan, "samples": 0}}))(60)
        is None
    )


def test_the_monitor_feeds_idle_stop() -> None:
    """The monitoring package's own sampler, aggregator and utilisation_summary (fake NVML) drive idle stop."""
    from gpu_notebook.monitor import Monitor, NodeSampler
    from gpu_notebook.testing.nvml import FakeGPU, FakeNVML

    clock = Clock()
    t0 = clock.t
    nv = FakeNVML([FakeGPU(util=lambda t: 90.0 if t < 120 else 1.0), FakeGPU(util=0.0)], clock=clock)
    sampler = NodeSampler("node-a", nvml=nv, clock=clock, host=False, interval=0.5)
    mon = Monitor(samplers=[sampler], clock=clock, autopull=False).start()
    stopped: list[float] = []
    pol = IdleStopPolicy(
        5,
        None,
        utilisation=MonitorUtilisation(mon),
        stop=lambda reason: stopped.append(clock.t),
        notify=lambda m: None,
    )

    def run_for(seconds: float) -> None:
        end = clock.t + seconds
        while clock.t < end:
            for _ in range(20):  # 10 s of samples at 2 Hz
                clock.t += 0.5
                sampler.tick()
            mon.pull()
            pol.check(clock())

    try:
        run_for(110)
        assert pol.state == "active" and pol.last_utilisation == pytest.approx(90.0)
        run_for(60)  # GPU 0 drops to 1% at 120 s
        assert pol.state == "idle" and pol.last_utilisation == pytest.approx(1.0)
        run_for(300)
        assert pol.state == "stopped"
        assert stopped == [t0 + 120 + 300]  # five idle minutes after the GPU went quiet (checks every 10 s)
    finally:
        mon.stop()


# -- on a real local cluster -------------------------------------------------------------------------------------
def _save_cell(folder: Path) -> str:
    """A cell run on every rank: what a real checkpoint callback would do there."""
    return (
        f"import os, pathlib\np = pathlib.Path({str(folder)!r}) / ('rank' + os.environ['RANK'] + '.ckpt')\n"
        "p.write_text('state')\nstr(p)"
    )


@pytest.fixture
def real_cluster(ray_session):
    from gpu_notebook import Cluster

    clusters = []

    def make(name: str):
        c = Cluster(name=name, workers=1, cpus_per_worker=0.25).start()
        clusters.append(c)
        return c

    yield make
    for c in clusters:
        if c.state == "running":
            c.stop()


@pytest.mark.timeout(120)
def test_budget_stop_on_a_real_local_cluster(real_cluster, tmp_path) -> None:
    c = real_cluster("cost-budget")
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    msgs: list[str] = []
    w = attach_policies(
        c,
        budget_usd=5.0,
        node_pricing=lambda node_id: G5,
        clock=clock,
        start=False,
        on_budget_checkpoint=lambda: c.run(_save_cell(tmp_path), stream=False).values,
        notify=msgs.append,
    )
    assert watcher_for(c) is w
    assert w.tick() == []
    offset[0] = 4.2 * 3600  # 4.2 h x 1.006 USD/h: past 80%
    assert w.tick()[0].startswith("budget warning: $4.2")
    assert c.state == "running"
    offset[0] = 5.1 * 3600
    out = w.tick()
    assert c.state == "stopped"
    assert "checkpoint saved: ['" in out[0] and "rank0.ckpt" in out[0] and "workers stopped" in out[0]
    assert (tmp_path / "rank0.ckpt").read_text() == "state"
    assert w.meter.usd_per_hour() == 0.0
    assert not w.running


@pytest.mark.timeout(120)
def test_idle_stop_on_a_real_local_cluster(real_cluster) -> None:
    c = real_cluster("cost-idle")
    offset = [0.0]

    def clock() -> float:
        return time.time() + offset[0]

    msgs: list[str] = []
    w = attach_policies(
        c, idle_stop_minutes=10, utilisation=Scripted(0.5), clock=clock, start=False, notify=msgs.append
    )
    w.tick()
    assert w.meter.is_local and w.meter.spent() == 0.0  # a local cluster costs $0
    offset[0] += 9 * 60
    w.tick()
    pol = w.policies[0]
    assert pol.state == "countdown"
    assert re.search(
        r"stopping the workers in (1m00s|\d\ds) unless a cell runs$", msgs[-1]
    )  # real time passes too
    c.run("x = 1", stream=False)  # a %%distributed cell resets it
    offset[0] += 5 * 60
    w.tick()
    assert pol.state == "active" and c.state == "running"
    offset[0] += 5 * 60
    w.tick()
    assert pol.state == "idle"
    offset[0] += 5 * 60
    out = w.tick()
    assert c.state == "stopped" and re.match(r"idle for 10m\d\ds \(no cell running", out[0])
    assert "%gpu" not in out[0] and "workers stopped" in out[0]


def test_watcher_thread_stops_an_over_budget_cluster() -> None:
    """The real background thread (not tick()) acts on its own; here with a budget already spent."""
    import threading

    stub = Stub()
    done = threading.Event()
    stub.add_stop_hook(lambda reason: done.set())
    w = attach_policies(
        stub, budget_usd=0.01, node_pricing={"node-a": 1_000_000.0}, interval_s=0.05, notify=lambda m: None
    )
    try:
        assert done.wait(30), "the watcher thread never stopped the cluster"
        assert stub.stopped_with[0].startswith("budget of $0.01 reached")
        for _ in range(200):
            if not w.running:
                break
            time.sleep(0.05)
        assert not w.running  # the watcher ends with the cluster
    finally:
        w.stop()


def test_any_notebook_cell_resets_the_idle_countdown(ip) -> None:
    clock = Clock()
    stub = Stub()
    w = attach_policies(
        stub, idle_stop_minutes=10, utilisation=Scripted(0.0), clock=clock, start=False, notify=lambda m: None
    )
    pol = w.policies[0]
    try:
        w.tick()
        clock.t += 9 * 60
        w.tick()
        assert pol.state == "countdown"
        ip.run_cell("1 + 1")  # an ordinary local cell, not %%distributed
        clock.t += 60
        w.tick()
        assert pol.state == "idle" and pol.message.startswith("idle for 1m00s") and stub.state == "running"
        stub.stop()  # the cluster's stop hooks end the watcher and the cell hook
        n = len(ip.events.callbacks["post_run_cell"])
        ip.run_cell("2 + 2")
        assert len(ip.events.callbacks["post_run_cell"]) == n
        assert all(
            "_cell_ran" not in getattr(cb, "__name__", "") for cb in ip.events.callbacks["post_run_cell"]
        )
    finally:
        w.stop()


def test_default_utilisation_prefers_the_clusters_monitor() -> None:
    from gpu_notebook import _registry
    from gpu_notebook.cost import default_utilisation
    from gpu_notebook.monitor import Monitor, NodeSampler
    from gpu_notebook.testing.nvml import FakeNVML

    stub = Stub()
    assert isinstance(default_utilisation(stub), CpuUtilisation)  # no GPUs, no monitor: this machine's CPU
    assert isinstance(default_utilisation(None), CpuUtilisation)
    clock = Clock()
    sampler = NodeSampler("node-a", nvml=FakeNVML(1, clock=clock), clock=clock, host=False)
    mon = Monitor(samplers=[sampler], clock=clock, autopull=False).start()
    _registry.monitors.set(stub, mon)  # what %gpu_monitor leaves behind
    try:
        src = default_utilisation(stub)
        assert isinstance(src, MonitorUtilisation) and src.monitor is mon
    finally:
        _registry.monitors.pop(stub)
        mon.stop()


def test_budget_stop_names_the_active_checkpointers_latest_checkpoint(tmp_path) -> None:
    import numpy as np

    from gpu_notebook.checkpoint import Checkpointer

    ckpt = Checkpointer(str(tmp_path / "ckpts"))
    ckpt.save({"w": np.arange(8, dtype=np.float32)}, step=7)  # asynchronous; the stop waits for it
    clock = Clock()
    stub = Stub()
    meter = CostMeter(stub, node_pricing={"node-a": G5}, clock=clock, catalog=Catalog.shipped())
    meter.poll()
    clock.t += 3600
    msg = BudgetPolicy(1.0, meter, stub, notify=lambda m: None).check(clock())
    assert (
        "no checkpoint saved (no on_budget_checkpoint given); its pending saves finished, the latest checkpoint is step 7"
        in msg
    )
    assert msg.endswith("workers stopped") and stub.state == "stopped"
    ckpt.close()


def test_attach_from_the_options_of_gpu_cluster_start() -> None:
    from gpu_notebook.cost import attach_from_options, describe

    stub = Stub()
    assert attach_from_options(stub) is None and describe(None) == "no budget or idle stop"
    stub.options.update(idle_stop=60, budget=25.0, node_pricing={"node-a": G5})
    w = attach_from_options(stub, start=False, utilisation=Scripted(0.0))
    try:
        assert [type(p).__name__ for p in w.policies] == ["BudgetPolicy", "IdleStopPolicy"]
        assert w.meter.budget_usd == 25.0 and w.policies[1].window_s == 3600
        w.tick()
        assert w.meter.usd_per_hour() == pytest.approx(1.006)
        assert describe(w) == (
            "budget $25.00 (warns at 80%, then checkpoint and stop); idle stop after 60 min "
            "without cells or 5% utilisation; cost is a list-price estimate"
        )
    finally:
        w.stop()
