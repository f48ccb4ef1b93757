"""Cloud nodes launched for the cluster (AWS, GCP, Azure through Ray's launcher; Kubernetes through KubeRay).

The launch, its reaper and its pricing belong to the cluster's lifetime: the nodes are launched before the
notebook connects, priced for the cost meter once launched, and torn down (and verified gone) when the cluster
stops or its start fails. A reaper process tears them down if this kernel dies first. Before the workers start,
every node is checked for this kernel's gpu_notebook (:mod:`gpu_notebook.cluster._package_check`). Everything
about talking to the clouds lives in :mod:`gpu_notebook.cloud`; this module only ties it to a cluster.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from gpu_notebook import cloud
from gpu_notebook._display import Progress
from gpu_notebook._registry import ClusterManager, get_manager
from gpu_notebook.cloud import _reaper
from gpu_notebook.cluster import _connect, _package_check
from gpu_notebook.cluster._errors import ClusterError
from gpu_notebook.cluster._runtime_env import prepare_for_workers

from .base import Provider, ProviderCluster

__all__ = ["CloudProvider", "cloud_spec"]

#: Replacement nodes (a spot preemption, autoscaling) take minutes to join: the worker group waits this long.
_CLOUD_PLACEMENT_S = 900.0

# options of a cloud cluster passed on to the cloud spec as they are
_SPEC_KEYS = (
    "head_instance_type",
    "image",
    "disk_gb",
    "spot_fallback",
    "max_workers",
    "project",
    "namespace",
    "connect",
)


def cloud_spec(cluster: ProviderCluster) -> cloud.ClusterSpec:
    """The provider-neutral spec of a ``cloud=`` cluster (see :mod:`gpu_notebook.cloud`)."""
    launch = cluster.settings.launch
    if not launch.cloud:
        raise ClusterError("not a cloud cluster: give cloud='aws'|'gcp'|'azure'|'kubernetes'")
    extra = {k: getattr(launch, k) for k in _SPEC_KEYS if getattr(launch, k)}
    return cloud.spec_from_options(
        launch.cloud,
        region=launch.region,
        gpu=launch.gpu,
        instance_type=launch.instance_type,
        workers=cluster.settings.resources.workers or 1,
        spot=bool(launch.spot),
        idle_stop=cluster.settings.policies.idle_stop,
        name=cluster.name or None,
        ship_package=bool(cluster.settings.runtime.ship_package),
        **extra,
    )


class CloudProvider(Provider):
    """The nodes of one cloud cluster: what was launched (:attr:`state`) and the reaper that watches them."""

    def __init__(self, cloud_name: str) -> None:
        self.kind = f"cloud:{cloud_name}"
        self.cloud = cloud_name
        self.state: Any = None  # a gpu_notebook.cloud.ClusterState once launched
        self.reaper: Any = None  # a gpu_notebook.cloud._reaper.Reaper while the nodes may be running
        self._ranks: int | None = None

    def default_name(self, cluster: ProviderCluster, taken: ClusterManager[Any]) -> str:
        return str(cloud_spec(cluster).name)  # a valid cloud name (tags, labels), kept for the launch

    def plan(self, cluster: ProviderCluster) -> cloud.Plan:
        """What the launch would create, and its estimated cost: launches nothing."""
        return cloud.CloudLauncher().plan(cloud_spec(cluster))

    def launch(self, cluster: ProviderCluster, say: Progress) -> None:
        _refuse_second_connection(self.cloud)  # before paying for a launch this process could not connect to
        cluster.timeouts.placement = max(cluster.timeouts.placement, _CLOUD_PLACEMENT_S)
        spec = cloud_spec(cluster)
        if cluster.settings.launch.reaper is not False:
            self._start_reaper(str(spec.name), say)
        try:
            state = cloud.CloudLauncher().launch(spec, progress=say)  # cleans up itself when the launch fails
        except BaseException:
            self._release_reaper()
            raise
        self.state = state
        cluster.address = state.client_address or state.address
        # --workers counts cloud nodes; ranks are one per GPU of all worker nodes
        self._ranks = getattr(state, "world_size", None)

    def launched(self, cluster: ProviderCluster, say: Progress) -> None:
        """Let the cost meter (``--budget``, ``%gpu_cost``) price each node from what was launched.

        Sets ``cluster.node_pricing`` unless the user gave their own.
        """
        state = self.state
        if state is None:
            return
        if not isinstance(cluster.node_pricing, (type(None), cloud.CloudNodePricing)):
            return
        ref = weakref.ref(cluster)  # the pricing lives on the cluster: no strong cycle

        def nodes() -> list[dict[str, Any]]:
            c = ref()
            return c.ray_nodes() if c is not None else []

        try:
            cluster.node_pricing = cloud.node_pricing_for(state, nodes=nodes)
        except Exception as exc:  # noqa: BLE001 - a price lookup must not fail a launched cluster
            say(f"cost: could not price the cloud nodes ({exc}); the cost meter counts them as $0")

    def ranks(self) -> int | None:
        return int(self._ranks) if self._ranks else None

    def worker_env(
        self, cluster: ProviderCluster, say: Progress
    ) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """The base's; then every node is checked for this kernel's gpu_notebook.

        VM nodes installed it in their setup commands (the sdist in ``file_mounts``); a KubeRay manifest
        carries no files, so on Kubernetes the workers get it through their ``runtime_env`` here.
        """
        runtime = cluster.settings.runtime
        user_env = runtime.runtime_env
        if self.cloud == "kubernetes":
            user_env = _package_check.with_package(user_env, runtime.ship_package, say)
        runtime_env, env = prepare_for_workers(runtime.worker_setup, user_env, say)
        _package_check.check_nodes(runtime_env, say, runtime.ship_package is not False)
        return runtime_env, env

    def teardown(self, cluster: ProviderCluster, say: Progress | None, reason: str) -> str:
        state = self.state
        if state is None:
            self._release_reaper()
            return ""
        report = cloud.CloudLauncher().teardown(state.name, progress=say)
        self.state = None
        self._release_reaper()  # only now: if this kernel dies during the teardown, the reaper finishes it
        return report.message() if callable(getattr(report, "message", None)) else str(report)

    def stops_at_kernel_shutdown(self, cluster: ProviderCluster) -> bool:
        """``ray down`` takes minutes, the kernel has seconds: the reaper starts the teardown now (as on SIGTERM)."""
        if self.state is None or self.reaper is None:
            # nothing launched, or no reaper to hand it to (reaper=False): the kernel tries itself
            return True
        _reaper.mark_terminating()
        return False

    def _start_reaper(self, name: str, say: Progress) -> None:
        """A detached process that tears the cluster down if this kernel dies without doing it."""
        try:
            self.reaper = _reaper.start(name)
        # a launch without a reaper is still wanted (the user is told how to clean up): any failure says so
        except Exception as exc:  # noqa: BLE001
            say(
                f"WARNING: could not start the reaper process ({exc}): if this kernel dies, stop the cluster "
                f"from another one (%gpu_cluster stop {name})"
            )

    def _release_reaper(self) -> None:
        reaper = self.reaper
        if reaper is not None:
            self.reaper = None
            reaper.release()


def _refuse_second_connection(cloud_name: str) -> None:
    """A process holds one Ray connection: refuse a cloud start that could not connect, before launching."""
    ray = sys.modules.get("ray")  # not imported: nothing can be connected yet
    if ray is None or not ray.is_initialized():
        return
    conn = _connect.current_connection()
    users = [c.name for c in get_manager().list() if conn is not None and c.connection is conn]
    where = f"Ray at {conn.address}" if conn is not None else "a Ray cluster (ray.init was called)"
    if users:
        where += f", used by cluster {', '.join(repr(u) for u in users)}"
    how = "%gpu_cluster stop --all" if len(users) > 1 else "%gpu_cluster stop"
    raise ClusterError(
        f"this kernel is already connected to {where}, and a process can hold only one Ray connection, so "
        f"it could not connect to a new {cloud_name} cluster. Nothing was launched. Stop the "
        f"current cluster first ({how}; or ray.shutdown() if you called ray.init yourself), or start the "
        f"cloud cluster from another notebook (kernel)."
    )
