"""What each node of a launched cloud cluster costs: the cost meter's ``node_pricing`` for a saved cluster.

``Cluster.start`` sets ``cluster.node_pricing = node_pricing_for(state, nodes=...)`` after a launch,
so :class:`gpu_notebook.cost.CostMeter` (and with it ``--budget`` and ``%gpu_cost``) prices every Ray node of the
cluster from what was launched: the head at its instance type on demand, each worker at the worker instance
type in the market it was launched in, in the cluster's region, from the catalog
(:mod:`gpu_notebook.catalog`, overrides included). Kubernetes pods have no catalog price: they are counted as
unknown, and the cost view says so.

The market of a worker is read from the custom resource the rendered cluster config gives every worker type
(``gpu_notebook_spot`` / ``gpu_notebook_on_demand``, :data:`~gpu_notebook.cloud._render.MARKET_RESOURCE`): with
``--spot`` and the on-demand fallback, a worker Ray's autoscaler had to start on demand is priced on demand. A
worker without the resource (a cluster launched by an older version) is priced in the market asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ._render import MARKET_RESOURCE
from ._spec import ClusterSpec, resolve

#: The resource Ray gives the head node only.
HEAD_RESOURCE = "node:__internal_head__"
#: The custom resources that tell a worker's market: ``_render.MARKET_RESOURCE`` read backwards.
MARKET_OF_RESOURCE = {resource: market for market, resource in MARKET_RESOURCE.items()}

PriceSpec = tuple[str, str, str, str, "float | None"]


class CloudNodePricing:
    """``node_id -> (cloud, instance_type, region, market, fallback USD/h)`` for one launched cluster.

    Parameters
    ----------
    cloud, region
        Where the cluster runs (Kubernetes: the namespace stands in for the region).
    head, worker
        ``(instance_type, fallback USD/hour or None)``: the fallback is used when the catalog lacks the type
        (the default CPU heads are not in the GPU catalog).
    worker_market
        ``"on_demand"`` or ``"spot"``: the market asked for.
    nodes
        Returns Ray's node entries (``ray.nodes()``-like: ``NodeID``, ``Resources``), used to tell the head
        (``node:__internal_head__``) from workers, and each worker's market (``gpu_notebook_spot`` /
        ``gpu_notebook_on_demand``). A node it cannot find is priced as a worker in the market asked for.
    worker_on_demand_usd
        The worker type's on-demand USD/hour, the fallback price of a spot cluster's on-demand workers.
    """

    def __init__(
        self,
        cloud: str,
        region: str,
        head: tuple[str, float | None],
        worker: tuple[str, float | None],
        worker_market: str = "on_demand",
        nodes: Callable[[], list[dict[str, Any]]] | None = None,
        worker_on_demand_usd: float | None = None,
    ) -> None:
        self.cloud = cloud
        self.region = region
        self.head = head
        self.worker = worker
        self.worker_market = worker_market
        self.nodes = nodes
        self.worker_on_demand_usd = worker_on_demand_usd if worker_market == "spot" else worker[1]
        self._is_head: dict[str, bool] = {}
        self._market: dict[str, str] = {}
        self._lock = threading.Lock()

    def head_spec(self) -> PriceSpec:
        return (self.cloud, self.head[0], self.region, "on_demand", self.head[1])

    def worker_spec(self, market: str | None = None) -> PriceSpec:
        """A worker's price spec in ``market`` (default: the market asked for)."""
        market = market or self.worker_market
        if market == self.worker_market:
            return (self.cloud, self.worker[0], self.region, market, self.worker[1])
        fallback = self.worker_on_demand_usd if market == "on_demand" else None
        return (self.cloud, self.worker[0], self.region, market, fallback)

    def _learn(self) -> None:
        if self.nodes is None:
            return
        try:
            entries = self.nodes()
        except Exception:  # noqa: BLE001 - Ray unreachable for a moment: price as a worker for now
            return
        with self._lock:
            for n in entries:
                nid = str(n.get("NodeID", n.get("node_id", "")))
                if nid:
                    resources = n.get("Resources") or {}
                    self._is_head[nid] = HEAD_RESOURCE in resources
                    for name, market in MARKET_OF_RESOURCE.items():
                        if resources.get(name):
                            self._market[nid] = market

    def is_head(self, node_id: str) -> bool | None:
        """Whether ``node_id`` is the head (None: not known)."""
        with self._lock:
            known = self._is_head.get(node_id)
        if known is None:
            self._learn()
            with self._lock:
                known = self._is_head.get(node_id)
        return known

    def market(self, node_id: str) -> str | None:
        """The market a worker says it was launched in (None: not known; the market asked for applies)."""
        with self._lock:
            return self._market.get(node_id)

    def __call__(self, node_id: str) -> PriceSpec:
        return self.head_spec() if self.is_head(node_id) else self.worker_spec(self.market(node_id))

    def __repr__(self) -> str:
        return (
            f"CloudNodePricing({self.cloud} {self.region}: head {self.head[0]} on-demand, workers "
            f"{self.worker[0]} {self.worker_market.replace('_', '-')})"
        )


def node_pricing_for(
    state: Any, nodes: Callable[[], list[dict[str, Any]]] | None = None, catalog: Any = None
) -> CloudNodePricing:
    """The :class:`CloudNodePricing` of a launched cluster (a :class:`~gpu_notebook.cloud.ClusterState`)."""
    spec = ClusterSpec.from_dict(dict(state.spec))
    resolved = resolve(spec, catalog)
    w = resolved.worker
    market = "spot" if spec.spot else "on_demand"
    worker_price = w.spot_per_hour if spec.spot else w.on_demand_per_hour
    if resolved.head is not None:
        head: tuple[str, float | None] = (resolved.head.name, resolved.head.on_demand_per_hour)
    else:  # Kubernetes: a head pod, no catalog price
        head = ("head pod", None)
    region = spec.region or spec.namespace
    return CloudNodePricing(
        spec.cloud,
        str(region),
        head,
        (w.name, worker_price),
        market,
        nodes,
        worker_on_demand_usd=w.on_demand_per_hour,
    )
