"""The provider interface: where a cluster's Ray comes from, and what has to be undone when it ends.

:class:`gpu_notebook.cluster.Cluster` does the same thing for every kind of cluster (connect to Ray, start the
worker group, register with the manager, stop in order) and asks its provider only for what differs: a local
Ray started here (:mod:`.local`), an existing cluster reached by address (:mod:`.address`), or cloud nodes
launched for it (:mod:`.cloud`).
"""

from __future__ import annotations

from typing import Any, Protocol

from gpu_notebook._display import Progress
from gpu_notebook._registry import ClusterManager
from gpu_notebook.cluster._runtime_env import prepare_for_workers
from gpu_notebook.cluster.options import ClusterOptions
from gpu_notebook.distributed import GroupTimeouts

__all__ = ["Provider", "ProviderCluster"]


class ProviderCluster(Protocol):
    """What a provider reads and sets on its cluster."""

    name: str
    address: str | None
    settings: ClusterOptions  # every setting, grouped (gpu_notebook.cluster.options)
    node_pricing: Any  # what the cost meter prices the nodes by (a cloud provider sets it once launched)
    timeouts: GroupTimeouts

    def ray_nodes(self) -> list[dict[str, Any]]: ...


class Provider:
    """Where a cluster's Ray comes from. ``Cluster.start`` and ``Cluster.stop`` call, in this order:

    1. :meth:`default_name`, when the user gave no name.
    2. :meth:`launch`, before connecting: make the Ray cluster exist and set ``cluster.address`` to where it
       answers. If it raises, it has left nothing running (it cleans up what it began).
    3. :meth:`launched`, first step of the guarded part of the start: from here on a failure (Ctrl-C too) makes
       the cluster call :meth:`teardown`. It must not raise for a problem it can work around; say it instead.
    4. :meth:`ranks`, while sizing the worker group: a rank count the provider imposes, else None (``--workers``
       or one per GPU decides).
    5. :meth:`worker_env`, once connected and before the workers start: their Ray ``runtime_env`` (local paths
       uploaded) and environment variables.
    6. :meth:`teardown`, once after a failed start (first, since it is what costs money) and once at stop (after
       the workers ended and the Ray connection closed): end what :meth:`launch` made; return a one-line summary
       for the stop message, '' when there was nothing to end. It is safe to call when nothing was launched.

    And :meth:`stops_at_kernel_shutdown`, when the Jupyter kernel is asked to shut down or restart.

    ``say`` is the start's progress callback (a magic prints it); it may be None at stop. The base class is the
    behaviour of a provider that launches nothing.
    """

    #: What ``Cluster.kind`` and ``%gpu_cluster list`` show.
    kind = "?"

    def default_name(self, cluster: ProviderCluster, taken: ClusterManager[Any]) -> str:
        """A name for an unnamed cluster; ``taken.unique_name(base)`` avoids the names in use."""
        return taken.unique_name(self.kind)

    def launch(self, cluster: ProviderCluster, say: Progress) -> None:
        """Make the Ray cluster exist (nothing to do for one that already does)."""

    def launched(self, cluster: ProviderCluster, say: Progress) -> None:
        """What to do once launched, before connecting (see the class docstring, step 3)."""

    def ranks(self) -> int | None:
        """The number of ranks this provider's nodes call for, or None to let the cluster decide."""
        return None

    def worker_env(
        self, cluster: ProviderCluster, say: Progress
    ) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """The rank actors' ``runtime_env`` and environment variables (``--working-dir``, ``--pip``, ``--env``).

        See :func:`gpu_notebook.cluster._runtime_env.prepare_for_workers`; a provider that ships files of its
        own adds them here.
        """
        runtime = cluster.settings.runtime
        return prepare_for_workers(runtime.worker_setup, runtime.runtime_env, say)

    def teardown(self, cluster: ProviderCluster, say: Progress | None, reason: str) -> str:
        """End what :meth:`launch` made; '' when there is nothing to end."""
        return ""

    def stops_at_kernel_shutdown(self, cluster: ProviderCluster) -> bool:
        """Whether the cluster stops in the kernel when the kernel is asked to shut down or restart (the kernel
        has about 2.5 s before jupyter_client sends SIGTERM). True: a local Ray shuts down, a remote one is
        disconnected from. A provider whose teardown takes longer hands it to someone else and returns False."""
        return True

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind}>"
