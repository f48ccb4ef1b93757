"""GPU instance catalog of AWS, GCP and Azure: hardware and estimated prices (on-demand, spot, 1-year reserved).

>>> from gpu_notebook.catalog import get_catalog
>>> cat = get_catalog()
>>> it = cat.find("aws", gpu="A100", count=8, region="us-east-1")[0]
>>> it.price("us-east-1", "spot")  # doctest: +SKIP

Prices are list-price estimates with their source and date (``cat.source``, ``cat.date``); override them with
:meth:`Catalog.override` and refresh them with :meth:`Catalog.refresh`.

The modules: ``_types`` (clouds, markets, an instance type, the error), ``_catalog`` (the catalog and the shared
instance), ``_refresh`` (the providers' price lists), ``_seed`` (builds the shipped data file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpu_notebook._lazy import lazy_module

from ._catalog import Catalog, get_catalog
from ._types import (
    CLOUDS,
    MARKETS,
    CatalogError,
    InstanceType,
    Override,
    cache_path,
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

# the price refresh is named here but loaded by its first use
__getattr__, __dir__ = lazy_module(
    __name__, __all__, {"RefreshReport": "._refresh", "refresh_catalog": "._refresh"}
)
