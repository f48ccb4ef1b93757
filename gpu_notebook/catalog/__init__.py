"""GPU instance catalog of AWS, GCP and Azure: hardware and estimated prices (on-demand, spot, 1-year reserved).

>>> from gpu_notebook.catalog import get_catalog
>>> cat = get_catalog()
>>> it = cat.find("aws", gpu="A100", count=8, region="us-east-1")[0]
>>> it.price("us-east-1", "spot")  # doctest: +SKIP

Prices are list-price estimates with their source and date (``cat.source``, ``cat.date``); override them with
:meth:`Catalog.override` and refresh them with :meth:`Catalog.refresh`.
"""

from typing import TYPE_CHECKING, Any

from ._catalog import (
    CLOUDS,
    MARKETS,
    Catalog,
    CatalogError,
    InstanceType,
    Override,
    cache_path,
    get_catalog,
    normalize_cloud,
    normalize_market,
    parse_gpu,
)

if TYPE_CHECKING:  # pragma: no cover
    from ._refresh import RefreshReport, refresh_catalog

__all__ = [
    "CLOUDS",
    "MARKETS",
    "Catalog",
    "CatalogError",
    "InstanceType",
    "Override",
    "RefreshReport",
    "cache_path",
    "get_catalog",
    "normalize_cloud",
    "normalize_market",
    "parse_gpu",
    "refresh_catalog",
]


def __getattr__(name: str) -> Any:
    # the refresh code (urllib, http) loads only when used
    if name in ("RefreshReport", "refresh_catalog"):
        from . import _refresh

        return getattr(_refresh, name)
    raise AttributeError(f"module 'gpu_notebook.catalog' has no attribute {name!r}")
