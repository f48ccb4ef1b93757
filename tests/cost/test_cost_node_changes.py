"""The cost shown by ``%gpu_cost`` and the cost widget follows nodes that leave or join, without policies."""

from __future__ import annotations

import pytest

from gpu_notebook.cost import cost_meter_for

pytest.importorskip("plotly")


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeCluster:
    """What the meter reads of a cluster: its state, its alive Ray nodes and its per-node prices."""

    def __init__(self, clock: Clock) -> None:
        self.state = "running"
        self.started_at = clock.t
        self.nodes = ["a", "b"]
        self.options = {"node_pricing": {"a": 3.0, "b": 3.0, "c": 3.0}}
        self.name = "fake"

    def ray_nodes(self) -> list[dict]:
        return [{"NodeID": n, "Alive": True} for n in self.nodes]


def test_widget_stops_charging_for_a_node_that_left() -> None:
    from gpu_notebook.widgets import CostWidget

    clock = Clock()
    cluster = FakeCluster(clock)
    meter = cost_meter_for(cluster, clock=clock)
    w = CostWidget(meter, autostart=False)
    assert "$6.00/h" in w.header.value
    clock.t += 3600
    cluster.nodes = ["a"]  # node b was preempted / scaled down
    w.refresh(force=True)
    clock.t += 3600
    w.refresh(force=True)
    assert "$3.00/h" in w.header.value and "on 1 node(s)" in w.header.value
    assert meter.spent() == pytest.approx(6.0 + 3.0)  # not 12: b stopped costing when it left
    # a price given as a number has no catalog date: no dangling "as of )"
    assert "as of )" not in w.header.value and "(user price); not a bill" in w.header.value
    assert w.fig.layout.title.text == "$9.00 so far (estimate)"
    w.stop()


def test_magic_status_sees_the_current_nodes(ip, fresh_manager) -> None:
    from IPython.utils.capture import capture_output

    clock = Clock()
    cluster = FakeCluster(clock)
    meter = cost_meter_for(cluster, clock=clock)

    # this kernel's clusters: only the fake one
    fresh_manager.add(cluster)
    clock.t += 1800
    cluster.nodes = ["a", "b", "c"]  # the autoscaler added a node
    with capture_output() as cap:
        ip.run_line_magic("gpu_cost", "status")
    assert "$9.00/h on 3 node(s)" in cap.stdout
    cluster.state = "stopped"
    with capture_output() as cap:
        ip.run_line_magic("gpu_cost", "status")
    assert "$0.00/h on 0 node(s)" in cap.stdout
    assert meter.spent() == pytest.approx(3.0)
