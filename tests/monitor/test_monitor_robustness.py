"""The monitor under trouble: a node whose sampler cannot start, nodes added while a dashboard renders, a sampler
that restarts with other GPUs. Ray tests use the session's real local cluster (no mocks)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.monitor._aggregator import Aggregator, LocalHandle
from gpu_notebook.testing.nvml import FakeNVML


class RayNodes:
    """What Monitor needs from a Cluster: ``ray_nodes()``; ``extra`` nodes are added to Ray's own list."""

    def __init__(self, ray, extra=()) -> None:
        self.ray = ray
        self.extra = list(extra)

    def ray_nodes(self):
        return [n for n in self.ray.nodes() if n.get("Alive")] + self.extra


def _wait(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _settled_free_cpus(ray, timeout: float = 15.0) -> float:
    """The free CPUs once the figure stops changing (an earlier test's workers may still be releasing theirs)."""
    deadline = time.monotonic() + timeout
    last = ray.available_resources().get("CPU", 0)
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = ray.available_resources().get("CPU", 0)
        if now == last:
            break
        last = now
    return float(last)


def _fill_the_node(ray) -> tuple[list, float]:
    """Reserve every free CPU of the session's node with placement groups; returns them and the CPUs reserved.

    The session's Ray has 8 CPUs and the shared cluster holds 1; what other tests take they give back, so some
    CPU is free. A CPU released meanwhile is reserved by a further group: the node ends full either way.
    """
    from ray.util.placement_group import placement_group, remove_placement_group

    pgs: list = []
    reserved = 0.0
    try:
        for _ in range(5):
            free = _settled_free_cpus(ray)
            if free == 0:
                break
            pg = placement_group([{"CPU": free}])
            pgs.append(pg)
            ray.get(pg.ready(), timeout=30)
            reserved += free
        else:
            raise AssertionError(f"CPUs keep coming free on the session's Ray: {ray.available_resources()}")
        assert reserved > 0, f"no CPU free on the session's Ray: {ray.available_resources()}"
    except BaseException:
        for pg in pgs:
            remove_placement_group(pg)
        raise
    return pgs, reserved


# -- 1. a node whose sampler cannot start ---------------------------------------------------------------------------
def test_a_node_gone_from_ray_does_not_stop_the_healthy_ones(ray_session) -> None:
    """ray.nodes() said Alive, but the node is gone when the actor is placed: Ray rejects the actor at once."""
    ray = ray_session
    ghost = os.urandom(28).hex()  # a well-formed node id no node has
    cluster = RayNodes(ray, [{"NodeID": ghost, "Alive": True, "NodeManagerAddress": "10.255.0.9"}])
    # node_timeout: the real node's sampler may take long to start on a loaded machine (CI once took over 5 s);
    # the ghost is rejected at once whatever it is
    mon = Monitor(cluster, nvml=None, interval=0.2, pull_interval=0.2, node_timeout=60, retry_s=0.3)
    try:
        mon.start()  # raised ActorUnschedulableError before: no monitor at all
        assert mon._failed[ghost].attempts == 1 and mon._failed[ghost].delay == pytest.approx(0.3)
        real = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
        assert mon.nodes == real  # the healthy node is registered and sampled
        assert ghost in mon.failed_nodes and "schedulable" in mon.failed_nodes[ghost]
        assert _wait(lambda: mon.aggregator.rows_in >= 3)
        html = mon.snapshot_html()
        assert ghost[:12] in html and "down" in html
        prom = mon.prometheus_text()  # a scraper sees the node down too, not missing
        assert f'gpu_notebook_node_up{{node="{ghost}"}} 0' in prom
        assert f'gpu_notebook_node_up{{node="{real[0]}"}} 1' in prom
        # retried later with a growing delay, never blocking the pull thread
        first = mon._failed[ghost]
        assert _wait(lambda: mon._failed[ghost].attempts > first.attempts, 15)
        assert mon._failed[ghost].delay == 2 * first.delay
        rows = mon.aggregator.rows_in
        assert _wait(lambda: mon.aggregator.rows_in > rows + 2, 10)
    finally:
        mon.stop()


def test_a_sampler_that_stays_pending_times_out_and_is_retried(ray_session) -> None:
    """A full node (no CPU left for the sampler): start() returns after node_timeout, the node shows down with
    the reason, and once the node has room the retry registers it from the pull thread."""
    ray = ray_session
    from ray.util.placement_group import remove_placement_group

    pgs, reserved = _fill_the_node(ray)
    sampler_cpus = min(0.5, reserved)  # fits once the reservations are gone
    node = [n["NodeID"] for n in ray.nodes() if n.get("Alive")][0]
    mon = Monitor(
        RayNodes(ray),
        nvml=None,
        interval=0.2,
        pull_interval=0.2,
        sampler_cpus=sampler_cpus,
        node_timeout=2,
        retry_s=0.3,
    )
    try:
        t0 = time.monotonic()
        mon.start()  # waited 120 s, then raised GetTimeoutError
        assert time.monotonic() - t0 < 10
        assert mon.nodes == [] and "did not start within" in mon.failed_nodes[node]
        for pg in pgs:
            remove_placement_group(pg)
        pgs = []
        assert _wait(lambda: mon.nodes == [node], 60), mon.failed_nodes
        assert node not in mon.failed_nodes
        assert _wait(lambda: mon.aggregator.rows_in >= 2)
    finally:
        mon.stop()
        for pg in pgs:
            remove_placement_group(pg)


# -- 2. nodes added while a dashboard renders -----------------------------------------------------------------------
class _Named(LocalHandle):
    """One in-process sampler registered under many node names (a cheap way to add many nodes)."""

    def __init__(self, sampler: NodeSampler, name: str) -> None:
        super().__init__(sampler)
        self.node_id = name

    def info(self):
        return {**self.sampler.info(), "node": self.node_id}


def test_adding_nodes_while_the_widget_renders(ray_session) -> None:
    pytest.importorskip("ipywidgets")
    pytest.importorskip("plotly")
    s = NodeSampler("n", nvml=FakeNVML(1), host=False, history_s=2, interval=1)
    s.tick(now=1.0)
    mon = Monitor(samplers=[_Named(s, "n0")], autopull=False, history_s=2).start()
    w = mon.widget(autostart=False)
    errors: list[BaseException] = []
    done = threading.Event()

    def add() -> None:
        try:
            for i in range(1, 3000):
                mon.aggregator.add(_Named(s, f"n{i}"))
        finally:
            done.set()

    def render() -> None:
        try:
            while not done.is_set():
                w._plan()
                w._header_html()
                w._data_version()
                _ = mon.gpu_count
                mon.slow()
                repr(mon)
                repr(mon.aggregator)
                mon.aggregator.gpu_list()
        # "dictionary changed size during iteration", or anything else: the test thread reports it
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=add), threading.Thread(target=render)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(old)
        w.close()
        mon.stop()
    assert errors == []
    assert len(mon.nodes) == 3000


# -- 3. a sampler restarted with other GPUs -------------------------------------------------------------------------
def test_a_sampler_restarted_with_fewer_gpus_comes_back_with_the_new_columns() -> None:
    old = NodeSampler("node-a", nvml=FakeNVML.from_specs([{"util": 10}, {"util": 20}]), host=False)
    handle = LocalHandle(old)
    agg = Aggregator([handle])
    old.tick(now=100.0)
    old.tick(now=101.0)
    assert agg.pull() == 2 and len(agg.gpu_series("util_gpu", 0)) == 2
    # the actor restarts (max_restarts): same node, new epoch, and one GPU fewer (it fell off the bus)
    new = NodeSampler("node-a", nvml=FakeNVML.from_specs([{"util": 55}]), host=False)
    handle.sampler = new
    new.tick(now=102.0)
    new.tick(now=103.0)
    for _ in range(3):
        agg.pull()
    st = agg.nodes["node-a"]
    assert st.up and st.errors == 0  # was: down for good, every pull a shape error
    series = agg.gpu_series("util_gpu", 0)
    assert [(s["index"], list(s["t"]), list(s["y"])) for s in series] == [(0, [102.0, 103.0], [55.0, 55.0])]
    assert [g["util_gpu"] for g in agg.latest()["gpus"]] == [55.0]
    new.tick(now=104.0)
    assert agg.pull() == 1


def test_a_cluster_monitor_started_again_after_stop_samples_again(ray_session) -> None:
    """stop() ends the sampler actors; start() must give every node a new one (it kept the dead handles)."""
    ray = ray_session
    mon = Monitor(RayNodes(ray), nvml=None, interval=0.2, pull_interval=0.2, node_timeout=20)
    try:
        mon.start()
        assert _wait(lambda: mon.aggregator.rows_in >= 2)
        mon.stop()
        mon.start()
        rows = mon.aggregator.rows_in
        assert _wait(lambda: mon.aggregator.rows_in >= rows + 3, 20), "no rows after the restart"
        assert not mon.failed_nodes
        assert all(s.up for _, s in mon.aggregator.states())
    finally:
        mon.stop()
