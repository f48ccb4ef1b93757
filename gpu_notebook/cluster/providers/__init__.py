"""Where a cluster's Ray comes from: this machine, an address, or cloud nodes launched for it.

:class:`Provider` states the contract; :func:`provider_for` picks the one a cluster's options call for.
"""

from __future__ import annotations

from .address import AddressProvider, address_name
from .base import Provider, ProviderCluster
from .cloud import CloudProvider, cloud_spec
from .local import LocalProvider

__all__ = [
    "AddressProvider",
    "CloudProvider",
    "LocalProvider",
    "Provider",
    "ProviderCluster",
    "address_name",
    "cloud_spec",
]
