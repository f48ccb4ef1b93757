"""The catalog's vocabulary: clouds, markets, GPU names, one instance type, a price override, the error.

What the catalog (:mod:`._catalog`) and the price refresh (:mod:`._refresh`) both use; neither imports the
other's internals through it. :class:`PriceBook` names what the refresh needs of a catalog.
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gpu_notebook import _settings
from gpu_notebook.errors import GpuNotebookError

__all__ = [
    "CLOUDS",
    "MARKETS",
    "CatalogError",
    "InstanceType",
    "Override",
    "PriceBook",
    "cache_path",
    "normalize_cloud",
    "normalize_market",
    "parse_gpu",
]

MARKETS = ("on_demand", "spot", "reserved_1y")
CLOUDS = ("aws", "gcp", "azure")
_CLOUD_ALIASES = {
    "aws": "aws",
    "amazon": "aws",
    "ec2": "aws",
    "gcp": "gcp",
    "google": "gcp",
    "gce": "gcp",
    "azure": "azure",
    "microsoft": "azure",
}
_MARKET_ALIASES = {
    "on_demand": "on_demand",
    "on-demand": "on_demand",
    "ondemand": "on_demand",
    "od": "on_demand",
    "spot": "spot",
    "preemptible": "spot",
    "reserved_1y": "reserved_1y",
    "reserved": "reserved_1y",
    "reserved-1y": "reserved_1y",
    "1y": "reserved_1y",
}


class CatalogError(GpuNotebookError, LookupError):
    """An instance type, region, GPU or price the catalog does not have; the message names alternatives."""


def normalize_cloud(cloud: str) -> str:
    """Return the canonical cloud name (``aws``, ``gcp`` or ``azure``) for ``cloud``."""
    key = str(cloud).strip().lower()
    if key not in _CLOUD_ALIASES:
        raise CatalogError(f"unknown cloud {cloud!r}; known clouds: {', '.join(CLOUDS)}")
    return _CLOUD_ALIASES[key]


def normalize_market(market: str) -> str:
    """Return the canonical market name (``on_demand``, ``spot`` or ``reserved_1y``)."""
    key = str(market).strip().lower()
    if key not in _MARKET_ALIASES:
        raise CatalogError(f"unknown market {market!r}; known markets: {', '.join(MARKETS)}")
    return _MARKET_ALIASES[key]


def parse_gpu(gpu: str) -> tuple[str, float | None, int | None]:
    """Split a GPU request into ``(model, memory_gb, count)``.

    Accepts ``"A100"``, ``"a100-80gb"``, ``"A100_80G"``, ``"A100:8"``, ``"A100-80GB:8"``, ``"h100"``.
    """
    text = str(gpu).strip()
    count: int | None = None
    if ":" in text:
        text, _, n = text.partition(":")
        try:
            count = int(n)
        except ValueError:
            raise CatalogError(f"bad GPU count in {gpu!r}: expected TYPE:COUNT such as A100:8") from None
    m = re.fullmatch(
        r"(?i)(?:nvidia[-_ ]?)?(?:tesla[-_ ]?)?([a-z]+\d+[a-z]?)(?:[-_ ]?(\d+)\s*g(?:i?b)?)?", text
    )
    if not m:
        raise CatalogError(f"cannot read GPU type {gpu!r}; examples: A100, A100-80GB, H100:8")
    mem = float(m.group(2)) if m.group(2) else None
    return m.group(1).upper(), mem, count


class _Overrides(Protocol):
    """What an :class:`InstanceType` asks its catalog: the user's override of one price, if any."""

    def _override_for(self, cloud: str, name: str, region: str, market: str) -> Override | None: ...


class PriceBook(Protocol):
    """What a price refresh reads and writes of a catalog (:class:`gpu_notebook.catalog.Catalog` is one)."""

    source: str
    date: str

    def get(self, cloud: str, instance_type: str) -> InstanceType: ...

    def instances(
        self, cloud: str | None = None, gpu: str | None = None, region: str | None = None
    ) -> list[InstanceType]: ...

    def update_price(
        self,
        cloud: str,
        instance_type: str,
        region: str,
        market: str,
        usd_per_hour: float,
        source: str,
        date: str,
    ) -> None: ...

    def to_doc(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Override:
    """One user price override: a fixed USD/hour or a fractional discount off the catalog price."""

    cloud: str
    instance_type: str
    region: str | None
    market: str
    usd_per_hour: float | None = None
    discount: float | None = None

    def matches(self, cloud: str, name: str, region: str, market: str) -> bool:
        return (
            self.cloud == cloud
            and self.instance_type == name
            and self.market == market
            and (self.region is None or self.region == region)
        )


@dataclass(eq=False)
class InstanceType:
    """One GPU instance type of one cloud, with its hardware and per-region prices (USD/hour, estimates).

    Attributes
    ----------
    cloud, name : str
        ``"aws"``/``"gcp"``/``"azure"`` and the provider's instance type name (``"p4d.24xlarge"``).
    gpu : str
        GPU model, e.g. ``"A100"``; ``gpu_memory_gb`` tells the 40 GB and 80 GB variants apart.
    gpu_count, gpu_memory_gb, vcpus, memory_gb, network_gbps
        Hardware; ``network_gbps`` is ``None`` where the provider publishes no figure.
    regions : list of str
        Regions the catalog has prices for.
    source, date : str
        Where the prices came from and when (``date`` is ``YYYY-MM`` or ``YYYY-MM-DD``).
    extra : dict
        Provider-specific fields (GCP ``machine_type``/``accelerator_type``/``accelerator_count``).
    """

    cloud: str
    name: str
    gpu: str
    gpu_count: int
    gpu_memory_gb: float
    vcpus: int
    memory_gb: float
    network_gbps: float | None
    regions: list[str]
    source: str
    date: str
    prices: dict[str, dict[str, float]] = field(repr=False)
    price_basis: str = ""
    spot_source: str = ""
    extra: dict[str, Any] = field(default_factory=dict, repr=False)
    _catalog: _Overrides | None = field(default=None, repr=False, compare=False)

    def catalog_price(self, region: str, market: str = "on_demand") -> float:
        """The catalog's price, ignoring user overrides."""
        market = normalize_market(market)
        if region not in self.prices:
            raise CatalogError(
                f"{self.cloud} {self.name} has no price for region {region!r}; "
                f"regions with prices: {', '.join(sorted(self.prices)) or 'none'}"
            )
        by_market = self.prices[region]
        if market not in by_market:
            raise CatalogError(
                f"{self.cloud} {self.name} in {region} has no {market} price; "
                f"markets: {', '.join(sorted(by_market))}"
            )
        return float(by_market[market])

    def price(self, region: str, market: str = "on_demand") -> float:
        """Estimated USD per hour in ``region`` for ``market`` (``on_demand``, ``spot``, ``reserved_1y``).

        User overrides (:meth:`Catalog.override`) apply. Raises :class:`CatalogError` if the region or market
        has no price.
        """
        market = normalize_market(market)
        if self._catalog is not None:
            ov = self._catalog._override_for(self.cloud, self.name, region, market)
            if ov is not None and ov.usd_per_hour is not None:
                return float(ov.usd_per_hour)  # also for a region the catalog lacks: the user knows
            base = self.catalog_price(region, market)
            if ov is not None and ov.discount is not None:
                return base * (1.0 - ov.discount)
            return base
        return self.catalog_price(region, market)

    def prices_in(self, region: str) -> dict[str, float]:
        """All markets' prices (overrides applied) in ``region``."""
        return {m: self.price(region, m) for m in MARKETS if m in self.prices.get(region, {})}

    @property
    def gpu_label(self) -> str:
        """``"8x A100-80GB"``-style label."""
        return f"{self.gpu_count}x {self.gpu}-{self.gpu_memory_gb:g}GB"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (catalog prices, no overrides)."""
        return {
            k: copy.deepcopy(getattr(self, k))
            for k in (
                "cloud",
                "name",
                "gpu",
                "gpu_count",
                "gpu_memory_gb",
                "vcpus",
                "memory_gb",
                "network_gbps",
                "source",
                "spot_source",
                "date",
                "price_basis",
                "extra",
                "prices",
            )
        }

    def __repr__(self) -> str:
        return (
            f"InstanceType({self.cloud}:{self.name}, {self.gpu_label}, {self.vcpus} vCPU, "
            f"{self.memory_gb:g} GB, regions={len(self.regions)}, as of {self.date})"
        )


def instance_from_dict(d: dict[str, Any], catalog: _Overrides | None) -> InstanceType:
    prices = {str(r): {str(m): float(p) for m, p in mk.items()} for r, mk in d["prices"].items()}
    return InstanceType(
        cloud=normalize_cloud(d["cloud"]),
        name=str(d["name"]),
        gpu=str(d["gpu"]).upper(),
        gpu_count=int(d["gpu_count"]),
        gpu_memory_gb=float(d["gpu_memory_gb"]),
        vcpus=int(d["vcpus"]),
        memory_gb=float(d["memory_gb"]),
        network_gbps=None if d.get("network_gbps") is None else float(d["network_gbps"]),
        regions=sorted(prices),
        source=str(d["source"]),
        date=str(d["date"]),
        prices=prices,
        price_basis=str(d.get("price_basis", "")),
        spot_source=str(d.get("spot_source", "")),
        extra=dict(d.get("extra") or {}),
        _catalog=catalog,
    )


def cache_path() -> Path:
    """Where :meth:`Catalog.refresh` saves refreshed prices (``$XDG_CACHE_HOME/gpu_notebook/gpu_catalog.json``)."""
    base = _settings.cache_dir() or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpu_notebook"
    )
    return Path(base) / "gpu_catalog.json"
