"""A cost view's refresh thread ends when its cluster stops, and every live view can be found and stopped
without the list of the magics that made them (``%reload_ext gpu_notebook`` makes new magics with empty lists;
the earlier view's thread kept refreshing, after the cluster had stopped too)."""

from __future__ import annotations

import time

import pytest

from gpu_notebook.catalog import Catalog
from gpu_notebook.cost import CostMeter, cost_meter_for
from gpu_notebook.widgets import CostWidget, live_views, stop_live_views

G5 = ("aws", "g5.xlarge", "us-east-1", "on_demand")


def test_every_live_view_is_found_and_stopped_without_a_list_of_them() -> None:
    meter = CostMeter(node_pricing={"a": G5}, catalog=Catalog.shipped())
    meter.sync_nodes(["a"])
    w = CostWidget(meter, interval=0.2)  # nobody keeps it: as after a reload of the magics
    assert w.live and w in live_views(CostWidget)
    assert stop_live_views(CostWidget) >= 1
    assert not w.live and w not in live_views()


@pytest.mark.timeout(90)
def test_a_cost_view_ends_when_its_cluster_stops(ray_session) -> None:
    from gpu_notebook import Cluster

    c = Cluster(name="cost-view-end", workers=1, cpus_per_worker=0.25).start()
    try:
        w = CostWidget(cost_meter_for(c), interval=0.2)
        assert w.live
    finally:
        c.stop()
    deadline = time.monotonic() + 15
    while w.live and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not w.live and w not in live_views()
