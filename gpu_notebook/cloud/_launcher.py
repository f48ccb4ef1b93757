"""The launcher: plan, launch and tear down cloud GPU clusters through Ray's own cluster launcher (or KubeRay).

:class:`CloudLauncher` is what ``%gpu_cluster start --cloud ...`` and ``%gpu_cluster stop`` call:

- :meth:`CloudLauncher.plan` renders and validates the full config and prices it (``--dry-run``, :mod:`._plan`);
- :meth:`CloudLauncher.launch` checks credentials and quota (:mod:`._quotas`), saves state, runs
  ``ray.autoscaler.sdk.create_or_update_cluster`` with progress stages (:mod:`._progress`), opens the tunnel
  (:mod:`._tunnels`), waits for workers, and on any failure runs the one cleanup routine of :mod:`._teardown`;
- :meth:`CloudLauncher.teardown` runs ``teardown_cluster`` and then asks the cloud API whether anything tagged
  with the cluster's name is left, terminating stragglers on AWS, and reports what it found.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook.errors import GpuNotebookError

from . import _kube, _ray_compat, _tunnels
from ._credentials import CredentialsInfo, check_credentials, check_kubernetes
from ._plan import Plan, make_plan
from ._progress import LauncherOutput, Stages
from ._quotas import alternatives, check_aws_quota, error_code, failure_message
from ._render import RAY_CLIENT_PORT
from ._spec import CloudRequestError, ClusterSpec, InstanceChoice
from ._state import ClusterState, delete_state, list_states, load_state
from ._teardown import TeardownReport, cleanup_failed_launch, leftovers, teardown_resources

__all__ = [
    "CloudLauncher",
    "CloudRequestError",
    "LaunchError",
    "Plan",
    "TeardownReport",
    "plan_cluster",
    "spec_from_options",
]


class LaunchError(GpuNotebookError, RuntimeError):
    """A launch that failed; the message says why, what was cleaned up, and what to try instead."""

    def __init__(self, message: str, teardown: TeardownReport | None = None) -> None:
        super().__init__(message)
        self.teardown = teardown


class CloudLauncher:
    """Plans, launches, tears down and lists cloud GPU clusters.

    Parameters
    ----------
    catalog : optional
        The instance catalog (default :func:`gpu_notebook.catalog.get_catalog`).
    check_tools : bool
        Check that ``ssh`` and ``rsync`` exist before a VM launch.
    verify_credentials : bool
        AWS: verify credentials with STS before launching.
    kube_clients : tuple, optional
        ``(CustomObjectsApi, CoreV1Api)`` for ``kubernetes`` (default: from the kube config).
    ssh, kubectl : str
        Programs for the Ray Client tunnel (``ClusterSpec.connect="tunnel"``): ``ssh -N -L`` on VM clouds,
        ``kubectl port-forward`` on Kubernetes.
    verbose : bool
        Show Ray's launcher output on the console; by default it goes to ``clusters/<name>.log`` next to the
        saved state and only the progress stages are shown.
    """

    def __init__(
        self,
        catalog: Any = None,
        check_tools: bool = True,
        verify_credentials: bool = True,
        kube_clients: tuple[Any, Any] | None = None,
        verbose: bool = False,
        ssh: str = "ssh",
        kubectl: str = "kubectl",
    ) -> None:
        self.verbose = verbose
        self.ssh = ssh
        self.kubectl = kubectl
        self.catalog = catalog
        self.check_tools = check_tools
        self.verify_credentials = verify_credentials
        self._kube_clients = kube_clients

    # -- plan -----------------------------------------------------------------------------------------------

    def plan(self, spec: ClusterSpec) -> Plan:
        """Resolve instances, render the config, validate it with Ray's own validation, price it.

        Raises
        ------
        CloudRequestError
            The request cannot be met (unknown GPU/instance, region without it); alternatives are listed.
        """
        return make_plan(spec, self.catalog)

    def alternatives(self, spec: ClusterSpec, worker: InstanceChoice) -> list[str]:
        """Other regions with this instance type and other instance types with this GPU (cheapest first)."""
        return alternatives(spec, worker, self.catalog)

    # -- launch -----------------------------------------------------------------------------------------------

    def check_credentials(self, spec: ClusterSpec) -> CredentialsInfo:
        """One clear :class:`CredentialsError` when ``spec``'s cloud is not usable from here."""
        if spec.cloud == "kubernetes" and self._kube_clients is not None:
            return check_kubernetes(need_client=False)
        return check_credentials(
            spec.cloud,
            spec.region,
            project=spec.project,
            verify=self.verify_credentials,
            tools=self.check_tools,
        )

    def launch(
        self,
        spec: ClusterSpec,
        progress: Progress | None = None,
        wait_for_workers_s: float = 900.0,
        poll_s: float = 10.0,
    ) -> ClusterState:
        """Create the cluster; return its saved :class:`ClusterState` (``address``/``client_address`` set).

        Stages reported through ``progress``: checking credentials, launching head, waiting for SSH,
        installing, starting Ray, workers joining. On any failure (including Ctrl-C) whatever was created is
        torn down and verified, and :class:`LaunchError` says why, what was cleaned, and what to try instead.
        """
        plan = self.plan(spec)
        self._refuse_duplicate(str(spec.name))
        state = ClusterState(
            name=str(spec.name),
            cloud=spec.cloud,
            region=spec.region,
            spec=spec.to_dict(),
            config=plan.config,
            hourly_usd=plan.hourly("spot" if spec.spot else "on_demand"),
            gpus_per_node=plan.gpus_per_node,
            world_size=plan.world_size,
        )
        stages = Stages(progress, state)
        stages("checking credentials")
        self.check_credentials(spec)
        if spec.cloud == "aws":
            stages("checking quota")
            check_aws_quota(spec, plan, self.catalog)
        if spec.cloud == "kubernetes":
            self._launch_kube(spec, plan, state, stages, poll_s)
        else:
            self._launch_vms(spec, plan, state, stages, wait_for_workers_s, poll_s)
        state.status = "running"
        stages("ready")
        state.save()
        return state

    def _launch_vms(
        self,
        spec: ClusterSpec,
        plan: Plan,
        state: ClusterState,
        stages: Stages,
        wait_for_workers_s: float,
        poll_s: float,
    ) -> None:
        """``create_or_update_cluster``, the tunnel, the workers; on failure, clean up and raise LaunchError."""
        state.save()  # before anything exists, so a crashed kernel can still `stop` it
        output = LauncherOutput(state.path.with_suffix(".log"), self.verbose)
        with output:
            stages.console = output.real_stdout
            try:
                with _ray_compat.launcher_events(stages.ray_event):
                    booted = _ray_compat.create_or_update_cluster(plan.config)
                state.ssh_key = (booted or {}).get("auth", {}).get("ssh_private_key")
                state.head_ip = _ray_compat.get_head_node_ip(plan.config)
                state.address = f"{state.head_ip}:6379"
                state.client_address = f"ray://{state.head_ip}:{RAY_CLIENT_PORT}"
                state.save()
                if spec.connect == "tunnel":
                    stages("opening an SSH tunnel to the head's Ray Client port")
                    self.open_tunnel(state, ssh=self.ssh)
                stages("workers joining")
                self._wait_workers(plan.config, spec.workers, wait_for_workers_s, poll_s, stages)
                return
            except BaseException as exc:  # Ctrl-C too: whatever was created must not keep running
                code, desc = error_code(exc)
                report = cleanup_failed_launch(
                    state, f"{code or type(exc).__name__}: {desc}", stages, self._kube_clients
                )
                if isinstance(exc, KeyboardInterrupt):
                    raise
                failure = exc
            finally:
                stages.console = None
        msg = failure_message(spec, plan, code, desc, report, self.catalog)
        if not self.verbose:
            msg += f"\nLauncher log: {output.path}\n" + "\n".join(
                "  | " + ln for ln in output.tail().splitlines()
            )
        raise LaunchError(msg, report) from failure

    def _launch_kube(
        self, spec: ClusterSpec, plan: Plan, state: ClusterState, stages: Stages, poll_s: float = 5.0
    ) -> None:
        """Apply the RayCluster and wait for its head; on failure, clean up and raise LaunchError."""
        api, _core = self._kube_clients or _kube.make_clients()
        state.save()
        try:
            stages("applying RayCluster")
            _kube.apply_raycluster(plan.config, api)
            stages("waiting for the head pod")
            _kube.wait_head_ready(str(spec.name), spec.namespace, api, poll_s=poll_s, progress=stages)
        except BaseException as exc:  # Ctrl-C too: the RayCluster must not keep running
            report = cleanup_failed_launch(
                state, f"{type(exc).__name__}: {exc}", stages, self._kube_clients, poll_s=poll_s
            )
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise LaunchError(
                f"Applying RayCluster {spec.name} failed: {exc}\nCleanup: {report.message()}", report
            ) from exc
        state.client_address = _kube.head_service_address(str(spec.name), spec.namespace)
        if spec.connect == "tunnel":
            self._kube_tunnel(spec, state, stages)

    def _kube_tunnel(self, spec: ClusterSpec, state: ClusterState, stages: Stages) -> None:
        """Port-forward the head's Ray Client port when kubectl is here; else keep the in-cluster address."""
        if not shutil.which(self.kubectl):
            stages(
                "no kubectl here: using the in-cluster address (run the notebook in the cluster, or "
                f"kubectl port-forward svc/{spec.name}-head-svc 10001)"
            )
            return
        stages("port-forwarding the head's Ray Client port (kubectl)")
        try:
            self.open_kube_port_forward(state, kubectl=self.kubectl)
        except (OSError, RuntimeError, TimeoutError) as exc:  # kubectl missing, exited, or never listened
            stages(f"port-forward failed ({exc}); using the in-cluster address")

    @staticmethod
    def _refuse_duplicate(name: str) -> None:
        try:
            old = load_state(name)
        except KeyError:
            return
        if old.status in ("launching", "running", "stopping", "stop-incomplete"):
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(old.created_at))
            raise CloudRequestError(
                f"a {old.cloud} cluster named {name!r} already exists (status {old.status}, started {started}); "
                f"stop it first (%gpu_cluster stop {name}) or pick another name"
            )

    def _wait_workers(
        self, config: dict[str, Any], want: int, timeout_s: float, poll_s: float, stages: Stages
    ) -> int:
        if want <= 0 or timeout_s <= 0:
            stages("workers joining: not waited for (they join in the background)")
            return 0
        provider = _ray_compat.get_node_provider(config["provider"], config["cluster_name"])
        deadline = time.monotonic() + timeout_s
        ready = 0
        while True:
            nodes = provider.non_terminated_nodes({_ray_compat.TAG_NODE_KIND: "worker"})
            ready = sum(
                1 for n in nodes if provider.node_tags(n).get(_ray_compat.TAG_NODE_STATUS) == "up-to-date"
            )
            stages(f"workers joining: {ready}/{want} up")
            if ready >= want:
                return ready
            if time.monotonic() >= deadline:
                stages(
                    f"workers joining: only {ready}/{want} up after {timeout_s / 60:.0f} min; the head keeps "
                    "trying (capacity or quota?). Its autoscaler log: ray exec <config> "
                    "'tail -n 100 /tmp/ray/session_latest/logs/monitor*'"
                )
                return ready
            time.sleep(poll_s)

    # -- teardown -------------------------------------------------------------------------------------------

    def teardown(
        self,
        cluster: ClusterState | str,
        progress: Progress | None = None,
        verify_timeout_s: float = 300.0,
        poll_s: float = 5.0,
    ) -> TeardownReport:
        """Terminate every node of ``cluster`` (a state or a saved name) and verify through the cloud API.

        The state file is removed when nothing is left; otherwise it stays (status ``stop-incomplete``) so
        ``list`` keeps showing the cluster.
        """
        state = load_state(cluster) if isinstance(cluster, str) else cluster
        stages = Stages(progress)
        self.close_tunnel(state)
        state.status = "stopping"
        state.save()
        if state.cloud == "kubernetes":
            report = teardown_resources(state, stages, self._kube_clients, verify_timeout_s, poll_s)
        else:
            output = LauncherOutput(state.path.with_suffix(".log"), self.verbose)
            with output:
                stages.console = output.real_stdout
                try:
                    report = teardown_resources(state, stages, None, verify_timeout_s, poll_s)
                finally:
                    stages.console = None
        if report.clean:
            state.status = "stopped"
            delete_state(state.name)
        else:
            state.status = "stop-incomplete"
            state.error = report.message()
            state.save()
        stages(report.message())
        return report

    # -- inspection -------------------------------------------------------------------------------------------

    def list_clusters(self) -> list[ClusterState]:
        """Saved clusters (including ones a previous kernel started)."""
        return list_states()

    def status(self, cluster: ClusterState | str) -> dict[str, Any]:
        """Saved state plus what the cloud API says is running under the cluster's tag."""
        state = load_state(cluster) if isinstance(cluster, str) else cluster
        report = TeardownReport(state.name, state.cloud)
        nodes: list[dict[str, Any]] | None = None
        if state.cloud == "kubernetes":
            api, core = self._kube_clients or _kube.make_clients()
            ns = state.spec.get("namespace", "default")
            nodes = [{"kind": "pod", "id": p} for p in _kube.cluster_pods(state.name, ns, core)]
        else:
            nodes = leftovers(state.config, report)
        return {"state": state, "nodes": nodes, "errors": report.errors}

    # -- tunnels (see _tunnels) ---------------------------------------------------------------------------

    @classmethod
    def open_tunnel(
        cls, state: ClusterState, local_port: int | None = None, timeout_s: float = 30.0, ssh: str = "ssh"
    ) -> str:
        """Start ``ssh -N -L`` to the head in the background; return ``ray://127.0.0.1:<port>`` once it listens.

        The ssh process id is saved in the state (``tunnel_pid``) and ended by :meth:`close_tunnel` and by
        :meth:`teardown`.
        """
        return _tunnels.open_ssh_tunnel(state, local_port, timeout_s, ssh)

    @classmethod
    def open_kube_port_forward(
        cls,
        state: ClusterState,
        local_port: int | None = None,
        timeout_s: float = 60.0,
        kubectl: str = "kubectl",
    ) -> str:
        """``kubectl port-forward`` to the RayCluster's head service; returns ``ray://127.0.0.1:<port>``."""
        return _tunnels.open_kube_port_forward(state, local_port, timeout_s, kubectl)

    @staticmethod
    def close_tunnel(state: ClusterState) -> bool:
        """End the ssh tunnel :meth:`open_tunnel` started (by its saved process id); True if one was ended."""
        return _tunnels.close_tunnel(state)

    @staticmethod
    def ssh_tunnel_command(
        state: ClusterState, local_port: int = RAY_CLIENT_PORT, key_path: str | None = None
    ) -> list[str]:
        """``ssh -N -L`` command that forwards the head's Ray Client port to ``127.0.0.1:local_port``."""
        return _tunnels.ssh_tunnel_command(state, local_port, key_path)


def plan_cluster(spec: ClusterSpec, catalog: Any = None) -> Plan:
    """Shortcut for ``CloudLauncher(catalog).plan(spec)`` (``--dry-run``)."""
    return CloudLauncher(catalog).plan(spec)


def spec_from_options(
    cloud: str,
    region: str | None = None,
    gpu: str | None = None,
    instance_type: str | None = None,
    workers: int = 1,
    spot: bool = False,
    idle_stop: float | None = None,
    **extra: Any,
) -> ClusterSpec:
    """Build a :class:`ClusterSpec` from ``%gpu_cluster start`` options (``--idle-stop`` in minutes)."""
    return ClusterSpec(
        cloud=cloud,
        region=region,
        gpu=gpu,
        instance_type=instance_type,
        workers=workers,
        spot=spot,
        idle_stop_minutes=idle_stop,
        **extra,
    )
