"""The cost meter: accrues the estimated cost of a cluster per node per second, from join to leave.

Each node has a price (``cloud, instance_type, region, market`` looked up in the catalog, or ``local`` at $0).
The meter keeps one interval per node and price; the cost so far is the sum of ``hours x USD/hour`` over the
intervals (per-second billing, piecewise-constant prices). It also says what the same node-hours would have
cost on-demand, on spot and with a 1-year reservation. Everything is a list-price estimate and says so.
"""

from __future__ import annotations

import html
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from gpu_notebook import _registry
from gpu_notebook.catalog import get_catalog, normalize_market

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.catalog import Catalog

LOCAL = "local"
MARKETS = ("on_demand", "spot", "reserved_1y")

#: ``node_id -> (cloud, instance_type, region, market[, usd_per_hour])``, a number (USD/h), a NodePrice, or
#: ``None``/``"local"`` for a $0 local node (see :func:`resolve_price`).
NodeSpec = tuple[str, str, str, str]
NodePricing = Callable[[str], "NodeSpec | str | None"] | Mapping[str, "NodeSpec | str | None"]


@dataclass(frozen=True)
class NodePrice:
    """What one node costs per hour, and what it would cost in each market."""

    cloud: str  # "local" for own hardware
    instance_type: str
    region: str
    market: str
    usd_per_hour: float
    alternatives: dict[str, float] = field(default_factory=dict)  # market -> USD/hour (same instance, region)
    source: str = ""
    date: str = ""

    @property
    def is_local(self) -> bool:
        return self.cloud == LOCAL

    @property
    def known(self) -> bool:
        return not self.source.startswith("price unknown")

    @property
    def label(self) -> str:
        if self.is_local:
            return "local (own hardware, $0)"
        if not self.known:
            return f"{self.cloud} {self.instance_type}: price unknown, counted as $0"
        return f"{self.cloud} {self.instance_type} {self.region} {self.market.replace('_', '-')}"


LOCAL_PRICE = NodePrice(LOCAL, LOCAL, LOCAL, "on_demand", 0.0, {m: 0.0 for m in MARKETS}, "local cluster", "")


def resolve_price(spec: Any, catalog: Catalog | None = None) -> NodePrice:
    """Turn a node spec into a :class:`NodePrice` using the catalog (overrides apply).

    ``spec`` is ``None``/``"local"`` ($0), a :class:`NodePrice`, a number (USD/hour, every market),
    ``(cloud, instance_type, region, market)`` looked up in the catalog, or
    ``(cloud, instance_type, region, market, usd_per_hour)`` whose price is used when the catalog lacks the
    instance (e.g. a CPU head node). Raises :class:`LookupError` when the price cannot be found.
    """
    if spec is None or spec == LOCAL or (isinstance(spec, tuple) and spec and spec[0] == LOCAL):
        return LOCAL_PRICE
    if isinstance(spec, NodePrice):
        return spec
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        usd = float(spec)
        return NodePrice(
            "custom", "custom", "", "on_demand", usd, {m: usd for m in MARKETS}, "user price", ""
        )
    if isinstance(spec, str):
        raise ValueError(f"a node price is 'local' or (cloud, instance_type, region, market), not {spec!r}")
    cloud, instance_type, region, market = spec[:4]
    fallback = float(spec[4]) if len(spec) > 4 and spec[4] is not None else None
    cat = catalog if catalog is not None else get_catalog()
    market = normalize_market(market)
    try:
        it = cat.get(cloud, instance_type)
        usd = it.price(region, market)
    except LookupError:
        if fallback is None:
            raise
        return NodePrice(
            cloud,
            instance_type,
            region,
            market,
            fallback,
            {market: fallback},
            "price given by the caller (not in the GPU catalog)",
            "",
        )
    alts = {}
    for m in MARKETS:
        try:
            alts[m] = it.price(region, m)
        except LookupError:
            pass
    return NodePrice(it.cloud, it.name, region, market, usd, alts, it.source, it.date)


@dataclass
class Interval:
    """One node at one price from ``start`` to ``end`` (``None`` while it runs)."""

    node_id: str
    price: NodePrice
    start: float
    end: float | None = None

    def hours(self, now: float) -> float:
        end = now if self.end is None else min(self.end, now)
        return max(0.0, end - self.start) / 3600.0

    def cost(self, now: float, market: str | None = None) -> float:
        rate = (
            self.price.usd_per_hour
            if market is None
            else self.price.alternatives.get(market, self.price.usd_per_hour)
        )
        return self.hours(now) * rate


class NodeCost(TypedDict):
    """One node's line of a :class:`CostSnapshot`: its price now and what it cost so far."""

    node_id: str
    label: str  # the price's label (cloud, instance type, region, market)
    usd_per_hour: float  # while it runs (its last price once it left)
    hours: float
    spent_usd: float
    running: bool


@dataclass
class CostSnapshot:
    """The meter's numbers at one moment (what the widget and ``%gpu_cost`` show)."""

    at: float
    usd_per_hour: float
    spent_usd: float
    projected_next_hour_usd: float
    node_hours: float
    nodes_running: int
    by_market: dict[str, float]  # what the same node-hours would cost in each market
    nodes: list[NodeCost]
    is_local: bool
    source: str
    date: str
    budget_usd: float | None = None
    policies: list[dict[str, Any]] = field(default_factory=list)
    unknown_prices: list[str] = field(default_factory=list)

    @property
    def estimate_label(self) -> str:
        if self.is_local:
            return "local cluster: $0 (your own hardware; electricity not counted)"
        when = f", as of {self.date}" if self.date else ""  # a caller's own price has no catalog date
        text = f"estimate from list prices ({self.source}{when}); not a bill"
        if self.unknown_prices:
            text += f"; excludes {len(self.unknown_prices)} node(s) with no known price ({', '.join(self.unknown_prices)})"
        return text

    def lines(self) -> list[str]:
        out = [
            f"cost now  ${self.usd_per_hour:,.2f}/h on {self.nodes_running} node(s)   "
            f"so far ${self.spent_usd:,.2f}   next hour ~${self.projected_next_hour_usd:,.2f}"
        ]
        if self.budget_usd is not None:
            pct = 100.0 * self.spent_usd / self.budget_usd if self.budget_usd else 0.0
            out.append(f"budget    ${self.budget_usd:,.2f} ({pct:.0f}% used)")
        if not self.is_local:
            out.append(
                "same node-hours: "
                + ", ".join(f"{m.replace('_', '-')} ${v:,.2f}" for m, v in self.by_market.items())
            )
        for p in self.policies:
            if p.get("message"):
                out.append(f"{p['name']}: {p['message']}")
        out.append(self.estimate_label)
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return (
            f"CostSnapshot(${self.usd_per_hour:.2f}/h, spent ${self.spent_usd:.2f}, "
            f"{'local $0' if self.is_local else 'estimate'})"
        )

    def _repr_html_(self) -> str:
        return snapshot_html(self)


def snapshot_html(s: CostSnapshot) -> str:
    """A static HTML card of a snapshot (the saved-notebook fallback of the cost widget)."""
    e = html.escape
    rows = "".join(
        f"<tr><td>{e(n['node_id'][:12])}</td><td>{e(n['label'])}</td><td>${n['usd_per_hour']:,.2f}/h</td>"
        f"<td>{n['hours']:.2f} h</td><td>${n['spent_usd']:,.2f}</td></tr>"
        for n in s.nodes
    )
    budget = ""
    if s.budget_usd is not None:
        pct = min(100.0, 100.0 * s.spent_usd / s.budget_usd) if s.budget_usd else 100.0
        colour = "#c0392b" if pct >= 100 else "#e67e22" if pct >= 80 else "#27ae60"
        budget = (
            f"<div>budget ${s.budget_usd:,.2f}: <span style='display:inline-block;width:160px;height:10px;"
            f"background:#ddd'><span style='display:inline-block;width:{pct * 1.6:.0f}px;height:10px;"
            f"background:{colour}'></span></span> {pct:.0f}%</div>"
        )
    markets = (
        ""
        if s.is_local
        else "<div>same node-hours: "
        + ", ".join(f"{e(m.replace('_', '-'))} <b>${v:,.2f}</b>" for m, v in s.by_market.items())
        + "</div>"
    )
    pol = "".join(
        f"<div><b>{e(p['name'])}</b>: {e(p['message'])}</div>" for p in s.policies if p.get("message")
    )
    return (
        "<div class='gpu-notebook-cost' style='font-family:sans-serif;font-size:13px'>"
        f"<div><b>${s.usd_per_hour:,.2f}/h</b> now on {s.nodes_running} node(s) &middot; "
        f"<b>${s.spent_usd:,.2f}</b> so far &middot; next hour ~<b>${s.projected_next_hour_usd:,.2f}</b></div>"
        f"{budget}{markets}{pol}"
        + (
            f"<table><tr><th>node</th><th>price</th><th>rate</th><th>time</th><th>cost</th></tr>{rows}</table>"
            if rows
            else ""
        )
        + f"<div style='color:#777'><i>{e(s.estimate_label)}</i></div></div>"
    )


class CostMeter:
    """Accrues the estimated cost of a cluster's nodes, per node per second.

    Parameters
    ----------
    cluster
        A :class:`gpu_notebook.Cluster` (or anything with ``ray_nodes()``), used by :meth:`poll` to learn which
        nodes are up. Optional: nodes can be reported with :meth:`node_joined` / :meth:`node_left`.
    node_pricing
        ``node_id -> (cloud, instance_type, region, market)`` as a mapping or callable; ``None`` or ``"local"``
        means a $0 local node. Default: every node is local when the cluster is local (no ``address``),
        otherwise ``cluster.options["node_pricing"]`` if the cloud layer set it.
    clock
        Seconds since the epoch; inject a fake clock in tests.
    catalog
        Price catalog (default :func:`gpu_notebook.catalog.get_catalog`).

    Examples
    --------
    >>> m = CostMeter(node_pricing={"n1": ("aws", "p4d.24xlarge", "us-east-1", "spot")}, clock=lambda: 0.0)
    >>> m.node_joined("n1", at=0.0)                                        # doctest: +SKIP
    >>> m.snapshot(at=3600.0).spent_usd                                     # doctest: +SKIP
    """

    def __init__(
        self,
        cluster: Any = None,
        node_pricing: NodePricing | None = None,
        clock: Callable[[], float] = time.time,
        catalog: Catalog | None = None,
    ) -> None:
        self._cluster_ref = weakref.ref(cluster) if cluster is not None else None
        self.clock = clock
        self.catalog = catalog
        if node_pricing is None and cluster is not None:
            node_pricing = (getattr(cluster, "options", None) or {}).get("node_pricing")
        self.node_pricing = node_pricing
        self.budget_usd: float | None = None
        self.policies: list[Any] = []
        self._lock = threading.RLock()
        self._intervals: list[Interval] = []
        self._open: dict[str, Interval] = {}
        self._history: list[tuple[float, float, float]] = []  # (t, spent, usd_per_hour), capped

    @property
    def cluster(self) -> Any:
        return self._cluster_ref() if self._cluster_ref is not None else None

    # -- node membership -------------------------------------------------------------------------------
    def price_for(self, node_id: str) -> NodePrice:
        """The price of ``node_id`` from ``node_pricing`` (``local`` at $0 when none is known)."""
        spec: Any = None
        np_ = self.node_pricing
        try:
            if np_ is not None:
                spec = np_.get(node_id) if isinstance(np_, Mapping) else np_(node_id)
            return resolve_price(spec, self.catalog)
        except (LookupError, ValueError, TypeError) as e:
            name = spec[1] if isinstance(spec, tuple) and len(spec) > 1 else str(spec)
            cloud = spec[0] if isinstance(spec, tuple) and spec else "unknown"
            return NodePrice(str(cloud), str(name), "", "on_demand", 0.0, {}, f"price unknown: {e}", "")

    def node_joined(self, node_id: str, at: float | None = None, price: Any = None) -> None:
        """Start accruing for ``node_id`` at ``at`` (default now); no-op if it is already running."""
        at = self.clock() if at is None else at
        with self._lock:
            if node_id in self._open:
                return
            p = resolve_price(price, self.catalog) if price is not None else self.price_for(node_id)
            iv = Interval(node_id, p, at)
            self._intervals.append(iv)
            self._open[node_id] = iv

    def node_left(self, node_id: str, at: float | None = None) -> None:
        """Stop accruing for ``node_id`` at ``at`` (default now)."""
        at = self.clock() if at is None else at
        with self._lock:
            iv = self._open.pop(node_id, None)
            if iv is not None:
                iv.end = max(iv.start, at)

    def sync_nodes(self, node_ids: Iterable[str], at: float | None = None) -> None:
        """Make the running set equal ``node_ids``: new ones join, missing ones leave, at ``at``."""
        at = self.clock() if at is None else at
        ids = set(node_ids)
        with self._lock:
            for nid in list(self._open):
                if nid not in ids:
                    self.node_left(nid, at)
            for nid in sorted(ids):
                if nid not in self._open:
                    self.node_joined(nid, at)

    def stop_all(self, at: float | None = None) -> None:
        """Every node left (the cluster stopped)."""
        at = self.clock() if at is None else at
        with self._lock:
            for nid in list(self._open):
                self.node_left(nid, at)

    def reprice(self, at: float | None = None) -> None:
        """Re-read every running node's price (after an override or refresh): the old price ends at ``at``."""
        at = self.clock() if at is None else at
        with self._lock:
            for nid, iv in list(self._open.items()):
                if self.node_pricing is not None:
                    new = self.price_for(nid)
                elif iv.price.is_local:
                    continue
                else:  # a price given at join: look the same instance up again (overrides, refresh)
                    p = iv.price
                    new = resolve_price((p.cloud, p.instance_type, p.region, p.market), self.catalog)
                if new != iv.price:
                    self.node_left(nid, at)
                    self.node_joined(nid, at, price=new)

    def poll(self, at: float | None = None) -> None:
        """Ask the cluster which nodes are alive and :meth:`sync_nodes` (no-op without a cluster).

        A stopped cluster counts as no nodes, so the cost stops accruing when workers are stopped.
        """
        c = self.cluster
        if c is None:
            return
        at = self.clock() if at is None else at
        state = getattr(c, "state", "running")
        if state in ("stopping", "stopped", "failed", "new"):
            self.sync_nodes([], at)
            return
        try:
            nodes = c.ray_nodes()
        except Exception:  # noqa: BLE001 - Ray unreachable for a moment (any Ray error): keep the current set
            return
        ids = [str(n.get("NodeID", n.get("node_id", ""))) for n in nodes if n.get("Alive", True)]
        self.sync_nodes([i for i in ids if i], at)

    # -- numbers ---------------------------------------------------------------------------------------
    @property
    def is_local(self) -> bool:
        """True when every node seen so far is local (own hardware, $0)."""
        with self._lock:
            return all(iv.price.is_local for iv in self._intervals)

    def usd_per_hour(self) -> float:
        """The current burn rate: the sum of the running nodes' prices."""
        with self._lock:
            return sum(iv.price.usd_per_hour for iv in self._open.values())

    def spent(self, at: float | None = None) -> float:
        """Estimated USD accrued up to ``at``."""
        at = self.clock() if at is None else at
        with self._lock:
            return sum(iv.cost(at) for iv in self._intervals)

    def by_market(self, at: float | None = None) -> dict[str, float]:
        """What the same node-hours would cost on-demand, on spot and with a 1-year reservation."""
        at = self.clock() if at is None else at
        with self._lock:
            return {m: sum(iv.cost(at, m) for iv in self._intervals) for m in MARKETS}

    def unknown_prices(self) -> list[str]:
        """Instance types seen whose price is unknown (counted as $0: a budget does not see them)."""
        with self._lock:
            return sorted({iv.price.instance_type for iv in self._intervals if not iv.price.known})

    def node_hours(self, at: float | None = None) -> float:
        at = self.clock() if at is None else at
        with self._lock:
            return sum(iv.hours(at) for iv in self._intervals)

    def snapshot(self, at: float | None = None) -> CostSnapshot:
        """All numbers at ``at`` (default now) in one object (text and HTML reprs)."""
        at = self.clock() if at is None else at
        with self._lock:
            per_node: dict[str, NodeCost] = {}
            for iv in self._intervals:
                row = per_node.setdefault(
                    iv.node_id,
                    {
                        "node_id": iv.node_id,
                        "label": iv.price.label,
                        "usd_per_hour": 0.0,
                        "hours": 0.0,
                        "spent_usd": 0.0,
                        "running": False,
                    },
                )
                row["hours"] += iv.hours(at)
                row["spent_usd"] += iv.cost(at)
                if iv.end is None:
                    row.update(
                        {"running": True, "usd_per_hour": iv.price.usd_per_hour, "label": iv.price.label}
                    )
            rate = self.usd_per_hour()
            spent = self.spent(at)
            priced = [iv.price for iv in self._intervals if not iv.price.is_local and iv.price.known]
            unknown = self.unknown_prices()
            source = priced[-1].source if priced else "local cluster"
            date = priced[-1].date if priced else ""
            snap = CostSnapshot(
                at=at,
                usd_per_hour=rate,
                spent_usd=spent,
                projected_next_hour_usd=rate,
                node_hours=self.node_hours(at),
                nodes_running=len(self._open),
                by_market=self.by_market(at),
                nodes=list(per_node.values()),
                is_local=self.is_local,
                source=source,
                date=date,
                budget_usd=self.budget_usd,
                policies=[p.status(at) for p in self.policies if hasattr(p, "status")],
                unknown_prices=unknown,
            )
            if not self._history or at > self._history[-1][0]:
                self._history.append((at, spent, rate))
                if len(self._history) > 2000:
                    del self._history[: len(self._history) - 1000]
            return snap

    @property
    def history(self) -> list[tuple[float, float, float]]:
        """Recent ``(time, spent_usd, usd_per_hour)`` points recorded by :meth:`snapshot` (capped)."""
        with self._lock:
            return list(self._history)

    def __repr__(self) -> str:
        s = self.snapshot()
        kind = "local $0" if s.is_local else "estimate"
        return f"<CostMeter ${s.usd_per_hour:.2f}/h, ${s.spent_usd:.2f} so far, {s.nodes_running} node(s), {kind}>"

    def _repr_html_(self) -> str:
        return snapshot_html(self.snapshot())


def cost_meter_for(cluster: Any = None, **kwargs: Any) -> CostMeter:
    """The shared :class:`CostMeter` of ``cluster`` (default: the current cluster), created on first use.

    The meter learns the cluster's nodes now (joined at the cluster's start time) and stops accruing when the
    cluster stops (a stop hook).
    """
    if cluster is None:
        cluster = _registry.current_cluster()
        if cluster is None:
            raise RuntimeError("no cluster: start one with %gpu_cluster start (or pass cluster=)")
    meters = _registry.cost_meters
    with meters.lock:
        meter = meters.get(cluster)
        if meter is not None:
            return meter
        meter = CostMeter(cluster, **kwargs)
        meters.set(cluster, meter)
    started = getattr(cluster, "started_at", None) or getattr(cluster, "created_at", None)
    meter.poll(at=min(meter.clock(), started) if started else None)
    if hasattr(cluster, "add_stop_hook"):
        ref = weakref.ref(meter)

        def _stopped(reason: str) -> None:
            m = ref()
            if m is not None:
                m.stop_all()

        cluster.add_stop_hook(_stopped)
    return meter
