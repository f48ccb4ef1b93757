"""Samplers as real Ray actors on the session's local Ray cluster (fake NVML inside the actors)."""

from __future__ import annotations

import functools
import time

import pytest
from _poll import wait_for

from gpu_notebook.monitor import Monitor, sampler_actor_class, utilisation_summary
from gpu_notebook.testing.nvml import FakeNVML


class RayNodes:
    """The smallest thing Monitor needs from a Cluster: ``ray_nodes()`` (and optionally stop hooks)."""

    def __init__(self, ray) -> None:
        self.ray = ray
        self.hooks = []

    def ray_nodes(self):
        return [n for n in self.ray.nodes() if n.get("Alive")]

    def add_stop_hook(self, fn) -> None:
        self.hooks.append(fn)


# a factory that pickles by reference to the library (test-module functions are not importable in workers)
two_busy_gpus = functools.partial(FakeNVML.from_specs, [{"util": 80}, {"util": 30}])


def _wait_rows(mon: Monitor, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while mon.aggregator.rows_in < n and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mon.aggregator.rows_in >= n


def test_one_sampler_actor_per_node_with_node_affinity(ray_session) -> None:
    ray = ray_session
    cluster = RayNodes(ray)
    cpu_before = ray.available_resources().get("CPU", 0)
    mon = Monitor(cluster, nvml=two_busy_gpus, interval=0.1, pull_interval=0.2).start()
    try:
        node_ids = [n["NodeID"] for n in cluster.ray_nodes()]
        assert mon.nodes == node_ids
        handle = mon.aggregator.handles[node_ids[0]]
        # the actor really runs on that node and reserves no CPU and no GPU (it must start on a full node)
        assert ray.get(handle.actor.ping.remote()) == node_ids[0]
        assert ray.available_resources().get("CPU", 0) == cpu_before
        assert ray.available_resources().get("GPU", 0) == ray.cluster_resources().get("GPU", 0)
        _wait_rows(mon, 5)
        assert [g["util_gpu"] for g in mon.latest()["gpus"]] == [80, 30]
        assert mon.sync_nodes() == []  # nothing new to place
        summ = utilisation_summary(mon, 60)[node_ids[0]]
        assert summ["gpus"] == {0: pytest.approx(80), 1: pytest.approx(30)}
        assert len(cluster.hooks) == 1
        cluster.hooks[0]("budget reached")  # the cluster stopping stops the monitor
        assert not mon.started
    finally:
        mon.stop()
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < cpu_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ray.available_resources().get("CPU", 0) == pytest.approx(cpu_before)


def test_many_fake_nodes_as_actors_and_a_lost_node(ray_session) -> None:
    ray = ray_session
    cls = sampler_actor_class()
    actors = [
        cls.remote(node_id=f"fake-{i}", nvml=functools.partial(FakeNVML, 2), interval=0.1) for i in range(3)
    ]
    mon = Monitor(samplers=actors, pull_interval=0.2).start()
    try:
        _wait_rows(mon, 9)
        assert sorted(mon.nodes) == ["fake-0", "fake-1", "fake-2"] and mon.gpu_count == 6
        seq_before = mon.aggregator.nodes["fake-2"].seq
        ray.kill(actors[1], no_restart=True)
        deadline = time.monotonic() + 30
        while mon.aggregator.nodes["fake-1"].up and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mon.aggregator.nodes["fake-1"].up is False
        # the others keep going
        wait_for(lambda: mon.aggregator.nodes["fake-2"].seq > seq_before, what="fake-2's next rows")
        text = mon.prometheus_text()
        assert (
            'gpu_notebook_node_up{node="fake-1"} 0' in text
            and 'gpu_notebook_node_up{node="fake-0"} 1' in text
        )
    finally:
        mon.stop()


def test_monitor_for_the_current_cluster_and_its_stop_hook(ray_session) -> None:
    cluster_mod = pytest.importorskip("gpu_notebook.cluster")
    from gpu_notebook.monitor import monitor_for

    c = cluster_mod.Cluster(name="monitor-test", workers=1, cpus_per_worker=0.5).start()
    try:
        mon = monitor_for(interval=0.2)
        assert mon.kind == "cluster" and mon.cluster is c
        assert mon.nodes == [n["NodeID"] for n in c.ray_nodes()]
        assert monitor_for() is mon  # reused, not a second set of samplers
        _wait_rows(mon, 2)
        assert mon.latest()["hosts"][0]["mem_total_mib"] > 0
    finally:
        c.stop()
    assert not mon.started  # the cluster's stop hook stopped the monitor
