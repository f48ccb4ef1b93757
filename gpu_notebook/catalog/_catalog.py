"""The GPU instance catalog: hardware and estimated prices of the GPU instance types of AWS, GCP and Azure.

The catalog ships with the package (``gpu_notebook/data/gpu_catalog.json``), carries its source and date,
and is used by the cost meter and by cloud provisioning to pick instances. Prices are list-price
*estimates*; users can override them (reservations, discounts) and refresh them from the providers' public
price lists when online (see :mod:`gpu_notebook.catalog._refresh`).
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from gpu_notebook import _registry

from ._refresh import RefreshReport, refresh_catalog
from ._types import (
    CatalogError,
    InstanceType,
    Override,
    cache_path,
    instance_from_dict,
    normalize_cloud,
    normalize_market,
    parse_gpu,
)


class Catalog:
    """A set of :class:`InstanceType` with lookup, search, user overrides and refresh.

    Use :func:`get_catalog` for the shared, cached instance.
    """

    def __init__(self, doc: dict[str, Any]) -> None:
        self.source: str = str(doc.get("source", "unknown"))
        self.date: str = str(doc.get("date", "unknown"))
        self.notes: str = str(doc.get("notes", ""))
        self._lock = threading.RLock()
        self._overrides: list[Override] = []
        self._items: dict[tuple[str, str], InstanceType] = {}
        for d in doc.get("instances", []):
            it = instance_from_dict(d, self)
            self._items[(it.cloud, it.name)] = it

    # -- loading -----------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Catalog:
        """Load a catalog JSON document (the shipped format) from ``path``."""
        return cls(json.loads(Path(path).read_text()))

    @classmethod
    def shipped(cls) -> Catalog:
        """The catalog shipped with the package."""
        text = resources.files("gpu_notebook").joinpath("data/gpu_catalog.json").read_text()
        return cls(json.loads(text))

    def to_doc(self) -> dict[str, Any]:
        """The catalog as a JSON document (same format as the shipped file; overrides not included)."""
        with self._lock:
            return {
                "schema_version": 1,
                "source": self.source,
                "date": self.date,
                "notes": self.notes,
                "instances": [it.to_dict() for it in self._items.values()],
            }

    # -- queries -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(list(self._items.values()))

    def clouds(self) -> list[str]:
        """Clouds that have at least one instance type."""
        return sorted({c for c, _ in self._items})

    def instances(
        self, cloud: str | None = None, gpu: str | None = None, region: str | None = None
    ) -> list[InstanceType]:
        """Instance types filtered by cloud, GPU (``"A100"``, ``"A100-80GB"``) and region, sorted by name."""
        c = normalize_cloud(cloud) if cloud else None
        model, mem = (None, None)
        if gpu:
            model, mem, _ = parse_gpu(gpu)
        out = []
        with self._lock:
            for it in self._items.values():
                if c and it.cloud != c:
                    continue
                if model and (it.gpu != model or (mem is not None and it.gpu_memory_gb != mem)):
                    continue
                if region and region not in it.prices:
                    continue
                out.append(it)
        return sorted(out, key=lambda i: (i.cloud, i.gpu, i.gpu_count, i.name))

    def get(self, cloud: str, instance_type: str) -> InstanceType:
        """The instance type ``instance_type`` of ``cloud``; :class:`CatalogError` with close matches if unknown."""
        c = normalize_cloud(cloud)
        with self._lock:
            it = self._items.get((c, instance_type))
            if it is None:  # case-insensitive second try (Azure names are often typed in lower case)
                for (cc, name), cand in self._items.items():
                    if cc == c and name.lower() == str(instance_type).lower():
                        it = cand
                        break
            if it is not None:
                return it
            names = [n for (cc, n) in self._items if cc == c]
        close = difflib.get_close_matches(str(instance_type), names, n=5, cutoff=0.5)
        hint = (
            f"; did you mean: {', '.join(close)}"
            if close
            else f"; known {c} types include: {', '.join(sorted(names)[:8])}"
        )
        raise CatalogError(f"unknown {c} instance type {instance_type!r}{hint}")

    def find(
        self,
        cloud: str,
        gpu: str,
        count: int | None = None,
        region: str | None = None,
        *,
        market: str = "on_demand",
        min_gpu_memory_gb: float | None = None,
    ) -> list[InstanceType]:
        """Instance types of ``cloud`` with ``count`` GPUs of type ``gpu`` in ``region``, cheapest first.

        ``gpu`` may carry the count (``"A100:8"``) and memory (``"A100-80GB"``). With no region, instances are
        ranked by their cheapest region. Raises :class:`CatalogError` listing alternatives (other counts,
        other regions, other GPUs in the region) when nothing matches.
        """
        c = normalize_cloud(cloud)
        mk = normalize_market(market)
        model, mem, n_in = parse_gpu(gpu)
        if count is None:
            count = n_in
        if count is not None and not isinstance(count, int):
            raise TypeError(f"count must be an int, got {count!r} (did you mean region=...?)")
        if mem is None and min_gpu_memory_gb is not None:
            mem_ok = lambda it: it.gpu_memory_gb >= min_gpu_memory_gb  # noqa: E731
        else:
            mem_ok = lambda it: mem is None or it.gpu_memory_gb == mem  # noqa: E731
        with self._lock:
            pool = [it for it in self._items.values() if it.cloud == c]
        same_gpu = [it for it in pool if it.gpu == model and mem_ok(it)]
        hits = [
            it
            for it in same_gpu
            if (count is None or it.gpu_count == count) and (region is None or region in it.prices)
        ]

        def key(it: InstanceType) -> tuple[float, str]:
            if region is not None:
                return (self._safe_price(it, region, mk), it.name)
            return (min(self._safe_price(it, r, mk) for r in it.prices), it.name)

        if hits:
            return sorted(hits, key=key)
        want = f"{count}x " if count else ""
        want += model + (f"-{mem:g}GB" if mem else "")
        where = f" in {region}" if region else ""
        alts: list[str] = []
        if not same_gpu:
            gpus = sorted({f"{it.gpu}" for it in pool})
            alts.append(f"GPUs on {c}: {', '.join(gpus)}")
            others = sorted({it.cloud for it in self._items.values() if it.gpu == model})
            if others:
                alts.append(f"{model} is offered on: {', '.join(others)}")
        else:
            counts = sorted({it.gpu_count for it in same_gpu if region is None or region in it.prices})
            if count is not None and counts:
                alts.append(f"{model} counts{where}: {', '.join(map(str, counts))}")
            if region is not None:
                regs = sorted(
                    {r for it in same_gpu if count is None or it.gpu_count == count for r in it.prices}
                )
                if regs:
                    alts.append(f"regions with {want}: {', '.join(regs)}")
                here = sorted({f"{it.gpu}" for it in pool if region in it.prices})
                if here:
                    alts.append(f"GPUs in {region}: {', '.join(here)}")
        raise CatalogError(
            f"no {c} instance type with {want}{where}" + ("; " + "; ".join(alts) if alts else "")
        )

    def _safe_price(self, it: InstanceType, region: str, market: str) -> float:
        try:
            return it.price(region, market)
        except CatalogError:
            return float("inf")

    # -- overrides ---------------------------------------------------------------------------------
    def override(
        self,
        cloud: str,
        instance_type: str,
        region: str | None = None,
        market: str = "on_demand",
        usd_per_hour: float | None = None,
        discount: float | None = None,
    ) -> Override:
        """Set a user price: a fixed ``usd_per_hour`` or a fractional ``discount`` (0.3 = 30% off).

        ``region=None`` applies to every region. Later overrides win. Returns the :class:`Override`.
        """
        it = self.get(cloud, instance_type)
        mk = normalize_market(market)
        if (usd_per_hour is None) == (discount is None):
            raise ValueError("give exactly one of usd_per_hour or discount")
        if usd_per_hour is not None and usd_per_hour < 0:
            raise ValueError("usd_per_hour must be >= 0")
        if discount is not None and not 0.0 <= discount <= 1.0:
            raise ValueError("discount is a fraction between 0 and 1")
        ov = Override(
            it.cloud,
            it.name,
            region,
            mk,
            None if usd_per_hour is None else float(usd_per_hour),
            None if discount is None else float(discount),
        )
        with self._lock:
            self._overrides.append(ov)
        return ov

    def clear_overrides(self) -> None:
        """Remove all user overrides."""
        with self._lock:
            self._overrides.clear()

    @property
    def overrides(self) -> list[Override]:
        """The user overrides in force, oldest first."""
        with self._lock:
            return list(self._overrides)

    def _override_for(self, cloud: str, name: str, region: str, market: str) -> Override | None:
        with self._lock:
            for ov in reversed(self._overrides):
                if ov.matches(cloud, name, region, market):
                    return ov
        return None

    # -- updates -----------------------------------------------------------------------------------
    def update_price(
        self,
        cloud: str,
        instance_type: str,
        region: str,
        market: str,
        usd_per_hour: float,
        source: str,
        date: str,
    ) -> None:
        """Set one catalog price (used by :meth:`refresh`); adds the region if new."""
        it = self.get(cloud, instance_type)
        mk = normalize_market(market)
        if not usd_per_hour > 0:
            raise ValueError(f"price must be positive, got {usd_per_hour}")
        with self._lock:
            it.prices.setdefault(region, {})[mk] = float(usd_per_hour)
            it.regions = sorted(it.prices)
            it.source, it.date = source, date

    def merge(self, other: Catalog) -> int:
        """Take prices, source and date from ``other`` for the instance types both know; returns how many."""
        n = 0
        with self._lock:
            for key, theirs in other._items.items():
                mine = self._items.get(key)
                if mine is None or not theirs.prices:
                    continue
                mine.prices = copy.deepcopy(theirs.prices)
                mine.regions = sorted(mine.prices)
                mine.source, mine.date = theirs.source, theirs.date
                n += 1
            if n:
                self.source, self.date = other.source, other.date
        return n

    def refresh(
        self,
        clouds: tuple[str, ...] | list[str] | None = None,
        regions: list[str] | None = None,
        **kwargs: Any,
    ) -> RefreshReport:
        """Refresh prices from the providers' public price lists (and AWS spot history with credentials).

        See :func:`gpu_notebook.catalog.refresh_catalog` for the arguments. Offline, it raises
        :class:`CatalogError` with a clear message and leaves the prices as they were.
        """
        return refresh_catalog(self, clouds=clouds, regions=regions, **kwargs)

    # -- display -----------------------------------------------------------------------------------
    def table(
        self, cloud: str | None = None, gpu: str | None = None, region: str | None = None
    ) -> list[dict[str, Any]]:
        """Rows (one per instance type and region) for display or a DataFrame."""
        rows = []
        for it in self.instances(cloud, gpu, region):
            for r in [region] if region else it.regions:
                p = it.prices_in(r)
                rows.append(
                    {
                        "cloud": it.cloud,
                        "instance_type": it.name,
                        "gpu": it.gpu_label,
                        "vcpus": it.vcpus,
                        "memory_gb": it.memory_gb,
                        "region": r,
                        **p,
                        "date": it.date,
                    }
                )
        return rows

    def __repr__(self) -> str:
        return f"Catalog({len(self)} GPU instance types, {', '.join(self.clouds())}; source: {self.source}, as of {self.date}; estimates)"

    def _repr_html_(self) -> str:
        import html

        counts = {c: len(self.instances(cloud=c)) for c in self.clouds()}
        lis = "".join(f"<li>{html.escape(c)}: {n} instance types</li>" for c, n in counts.items())
        return (
            f"<div><b>GPU price catalog</b> (estimates) &mdash; source: {html.escape(self.source)}, "
            f"as of {html.escape(self.date)}<ul>{lis}</ul><small>{html.escape(self.notes)}</small></div>"
        )


def get_catalog(reload: bool = False, use_cache: bool = True) -> Catalog:
    """The shared catalog: the shipped data, or a refreshed copy saved by :meth:`Catalog.refresh`.

    Cached per process (in :data:`gpu_notebook._registry.catalog`); user overrides live on this object. ``reload=True`` re-reads the files and drops
    overrides. ``use_cache=False`` ignores prices saved by an earlier refresh.
    """
    with _registry.catalog.lock:
        cat: Catalog | None = _registry.catalog.get()
        if cat is None or reload:
            cat = Catalog.shipped()
            cp = cache_path()
            if use_cache and cp.is_file():
                try:
                    cat.merge(Catalog.from_file(cp))
                except (OSError, ValueError, KeyError, TypeError, CatalogError):
                    pass  # a damaged cache never hides the shipped catalog
            _registry.catalog.set(cat)
        return cat
