"""An existing Ray cluster reached by address (``auto``, ``host:port``, ``ray://host:port`` or ``RAY_ADDRESS``).

We did not start it, so stopping only disconnects; it is left running for its owner. Its nodes may lack our
package, or have another version: the workers get this kernel's copy, checked on every node at start
(:mod:`gpu_notebook.cluster._package_check`).
"""

from __future__ import annotations

from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook._registry import ClusterManager
from gpu_notebook.cluster import _package_check
from gpu_notebook.cluster._runtime_env import prepare_for_workers

from .base import Provider, ProviderCluster

__all__ = ["AddressProvider", "address_name"]


class AddressProvider(Provider):
    """A cluster someone else runs: named after its host (``ray`` for ``auto``)."""

    kind = "address"

    def default_name(self, cluster: ProviderCluster, taken: ClusterManager[Any]) -> str:
        return taken.unique_name(address_name(cluster.address or "auto"))

    def worker_env(
        self, cluster: ProviderCluster, say: Progress
    ) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """The base's, plus this kernel's gpu_notebook in ``py_modules``; then every node is checked."""
        runtime = cluster.settings.runtime
        shipped = _package_check.with_package(runtime.runtime_env, runtime.ship_package, say)
        runtime_env, env = prepare_for_workers(runtime.worker_setup, shipped, say)
        _package_check.check_nodes(runtime_env, say, runtime.ship_package is not False)
        return runtime_env, env


def address_name(address: str) -> str:
    """The default cluster name for an address: its host, or ``ray`` for ``auto``.

    >>> address_name("ray://10.0.0.5:10001"), address_name("auto")
    ('10.0.0.5', 'ray')
    """
    body = address.replace("ray://", "")
    return "ray" if body == "auto" else body.split(":")[0]
