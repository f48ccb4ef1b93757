"""An existing Ray cluster reached by address (``auto``, ``host:port``, ``ray://host:port`` or ``RAY_ADDRESS``).

We did not start it, so stopping only disconnects; it is left running for its owner.
"""

from __future__ import annotations

from typing import Any

from gpu_notebook._registry import ClusterManager

from .base import Provider, ProviderCluster

__all__ = ["AddressProvider", "address_name"]


class AddressProvider(Provider):
    """A cluster someone else runs: named after its host (``ray`` for ``auto``)."""

    kind = "address"

    def default_name(self, cluster: ProviderCluster, taken: ClusterManager[Any]) -> str:
        return taken.unique_name(address_name(cluster.address or "auto"))


def address_name(address: str) -> str:
    """The default cluster name for an address: its host, or ``ray`` for ``auto``.

    >>> address_name("ray://10.0.0.5:10001"), address_name("auto")
    ('10.0.0.5', 'ray')
    """
    body = address.replace("ray://", "")
    return "ray" if body == "auto" else body.split(":")[0]
