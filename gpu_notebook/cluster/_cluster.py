"""The Cluster object: one Ray cluster (local, or reached by address) and its persistent worker group."""

from __future__ import annotations

import html
import os
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook._registry import get_manager
from gpu_notebook.cluster import _connect
from gpu_notebook.cost import attach_policies
from gpu_notebook.distributed import CellResult, GroupTimeouts, RankLog, WorkerGroup
from gpu_notebook.errors import GpuNotebookError


class ClusterError(GpuNotebookError, RuntimeError):
    """A cluster operation could not be done (the message says why and what to do)."""


@dataclass
class WorkerInfo:
    """One rank worker as ``status`` shows it."""

    rank: int
    node_id: str
    node_ip: str
    pid: int
    gpu_ids: list[str]
    num_cpus: float
    num_gpus: float
    alive: bool
    local_rank: int = 0


@dataclass
class NodeInfo:
    """One Ray node."""

    node_id: str
    ip: str
    cpus: float
    gpus: float
    alive: bool
    is_head: bool = False


@dataclass
class ClusterStatus:
    """A snapshot of a cluster: nodes, workers, uptime. Shows as an HTML table in notebooks."""

    name: str
    kind: str
    address: str
    state: str
    backend: str | None
    uptime_s: float
    nodes: list[NodeInfo] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [
            f"Cluster {self.name!r} ({self.kind}, {self.address}): {self.state}, backend {self.backend or '-'}, "
            f"up {_fmt_duration(self.uptime_s)}",
            f"Nodes ({len(self.nodes)}):",
        ]
        for n in self.nodes:
            lines.append(
                f"  {n.node_id[:12]}  {n.ip:<15} CPUs {n.cpus:g}  GPUs {n.gpus:g}  "
                f"{'alive' if n.alive else 'dead'}{'  (head)' if n.is_head else ''}"
            )
        lines.append(f"Workers ({len(self.workers)}):")
        lines.append("  rank  node          pid      GPUs  CPUs  state")
        for w in self.workers:
            lines.append(
                f"  {w.rank:<5} {w.node_id[:12]:<13} {w.pid:<8} {','.join(w.gpu_ids) or '-':<5} "
                f"{w.num_cpus:<5g} {'alive' if w.alive else 'DEAD'}"
            )
        return "\n".join(lines)

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:
        p.text(str(self))

    def __repr__(self) -> str:
        alive = sum(w.alive for w in self.workers)
        return (
            f"<ClusterStatus {self.name!r}: {self.state}, {len(self.nodes)} node(s), "
            f"{alive}/{len(self.workers)} workers alive>"
        )

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td>{w.rank}</td><td><code>{e(w.node_id[:12])}</code></td><td>{e(w.node_ip)}</td>"
            f"<td>{w.pid}</td><td>{e(','.join(w.gpu_ids) or '-')}</td><td>{w.num_cpus:g}</td>"
            f"<td style='color:{'green' if w.alive else 'red'}'>{'alive' if w.alive else 'dead'}</td></tr>"
            for w in self.workers
        )
        nodes = "".join(
            f"<tr><td><code>{e(n.node_id[:12])}</code></td><td>{e(n.ip)}</td><td>{n.cpus:g}</td>"
            f"<td>{n.gpus:g}</td><td>{'alive' if n.alive else 'dead'}{' (head)' if n.is_head else ''}</td></tr>"
            for n in self.nodes
        )
        return (
            f"<div class='gpu-notebook-status'><b>Cluster {e(self.name)}</b> ({e(self.kind)}, "
            f"<code>{e(self.address)}</code>): {e(self.state)}, backend {e(self.backend or '-')}, "
            f"up {_fmt_duration(self.uptime_s)}"
            f"<table><thead><tr><th>node</th><th>IP</th><th>CPUs</th><th>GPUs</th><th>state</th></tr></thead>"
            f"<tbody>{nodes}</tbody></table>"
            f"<table><thead><tr><th>rank</th><th>node</th><th>IP</th><th>pid</th><th>GPUs</th><th>CPUs</th>"
            f"<th>state</th></tr></thead><tbody>{rows}</tbody></table></div>"
        )


def _fmt_duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


class Cluster:
    """A Ray cluster and a persistent group of rank workers with torch.distributed initialised.

    Parameters
    ----------
    name
        How ``%gpu_cluster list`` and ``use`` refer to it (default ``local``, ``local-2``, ... or the address).
    workers
        Number of rank workers (default: one per GPU of the cluster, or 2 without GPUs).
    cpus_per_worker
        CPUs each worker holds; fractions are allowed so several workers fit on a small laptop
        (default: 1, or less so that the workers fit on this machine).
    gpus_per_worker
        GPUs each worker holds (default: 1 when the cluster has GPUs, else 0).
    address
        ``None`` starts a local Ray cluster on this machine, or, as ``ray.init()`` does, connects to the cluster
        named by the ``RAY_ADDRESS`` environment variable when it is set; ``local`` always starts a local one;
        ``auto``, ``host:port`` or ``ray://host:port`` connects to an existing one (an address where nothing
        answers fails within seconds).
    dashboard
        Start Ray's dashboard with a local cluster (off by default: lighter).
    backend
        ``auto`` (NCCL when every worker has a GPU, else gloo), ``gloo`` or ``nccl``.
    gpu_visibility
        ``own`` (each worker sees only its GPUs) or ``node`` (each sees the node's GPUs of the group).
    **options
        Extras other parts read (``idle_stop``, ``budget``, ``budget_checkpoint_timeout_s``, ``node_pricing``,
        ``cloud``, ``reaper``, ``max_result_bytes`` (the most a rank's value may take, pickled, to come back:
        default 64 MiB, 0 no limit) ...), kept in :attr:`options`. A ``cloud`` cluster gets ``node_pricing`` from
        what it launched, and a reaper process that tears it down if this process dies first
        (``reaper=False`` turns it off; see ``docs/cloud.md``).

    Examples
    --------
    >>> with Cluster(workers=2, cpus_per_worker=0.5) as c:          # doctest: +SKIP
    ...     c.run("import torch.distributed as dist; dist.get_rank()").values
    [0, 1]
    """

    def __init__(
        self,
        name: str | None = None,
        workers: int | None = None,
        cpus_per_worker: float | None = None,
        gpus_per_worker: float | None = None,
        address: str | None = None,
        dashboard: bool = False,
        backend: str = "auto",
        gpu_visibility: str = "own",
        timeouts: GroupTimeouts | None = None,
        **options: Any,
    ) -> None:
        if workers is not None and workers < 1:
            raise ValueError("--workers must be at least 1")
        if cpus_per_worker is not None and cpus_per_worker < 0:
            raise ValueError("--cpus-per-worker must be >= 0")
        if gpus_per_worker is not None and gpus_per_worker < 0:
            raise ValueError("--gpus-per-worker must be >= 0")
        if address is not None:
            address = _connect.normalise_address(address)
        # address="local": a local Ray even when RAY_ADDRESS names a cluster (None follows RAY_ADDRESS, as ray.init)
        self._local_requested = address == "local"
        if self._local_requested:
            address = None
        self.name = name or ""
        self.requested_workers = workers
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self.address = address
        self.dashboard = dashboard
        self.backend_request = backend
        self.gpu_visibility = gpu_visibility
        self.timeouts = timeouts or GroupTimeouts()
        self.options: dict[str, Any] = dict(options)
        self.log = RankLog()
        self.group: WorkerGroup | None = None
        self.connection: _connect.RayConnection | None = None
        self.created_at = time.time()
        self.started_at: float | None = None
        self.last_activity = time.time()
        self.state = "new"
        self._stop_hooks: list[Callable[[str], None]] = []
        self._cell_counter = 0
        self.cloud_state: Any = None  # a gpu_notebook.cloud.ClusterState once launched
        self.policies: Any = None  # the cost/idle watcher, when --idle-stop or --budget is given
        self._reaper: Any = None  # a gpu_notebook.cloud._reaper.Reaper while a cloud cluster may be running

    # ---- identity --------------------------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        if self.options.get("cloud"):
            return f"cloud:{self.options['cloud']}"
        return "local" if self.address is None else "address"

    @property
    def started_ray(self) -> bool:
        return bool(self.connection and self.connection.started_here)

    @property
    def world_size(self) -> int:
        return self.group.size if self.group else 0

    @property
    def backend(self) -> str | None:
        return self.group.backend if self.group else None

    @property
    def busy(self) -> bool:
        return bool(self.group and self.group.busy)

    @property
    def running(self) -> bool:
        return self.state == "running" and self.group is not None

    def __repr__(self) -> str:
        size = f"{self.world_size} workers" if self.group else f"{self.requested_workers or 'auto'} workers"
        return (
            f"<Cluster {self.name or '?'!r} {self.kind} {size}, {self.backend or 'no backend'}, {self.state}>"
        )

    def _repr_html_(self) -> str:
        if self.running:
            return self.status()._repr_html_()
        return f"<code>{html.escape(repr(self))}</code>"

    def __enter__(self) -> Cluster:
        if self.state != "running":
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def start(self, progress: Progress | None = None) -> Cluster:
        """Start (or connect to) Ray and the worker group; returns ``self``."""
        if self.state == "running":
            return self
        say = progress or (lambda msg: None)
        t0 = time.monotonic()
        manager = get_manager()
        if self.address is None and not self.options.get("cloud") and not self._local_requested:
            env = _connect.address_from_env()
            if env is not None:  # what ray.init() connects to: a notebook on a Ray cluster's node or pod
                try:
                    self.address = _connect.normalise_address(env)
                except _connect.ConnectError as exc:
                    raise _connect.ConnectError(f"RAY_ADDRESS: {exc}; unset it for a local Ray") from None
                say(
                    f"RAY_ADDRESS is set: using the Ray cluster at {env} (--address local starts a local Ray instead)"
                )
        if not self.name and self.options.get("cloud"):
            self.name = self.cloud_spec().name  # a valid cloud name (tags, labels), kept for the launch
        elif not self.name:
            self.name = manager.unique_name("local" if self.address is None else _address_name(self.address))
        elif manager.get(self.name, None) not in (None, self) and manager.get(self.name).running:
            raise ClusterError(
                f"a cluster named {self.name!r} is already running; pick another --name or stop it first"
            )
        if self.options.get("cloud"):
            self._refuse_second_connection()  # before paying for a launch this process could not connect to
            # replacement nodes (a spot preemption, autoscaling) take minutes to join: wait for them
            self.timeouts.placement = max(self.timeouts.placement, 900.0)
            self._launch_cloud(say)
        connection: _connect.RayConnection | None = None
        try:
            self._price_cloud_nodes(say)
            connection = self.connection = _connect.connect(
                self.address, dashboard=self.dashboard, progress=say
            )
            workers, cpus, gpus = self._size_workers()
            self.group = WorkerGroup(
                workers,
                cpus_per_worker=cpus,
                gpus_per_worker=gpus,
                backend=self.backend_request,
                gpu_visibility=self.gpu_visibility,
                runtime_env=self.options.get("runtime_env"),
                max_result_bytes=self.options.get("max_result_bytes"),
                timeouts=self.timeouts,
                log=self.log,
            )
            self.group.start(progress=say)
        except BaseException as exc:  # Ctrl-C too: launched instances must not be left running and untracked
            self.state = "failed"
            if isinstance(exc, KeyboardInterrupt):
                why = "interrupted while starting"
            elif connection is None:
                why = "the notebook could not connect to the new cluster"
            else:
                why = "the worker group could not start"
            try:
                self._teardown_cloud(say, why)  # first: it is what costs money
            finally:
                if connection is not None and self._last_user_of_connection(manager):
                    _connect.disconnect()
            raise
        self.state = "running"
        self.started_at = self.last_activity = time.time()
        manager.add(self)
        if self.options.get("idle_stop") or self.options.get("budget"):
            self.policies = attach_policies(
                self, idle_stop_minutes=self.options.get("idle_stop"), budget_usd=self.options.get("budget")
            )
            say(self._policy_text())
        nodes = len({p.node_id for p in self.group.plans})
        say(
            f"cluster {self.name!r} ready in {time.monotonic() - t0:.1f} s: {workers} worker(s) on {nodes} "
            f"node(s), {cpus:g} CPU{'' if not gpus else f' + {gpus:g} GPU'} each, torch.distributed "
            f"{self.group.backend}"
        )
        return self

    def _size_workers(self) -> tuple[int, float, float]:
        import ray

        total = ray.cluster_resources()
        cluster_gpus = int(total.get("GPU", 0))
        cluster_cpus = float(total.get("CPU", os.cpu_count() or 1))
        gpus = self.gpus_per_worker if self.gpus_per_worker is not None else (1 if cluster_gpus else 0)
        cloud_ranks = getattr(self, "_cloud_ranks", None)
        if cloud_ranks:
            workers = int(cloud_ranks)
        else:
            workers = self.requested_workers or (max(1, int(cluster_gpus // gpus)) if gpus else 2)
        if self.cpus_per_worker is not None:
            cpus = self.cpus_per_worker
        else:
            cpus = min(1.0, max(0.1, int(cluster_cpus / workers * 10) / 10))
        return workers, cpus, gpus

    def stop(self, reason: str = "stopped by the user") -> str:
        """End the workers and, if this cluster started Ray, Ray itself. Returns a one-line summary."""
        if self.state in ("stopped", "new"):
            return f"cluster {self.name!r} is not running"
        for hook in list(self._stop_hooks):
            try:
                hook(reason)
            except Exception as exc:  # noqa: BLE001 - a hook must not keep workers alive
                print(f"gpu_notebook: stop hook failed: {exc}", file=sys.stderr)
        n = self.world_size
        if self.group is not None:
            self.group.stop(f"cluster {self.name!r}: {reason}")  # (a cell still running reports this reason)
        manager = get_manager()
        last_user = self._last_user_of_connection(manager)
        shut_ray = bool(last_user and self.connection and self.connection.started_here)
        if last_user:  # a local Ray we started shuts down; a remote one is only disconnected from
            _connect.disconnect()
        self.state = "stopped"
        manager.remove(self)
        teardown = self._teardown_cloud(None, reason)
        msg = f"cluster {self.name!r} stopped: {n} worker(s) ended"
        if teardown:
            msg += f"; {teardown}"
        if shut_ray:
            msg += ", local Ray shut down"
        elif last_user:
            msg += f", disconnected from the Ray cluster at {self.connection.address if self.connection else '?'} (left running)"
        return msg

    def _last_user_of_connection(self, manager: Any) -> bool:
        """Whether ending this cluster should end the process's Ray connection: we opened it, it is still the
        live one (a failed start already closed its own, and a later cluster may have opened another), and no
        other cluster uses it."""
        conn = self.connection
        return bool(
            conn is not None
            and conn.owned
            and conn is _connect._CONNECTION
            and not manager.others_on_connection(self)
        )

    # ---- cloud ---------------------------------------------------------------------------------------------
    def cloud_spec(self) -> Any:
        """The provider-neutral spec of a ``cloud=`` cluster (see :mod:`gpu_notebook.cloud`)."""
        from gpu_notebook.cloud import spec_from_options

        o = self.options
        keys = (
            "head_instance_type",
            "image",
            "disk_gb",
            "spot_fallback",
            "max_workers",
            "project",
            "namespace",
            "connect",
        )
        extra = {k: o[k] for k in keys if o.get(k)}
        return spec_from_options(
            o["cloud"],
            region=o.get("region"),
            gpu=o.get("gpu"),
            instance_type=o.get("instance_type"),
            workers=self.requested_workers or 1,
            spot=bool(o.get("spot")),
            idle_stop=o.get("idle_stop"),
            name=self.name or None,
            **extra,
        )

    def plan(self) -> Any:
        """What ``start`` would launch for a cloud cluster, and its estimated cost: launches nothing."""
        from gpu_notebook.cloud import CloudLauncher

        if not self.options.get("cloud"):
            raise ClusterError("plan() is for cloud clusters: give cloud='aws'|'gcp'|'azure'|'kubernetes'")
        return CloudLauncher().plan(self.cloud_spec())

    def _refuse_second_connection(self) -> None:
        """A process holds one Ray connection: refuse a cloud start that could not connect, before launching."""
        ray = sys.modules.get("ray")
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
            f"it could not connect to a new {self.options['cloud']} cluster. Nothing was launched. Stop the "
            f"current cluster first ({how}; or ray.shutdown() if you called ray.init yourself), or start the "
            f"cloud cluster from another notebook (kernel)."
        )

    def _launch_cloud(self, say: Progress) -> None:
        from gpu_notebook.cloud import CloudLauncher

        spec = self.cloud_spec()
        self._start_reaper(str(spec.name), say)
        try:
            state = CloudLauncher().launch(spec, progress=say)  # cleans up itself when the launch fails
        except BaseException:
            self._release_reaper()
            raise
        self.cloud_state = state
        self.address = state.client_address or state.address
        # --workers counts cloud nodes; ranks are one per GPU of all worker nodes
        self._cloud_ranks = getattr(state, "world_size", None)

    def _price_cloud_nodes(self, say: Progress) -> None:
        """Let the cost meter (``--budget``, ``%gpu_cost``) price each node from what was launched.

        Sets ``options["node_pricing"]`` unless the user gave their own.
        """
        state = self.cloud_state
        if state is None:
            return
        from gpu_notebook.cloud import CloudNodePricing, node_pricing_for

        if not isinstance(self.options.get("node_pricing"), (type(None), CloudNodePricing)):
            return
        ref = weakref.ref(self)  # the pricing lives in self.options: no strong cycle

        def nodes() -> list[dict[str, Any]]:
            c = ref()
            return c.ray_nodes() if c is not None else []

        try:
            self.options["node_pricing"] = node_pricing_for(state, nodes=nodes)
        except Exception as exc:  # noqa: BLE001 - a price lookup must not fail a launched cluster
            say(f"cost: could not price the cloud nodes ({exc}); the cost meter counts them as $0")

    def _start_reaper(self, name: str, say: Progress) -> None:
        """A detached process that tears the cluster down if this kernel dies without doing it."""
        if self.options.get("reaper") is False:
            return
        from gpu_notebook.cloud import _reaper

        try:
            self._reaper = _reaper.start(name)
        except Exception as exc:  # noqa: BLE001
            say(
                f"WARNING: could not start the reaper process ({exc}): if this kernel dies, stop the cluster "
                f"from another one (%gpu_cluster stop {name})"
            )

    def _release_reaper(self) -> None:
        reaper = getattr(self, "_reaper", None)
        if reaper is not None:
            self._reaper = None
            reaper.release()

    def _teardown_cloud(self, say: Progress | None, reason: str) -> str:
        state = getattr(self, "cloud_state", None)
        if state is None:
            self._release_reaper()
            return ""
        from gpu_notebook.cloud import CloudLauncher

        report = CloudLauncher().teardown(state.name, progress=say)
        self.cloud_state = None
        self._release_reaper()  # only now: if this kernel dies during the teardown, the reaper finishes it
        return report.message() if callable(getattr(report, "message", None)) else str(report)

    def _policy_text(self) -> str:
        parts = []
        if self.options.get("idle_stop"):
            parts.append(f"idle stop after {self.options['idle_stop']:g} min")
        if self.options.get("budget"):
            parts.append(f"budget cap ${self.options['budget']:g}")
        return "watching: " + ", ".join(parts)

    def add_stop_hook(self, fn: Callable[[str], None]) -> None:
        """Call ``fn(reason)`` before the workers are stopped (budget and idle stops use this)."""
        self._stop_hooks.append(fn)

    def scale(self, workers: int, progress: Progress | None = None) -> str:
        """Grow or shrink the worker group; the process group is rebuilt and worker state is reset."""
        self._require_running()
        if workers < 1:
            raise ValueError("a cluster needs at least 1 worker")
        self._refuse_while_busy("scaling")
        old = self.world_size
        assert self.group is not None
        self.group.resize(workers, progress=progress)
        self.last_activity = time.time()
        return (
            f"cluster {self.name!r} scaled from {old} to {workers} worker(s). Worker state was reset: the "
            f"process group was rebuilt, so variables and models on the workers are gone."
        )

    def restart(self, progress: Progress | None = None) -> str:
        """Replace every worker with a fresh one (worker state is reset)."""
        self._require_running()
        self._refuse_while_busy("restarting")
        assert self.group is not None
        self.group.rebuild(progress=progress)
        return f"cluster {self.name!r}: {self.world_size} fresh worker(s); worker state was reset."

    def _refuse_while_busy(self, doing: str) -> None:
        # ending the workers under a running cell would leave it to rebuild the group at the same time
        if self.busy:
            raise ClusterError(
                f"a cell is running on cluster {self.name!r}: {doing} it now would end the workers under that "
                f"cell. Wait for the cell to finish, or interrupt it (the stop button), then try again."
            )

    def _require_running(self) -> None:
        if not self.running:
            raise ClusterError(
                f"cluster {self.name or '?'!r} is not running: start it with %gpu_cluster start"
            )

    # ---- status ------------------------------------------------------------------------------------------
    def ray_nodes(self) -> list[dict[str, Any]]:
        """The alive nodes of the Ray cluster (``ray.nodes()`` entries)."""
        return _connect.cluster_nodes()

    def status(self) -> ClusterStatus:
        """Nodes, workers (rank, node, pid, GPUs/CPUs, alive) and uptime."""
        nodes: list[NodeInfo] = []
        workers: list[WorkerInfo] = []
        if self.running:
            import ray

            for n in ray.nodes():
                res = n.get("Resources", {})
                nodes.append(
                    NodeInfo(
                        node_id=n["NodeID"],
                        ip=n.get("NodeManagerAddress", "?"),
                        cpus=res.get("CPU", 0),
                        gpus=res.get("GPU", 0),
                        alive=bool(n.get("Alive")),
                        is_head="node:__internal_head__" in res,
                    )
                )
            assert self.group is not None
            alive = self.group.alive()
            for plan, meta, ok in zip(self.group.plans, self.group.metas, alive, strict=False):
                workers.append(
                    WorkerInfo(
                        rank=plan.rank,
                        node_id=plan.node_id,
                        node_ip=plan.node_ip,
                        pid=meta["pid"],
                        gpu_ids=list(plan.gpu_ids),
                        num_cpus=self.group.cpus_per_worker,
                        num_gpus=self.group.gpus_per_worker,
                        alive=ok,
                        local_rank=plan.local_rank,
                    )
                )
        return ClusterStatus(
            name=self.name,
            kind=self.kind,
            address=self.connection.address if self.connection else (self.address or "local"),
            state=self.state,
            backend=self.backend,
            uptime_s=time.time() - self.started_at if self.started_at else 0.0,
            nodes=nodes,
            workers=workers,
        )

    def logs(self, rank: int | None = None, tail: int | None = 50) -> dict[int, list[str]]:
        """The recent output of each rank (kept on the driver, so a dead rank's last lines are still there)."""
        if tail is not None and tail < 1:
            raise ValueError(f"tail must be at least 1 line (got {tail})")
        if self.running:
            assert self.group is not None
            self.group.drain()
        known = sorted(set(self.log.ranks()) | set(range(self.world_size)))
        if (
            rank is not None and rank not in known
        ):  # a rank gone by a scale-down keeps its lines, and is known
            raise ValueError(
                f"cluster {self.name!r} has no rank {rank}: ranks {_fmt_ranks(known) if known else 'none yet'}"
            )
        ranks = [rank] if rank is not None else (self.log.ranks() or list(range(self.world_size)))
        return {r: self.log.tail(r, tail) for r in ranks}

    # ---- running code ----------------------------------------------------------------------------------------
    def run(
        self,
        code: str,
        ranks: str | Sequence[int] | None = None,
        timeout: float | None = None,
        stream: bool = True,
        sink: Callable[[str], None] | None = None,
        label: str | None = None,
        progress: Progress | None = None,
        header: str | None = None,
        max_result_bytes: int | None = None,
    ) -> CellResult:
        """Run ``code`` on the selected ranks (all by default): what ``%%distributed`` does.

        Output lines stream to ``sink`` (default: this process's stdout) prefixed ``[rank N]``; with
        ``stream=False`` they are collected and available in the result only. ``max_result_bytes``: the most
        a rank's value may take, pickled, for this cell (None: the cluster's limit, 64 MiB by default; 0: no
        limit); a larger value comes back as a placeholder that says how to fetch it.
        """
        self._require_running()
        assert self.group is not None
        self._cell_counter += 1
        if stream and sink is None:
            sink = _stdout_sink
        try:
            return self.group.run(
                code,
                ranks=ranks,
                timeout=timeout,
                sink=sink if stream else None,
                label=label or f"distributed-cell-{self._cell_counter}",
                progress=progress,
                header=header,
                max_result_bytes=max_result_bytes,
            )
        finally:
            self.last_activity = time.time()

    def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        ranks: str | Sequence[int] | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` in every selected rank's process; returns the values in rank order.

        Raises
        ------
        DistributedError
            When any rank fails, with each distinct traceback once.
        """
        self._require_running()
        assert self.group is not None
        try:
            result = self.group.call(fn, args, kwargs, ranks=ranks, timeout=timeout)
        finally:
            self.last_activity = time.time()
        result.raise_for_failures(self.world_size)
        return list(result.values)

    def push(self, ranks: str | Sequence[int] | None = None, **values: Any) -> None:
        """Send values to the workers' namespaces: ``c.push(lr=0.1, data=batch)``."""
        self._require_running()
        assert self.group is not None
        self.group.push(values, ranks=ranks)

    def pull(self, name: str, rank: int = 0) -> Any:
        """Bring a variable back from one rank's namespace."""
        self._require_running()
        assert self.group is not None
        return self.group.pull(name, rank)


def _stdout_sink(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _fmt_ranks(ranks: list[int]) -> str:
    return (
        f"{ranks[0]}-{ranks[-1]}"
        if ranks == list(range(ranks[0], ranks[-1] + 1))
        else ", ".join(map(str, ranks))
    )


def _address_name(address: str) -> str:
    body = address.replace("ray://", "")
    return "ray" if body == "auto" else body.split(":")[0]


_ALL: weakref.WeakSet[Cluster] = weakref.WeakSet()
