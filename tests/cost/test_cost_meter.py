"""Tests of the cost meter with simulated clocks: per-node per-second accrual, markets, local $0, repricing."""

from __future__ import annotations

import pytest

from gpu_notebook.catalog import Catalog
from gpu_notebook.cost import LOCAL_PRICE, CostMeter, cost_meter_for, resolve_price


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def cat() -> Catalog:
    return Catalog.shipped()


def test_accrues_per_node_from_join_to_leave(cat: Catalog) -> None:
    clock = Clock()
    t0 = clock.t
    spec = {
        "a": ("aws", "p4d.24xlarge", "us-east-1", "on_demand"),
        "b": ("aws", "g5.xlarge", "us-east-1", "spot"),
    }
    m = CostMeter(node_pricing=spec, clock=clock, catalog=cat)
    od = cat.get("aws", "p4d.24xlarge").price("us-east-1")
    g5_spot = cat.get("aws", "g5.xlarge").price("us-east-1", "spot")
    m.node_joined("a")
    clock.t += 1800
    m.node_joined("b")
    assert m.usd_per_hour() == pytest.approx(od + g5_spot)
    clock.t += 1800
    assert m.spent() == pytest.approx(od * 1.0 + g5_spot * 0.5)
    m.node_left("a")
    clock.t += 3600
    s = m.snapshot()
    assert s.spent_usd == pytest.approx(od + g5_spot * 1.5)
    assert s.usd_per_hour == pytest.approx(g5_spot) == s.projected_next_hour_usd
    assert s.nodes_running == 1 and s.node_hours == pytest.approx(2.5)
    assert not s.is_local and "estimate" in s.estimate_label and "2025-05" in s.estimate_label
    # the same node-hours in every market
    g5 = cat.get("aws", "g5.xlarge")
    assert s.by_market["on_demand"] == pytest.approx(od + g5.price("us-east-1") * 1.5)
    assert s.by_market["spot"] == pytest.approx(
        cat.get("aws", "p4d.24xlarge").price("us-east-1", "spot") + g5_spot * 1.5
    )
    assert s.by_market["reserved_1y"] < s.by_market["on_demand"]
    # per-second: one more second adds rate/3600
    assert m.spent(at=clock.t + 1) - m.spent(at=clock.t) == pytest.approx(g5_spot / 3600)
    assert m.spent(at=t0) == 0.0


def test_rejoin_and_sync_nodes(cat: Catalog) -> None:
    clock = Clock()
    m = CostMeter(
        node_pricing=lambda nid: ("gcp", "g2-standard-4", "us-central1", "on_demand"),
        clock=clock,
        catalog=cat,
    )
    rate = cat.get("gcp", "g2-standard-4").price("us-central1")
    m.sync_nodes(["x", "y"])
    clock.t += 3600
    m.sync_nodes(["y"])  # x left (e.g. spot preemption)
    clock.t += 3600
    m.sync_nodes(["x", "y"])  # x back: a new interval, the gap is not billed
    clock.t += 3600
    assert m.node_hours() == pytest.approx(5.0)
    assert m.spent() == pytest.approx(5 * rate)
    m.stop_all()
    clock.t += 3600
    assert m.spent() == pytest.approx(5 * rate) and m.usd_per_hour() == 0.0


def test_local_cluster_costs_zero_and_says_so() -> None:
    clock = Clock()
    m = CostMeter(clock=clock)
    m.sync_nodes(["node-1"])
    clock.t += 7200
    s = m.snapshot()
    assert s.spent_usd == 0.0 and s.usd_per_hour == 0.0 and s.is_local
    assert "local cluster: $0" in str(s)
    assert "local cluster: $0" in s._repr_html_()
    assert "local $0" in repr(m)
    assert s.nodes[0]["label"].startswith("local")


def test_overrides_and_reprice(cat: Catalog) -> None:
    clock = Clock()
    m = CostMeter(clock=clock, catalog=cat)
    m.node_joined("n", price=("azure", "Standard_NC24ads_A100_v4", "eastus", "on_demand"))
    base = cat.get("azure", "Standard_NC24ads_A100_v4").price("eastus")
    clock.t += 3600
    cat.override("azure", "Standard_NC24ads_A100_v4", usd_per_hour=1.0)
    m.reprice()  # the negotiated price applies from now on, not retroactively
    clock.t += 3600
    assert m.spent() == pytest.approx(base + 1.0)
    assert m.usd_per_hour() == 1.0


def test_resolve_price_local_and_errors(cat: Catalog) -> None:
    assert resolve_price(None) is LOCAL_PRICE and resolve_price("local") is LOCAL_PRICE
    p = resolve_price(("aws", "p5.48xlarge", "us-east-2", "spot"), cat)
    assert p.usd_per_hour == cat.get("aws", "p5.48xlarge").price("us-east-2", "spot")
    assert set(p.alternatives) == {"on_demand", "spot", "reserved_1y"} and p.date == "2025-05"
    with pytest.raises(LookupError, match="regions with prices"):
        resolve_price(("aws", "p5.48xlarge", "eu-west-1", "spot"), cat)


def test_history_is_capped(cat: Catalog) -> None:
    clock = Clock()
    m = CostMeter(
        node_pricing={"n": ("aws", "g4dn.xlarge", "us-east-1", "on_demand")}, clock=clock, catalog=cat
    )
    m.node_joined("n")
    for _ in range(2500):
        clock.t += 1
        m.snapshot()
    h = m.history
    assert 1000 <= len(h) <= 2000
    assert h[-1][0] == clock.t and h[-1][1] == pytest.approx(2500 / 3600 * 0.526)


class _FakeCluster:
    """Attributes of gpu_notebook.Cluster the meter reads (the real one is tested in test_cost_policies)."""

    def __init__(self, nodes: list[str], t: float) -> None:
        self.nodes = nodes
        self.state = "running"
        self.started_at = t
        self.options: dict = {}
        self.hooks: list = []

    def ray_nodes(self) -> list[dict]:
        return [{"NodeID": n, "Alive": True} for n in self.nodes]

    def add_stop_hook(self, fn) -> None:
        self.hooks.append(fn)

    def stop(self, reason: str = "") -> str:
        for h in self.hooks:
            h(reason)
        self.state = "stopped"
        return "stopped"


def test_cost_meter_for_polls_cluster_and_stops_with_it(cat: Catalog) -> None:
    clock = Clock()
    c = _FakeCluster(["h", "w"], t=clock.t - 600)
    c.options["node_pricing"] = {
        "h": ("aws", "g5.xlarge", "us-east-1", "on_demand"),
        "w": ("aws", "g5.xlarge", "us-east-1", "on_demand"),
    }
    m = cost_meter_for(c, clock=clock, catalog=cat)
    assert cost_meter_for(c) is m
    assert m.spent() == pytest.approx(2 * 1.006 * 600 / 3600)  # accrued from the cluster's start
    c.nodes = ["h"]
    m.poll()
    clock.t += 3600
    assert m.usd_per_hour() == pytest.approx(1.006)
    c.stop()
    spent = m.spent()
    clock.t += 3600
    assert m.spent() == spent
    m.poll()
    assert m.usd_per_hour() == 0.0


def test_head_nodes_outside_the_gpu_catalog(cat: Catalog) -> None:
    clock = Clock()
    spec = {
        "head": ("aws", "m5.xlarge", "us-east-1", "on_demand", 0.192),  # the cloud layer's own head price
        "gpu": ("aws", "g5.xlarge", "us-east-1", "spot"),
        "odd": ("aws", "x9.mystery", "us-east-1", "on_demand"),  # unknown: $0 and said so
        "mine": 2.5,  # a user price, USD/h
    }
    m = CostMeter(node_pricing=spec, clock=clock, catalog=cat)
    m.sync_nodes(spec)
    clock.t += 3600
    s = m.snapshot()
    g5_spot = cat.get("aws", "g5.xlarge").price("us-east-1", "spot")
    assert s.spent_usd == pytest.approx(0.192 + g5_spot + 2.5)
    assert "excludes 1 node(s) with no known price (x9.mystery)" in s.estimate_label
    assert any("price unknown, counted as $0" in n["label"] for n in s.nodes)
    assert s.by_market["on_demand"] == pytest.approx(0.192 + 1.006 + 2.5)
    with pytest.raises(ValueError):
        resolve_price("p4d", cat)
