"""Cloud nodes priced from what was launched: the cost meter's ``node_pricing`` for a saved cluster state."""

from __future__ import annotations

import pytest

from gpu_notebook.catalog import Catalog
from gpu_notebook.cloud import ClusterSpec, ClusterState, node_pricing_for
from gpu_notebook.cost import BudgetPolicy, CostMeter


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


HEAD = {"NodeID": "head-1", "Alive": True, "Resources": {"CPU": 4.0, "node:__internal_head__": 1.0}}
WORKER = {"NodeID": "worker-1", "Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0}}


def _state(**spec_kw) -> ClusterState:
    spec = ClusterSpec(
        **{"cloud": "aws", "region": "us-east-1", "gpu": "T4:1", "workers": 1, "name": "gnb-p", **spec_kw}
    )
    return ClusterState(name=str(spec.name), cloud=spec.cloud, region=spec.region, spec=spec.to_dict())


def test_head_and_workers_are_priced_from_the_launched_instances() -> None:
    cat = Catalog.shipped()
    seen: list[int] = []

    def nodes() -> list[dict]:
        seen.append(1)
        return [HEAD, WORKER]

    pricing = node_pricing_for(_state(spot=True), nodes=nodes, catalog=cat)
    assert pricing("head-1")[:4] == ("aws", "m5.xlarge", "us-east-1", "on_demand")
    assert pricing("worker-1")[:4] == ("aws", "g4dn.xlarge", "us-east-1", "spot")
    assert pricing("unknown-node")[:4] == ("aws", "g4dn.xlarge", "us-east-1", "spot")  # the dearer guess
    assert "head m5.xlarge on-demand, workers g4dn.xlarge spot" in repr(pricing)

    clock = Clock()
    meter = CostMeter(node_pricing=pricing, clock=clock, catalog=cat)
    meter.sync_nodes(["head-1", "worker-1"])
    g4dn = cat.get("aws", "g4dn.xlarge")
    head_rate = 0.192  # m5.xlarge: not in the GPU catalog, its list price comes with the plan
    assert meter.usd_per_hour() == pytest.approx(head_rate + g4dn.price("us-east-1", "spot"))
    clock.t += 3600
    snap = meter.snapshot()
    assert snap.spent_usd == pytest.approx(head_rate + g4dn.price("us-east-1", "spot"))
    assert not snap.is_local and snap.unknown_prices == []
    labels = sorted(n["label"] for n in snap.nodes)
    assert labels == ["aws g4dn.xlarge us-east-1 spot", "aws m5.xlarge us-east-1 on-demand"]
    assert len(seen) <= 2  # Ray's node list is read when an unknown node shows up, not on every lookup


def test_on_demand_and_an_exact_instance_type() -> None:
    cat = Catalog.shipped()
    pricing = node_pricing_for(
        _state(gpu=None, instance_type="p4d.24xlarge", spot=False), nodes=lambda: [WORKER], catalog=cat
    )
    meter = CostMeter(node_pricing=pricing, clock=Clock(), catalog=cat)
    meter.node_joined("worker-1")
    assert meter.usd_per_hour() == pytest.approx(cat.get("aws", "p4d.24xlarge").price("us-east-1"))


def test_kubernetes_pods_are_counted_as_unknown_and_the_budget_says_so() -> None:
    state = _state(cloud="kubernetes", namespace="ml", region=None)
    pricing = node_pricing_for(state, nodes=lambda: [HEAD, WORKER])
    clock = Clock()
    meter = CostMeter(node_pricing=pricing, clock=clock)
    meter.sync_nodes(["head-1", "worker-1"])
    clock.t += 3600
    snap = meter.snapshot()
    assert not snap.is_local and snap.spent_usd == 0.0
    assert snap.unknown_prices == ["head pod", "pod:T4x1"] and "no known price" in snap.estimate_label
    pol = BudgetPolicy(5.0, meter, notify=lambda m: None)
    pol.check(clock())
    assert "not counted: nodes with no known price" in pol.message


def test_ray_unreachable_prices_as_a_worker() -> None:
    def broken() -> list[dict]:
        raise ConnectionError("Ray is restarting")

    pricing = node_pricing_for(_state(), nodes=broken)
    assert pricing("head-1")[1] == "g4dn.xlarge"


def test_a_spot_clusters_on_demand_fallback_workers_are_priced_on_demand() -> None:
    """Ray's autoscaler starts on-demand workers when spot capacity is short: they cost the on-demand price."""
    from gpu_notebook.cloud._pricing import MARKET_OF_RESOURCE
    from gpu_notebook.cloud._render import (
        MARKET_RESOURCE,
        WORKER_ONDEMAND_TYPE,
        WORKER_SPOT_TYPE,
        render_ray_config,
    )
    from gpu_notebook.cloud._spec import resolve

    assert {v: k for k, v in MARKET_RESOURCE.items()} == MARKET_OF_RESOURCE
    cat = Catalog.shipped()
    state = _state(spot=True, workers=2)
    # the rendered config gives each worker type the resource that names its market
    types = render_ray_config(ClusterSpec(**state.spec), resolve(ClusterSpec(**state.spec), cat))[
        "available_node_types"
    ]
    spot_res = types[WORKER_SPOT_TYPE]["resources"]
    od_res = types[WORKER_ONDEMAND_TYPE]["resources"]
    assert spot_res.get(MARKET_RESOURCE["spot"]) == 1 and MARKET_RESOURCE["on_demand"] not in spot_res
    assert od_res.get(MARKET_RESOURCE["on_demand"]) == 1 and MARKET_RESOURCE["spot"] not in od_res

    spot_worker = {"NodeID": "w-spot", "Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0, **spot_res}}
    od_worker = {"NodeID": "w-od", "Alive": True, "Resources": {"CPU": 4.0, "GPU": 1.0, **od_res}}
    pricing = node_pricing_for(state, nodes=lambda: [HEAD, spot_worker, od_worker], catalog=cat)
    assert pricing("w-spot")[:4] == ("aws", "g4dn.xlarge", "us-east-1", "spot")
    assert pricing("w-od")[:4] == ("aws", "g4dn.xlarge", "us-east-1", "on_demand")
    g4dn = cat.get("aws", "g4dn.xlarge")
    assert pricing("w-od")[4] == pytest.approx(g4dn.price("us-east-1"))  # the fallback price is on demand too

    clock = Clock()
    meter = CostMeter(node_pricing=pricing, clock=clock, catalog=cat)
    meter.sync_nodes(["head-1", "w-spot", "w-od"])
    expected = 0.192 + g4dn.price("us-east-1", "spot") + g4dn.price("us-east-1")
    assert g4dn.price("us-east-1", "spot") < g4dn.price("us-east-1")
    assert meter.usd_per_hour() == pytest.approx(expected)
    labels = sorted(n["label"] for n in meter.snapshot().nodes)
    assert "aws g4dn.xlarge us-east-1 on-demand" in labels and "aws g4dn.xlarge us-east-1 spot" in labels


def test_an_on_demand_clusters_workers_and_old_workers_without_the_resource() -> None:
    cat = Catalog.shipped()
    g4dn = cat.get("aws", "g4dn.xlarge")
    od = node_pricing_for(_state(spot=False), nodes=lambda: [HEAD, WORKER], catalog=cat)
    assert od("worker-1")[3:] == ("on_demand", pytest.approx(g4dn.price("us-east-1")))
    spot = node_pricing_for(_state(spot=True), nodes=lambda: [HEAD, WORKER], catalog=cat)
    assert spot("worker-1")[3] == "spot"  # no market resource (an older launch): the market asked for
