"""The Cluster object: one Ray cluster and its persistent worker group, whatever the Ray cluster's origin.

Where the Ray cluster comes from (started here, reached by address, launched in a cloud) is its provider's
business (:mod:`gpu_notebook.cluster.providers`); this module does what is the same for all of them: connect,
size and start the worker group, run code, stop in order.
"""

from __future__ import annotations

import html
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, overload

from gpu_notebook import cost
from gpu_notebook._display import Progress, format_ranks
from gpu_notebook._registry import get_manager
from gpu_notebook.cluster import _connect, _package_check
from gpu_notebook.cluster._errors import ClusterError, not_running
from gpu_notebook.cluster._run import debug, run_in_background
from gpu_notebook.cluster._sizing import size_workers
from gpu_notebook.cluster._status import (
    ClusterStatus,
    LifecycleState,
    NodeInfo,
    WorkerInfo,
    cluster_status,
)
from gpu_notebook.cluster.options import CloudLaunch, ClusterOptions, Policies, Resources, Runtime
from gpu_notebook.cluster.options import gather as gather_settings
from gpu_notebook.cluster.providers import (
    AddressProvider,
    CloudProvider,
    LocalProvider,
    Provider,
    cloud_spec,
)
from gpu_notebook.distributed import (
    NATIVE_TIMEOUT_S,
    BackgroundCell,
    CellResult,
    GroupTimeouts,
    RankLog,
    StacksReport,
    WorkerGroup,
    gather_stacks,
    nccl_needs_gpus,
    refuse_second,
)

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook import cloud

__all__ = ["Cluster", "ClusterError", "ClusterStatus", "NodeInfo", "WorkerInfo"]

_LOCAL = LocalProvider()
_ADDRESS = AddressProvider()


class Cluster:
    """A Ray cluster and a persistent group of rank workers with torch.distributed initialised.

    Parameters
    ----------
    name
        How ``%gpu_cluster list`` and ``use`` refer to it (default ``local``, ``local-2``, ... or the address).
    address
        ``None`` starts a local Ray cluster on this machine, or, as ``ray.init()`` does, connects to the cluster
        named by the ``RAY_ADDRESS`` environment variable when it is set; ``local`` always starts a local one;
        ``auto``, ``host:port`` or ``ray://host:port`` connects to an existing one (an address where nothing
        answers fails within seconds).
    timeouts
        How long the worker group waits for placement, start and replies (a
        :class:`~gpu_notebook.distributed.GroupTimeouts`).
    resources, runtime, policies, launch
        The settings, grouped (see :mod:`gpu_notebook.cluster.options`): :class:`Resources` (``workers``,
        ``cpus_per_worker``, ``gpus_per_worker``, ``backend``), :class:`Runtime` (``gpu_visibility``,
        ``dashboard``, ``worker_setup``, ``runtime_env``, ``ship_package``, ``max_result_bytes``),
        :class:`Policies` (``idle_stop``, ``budget``, ``on_budget_checkpoint``, ``budget_checkpoint_timeout_s``,
        ``node_pricing``) and :class:`CloudLaunch` (``cloud``, ``region``, ``gpu``, ``spot``, ``reaper``, ...).
    **settings
        Each field of those dataclasses, as a keyword of its own name: ``Cluster(workers=2)`` is
        ``Cluster(resources=Resources(workers=2))``. A keyword that names no setting, or a setting given both
        ways, is a ``TypeError``; a value out of range a ``ValueError``.

    Examples
    --------
    >>> with Cluster(workers=2, cpus_per_worker=0.5) as c:          # doctest: +SKIP
    ...     c.run("import torch.distributed as dist; dist.get_rank()").values
    [0, 1]
    """

    #: the classes ``Cluster(detach=True)`` makes (registered by ``._detached`` at its import: it imports this
    #: module, so this one cannot import it)
    variants: dict[str, type[Cluster]] = {}

    def __new__(cls, *args: Any, **kwargs: Any) -> Cluster:
        detach = kwargs.get("detach") or getattr(kwargs.get("runtime"), "detach", False)
        if cls is Cluster and detach:
            cls = Cluster.variants["detach"]
        return super().__new__(cls)

    def __init__(
        self,
        name: str | None = None,
        *,
        address: str | None = None,
        timeouts: GroupTimeouts | None = None,
        resources: Resources | None = None,
        runtime: Runtime | None = None,
        policies: Policies | None = None,
        launch: CloudLaunch | None = None,
        **settings: Any,
    ) -> None:
        groups = {"resources": resources, "runtime": runtime, "policies": policies, "launch": launch}
        #: every setting, in its group's frozen dataclass
        self.settings: ClusterOptions = gather_settings(groups, settings)
        if address is not None:
            address = _connect.normalise_address(address)
        # address="local": a local Ray even when RAY_ADDRESS names a cluster (None follows RAY_ADDRESS, as ray.init)
        self._local_requested = address == "local"
        if self._local_requested:
            address = None
        self.name = name or ""
        self.address = address
        self.timeouts = timeouts or GroupTimeouts()
        # what the cost meter prices the nodes by: the user's, else what a cloud provider sets once launched
        self.node_pricing: Any = self.settings.policies.node_pricing
        self.log = RankLog()
        self.group: WorkerGroup | None = None
        self.connection: _connect.RayConnection | None = None
        self.created_at = time.time()
        self.started_at: float | None = None
        self.last_activity = time.time()
        self.state: LifecycleState = "new"
        self._stop_hooks: list[Callable[[str], None]] = []
        self._cell_counter = 0
        self.policies: Any = None  # the cost/idle watcher, when --idle-stop or --budget is given
        self._cloud: CloudProvider | None = None  # made on first use by a cloud= cluster

    # ---- identity --------------------------------------------------------------------------------------------
    @property
    def provider(self) -> Provider:
        """Where this cluster's Ray comes from: cloud nodes (``cloud=``), this machine, or an address."""
        if self.settings.launch.cloud:
            if self._cloud is None:
                self._cloud = CloudProvider(str(self.settings.launch.cloud))
            return self._cloud
        return _LOCAL if self.address is None else _ADDRESS

    @property
    def options(self) -> Mapping[str, Any]:
        """The settings that are not None, by keyword, read-only: what the cost layer reads (it cannot import
        this package's dataclasses); the rest of the library reads :attr:`settings`."""
        flat = self.settings.flat()
        flat.pop("node_pricing", None)
        if self.node_pricing is not None:
            flat["node_pricing"] = self.node_pricing
        return MappingProxyType(flat)

    @property
    def kind(self) -> str:
        return self.provider.kind

    @property
    def cloud_state(self) -> cloud.ClusterState | None:
        """What a ``cloud=`` cluster launched (a :class:`gpu_notebook.cloud.ClusterState`), until torn down."""
        return self._cloud.state if self._cloud is not None else None

    @property
    def _reaper(self) -> Any:
        return self._cloud.reaper if self._cloud is not None else None

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
        size = (
            f"{self.world_size} workers"
            if self.group
            else f"{self.settings.resources.workers or 'auto'} workers"
        )
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

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- lifecycle -----------------------------------------------------------------------------------------
    def start(self, progress: Progress | None = None) -> Cluster:
        """Start (or connect to) Ray and the worker group; returns ``self``.

        The steps, in order: name the cluster, launch its Ray (:class:`~gpu_notebook.cluster.providers.Provider`),
        then, guarded (a failure or the stop button rolls back what was made), connect, size and start the
        workers; then the cost policies.
        """
        if self.state == "running":
            return self
        say = progress or (lambda msg: None)
        t0 = time.monotonic()
        manager = get_manager()
        self._follow_ray_address(say)
        provider = self.provider
        self._take_name(provider, manager)
        provider.launch(self, say)
        workers, cpus, gpus = self._start_guarded(provider, manager, say)
        self.state = "running"
        self.touch()
        self.started_at = self.last_activity
        manager.add(self)
        self._attach_policies(say)
        assert self.group is not None
        nodes = len({p.node_id for p in self.group.plans})
        say(
            f"cluster {self.name!r} ready in {time.monotonic() - t0:.1f} s: {workers} worker(s) on {nodes} "
            f"node(s), {cpus:g} CPU{'' if not gpus else f' + {gpus:g} GPU'} each, torch.distributed "
            f"{self.group.backend}"
        )
        return self

    def _take_name(self, provider: Provider, manager: Any) -> None:
        """The provider's default name, or the one given, unless a running cluster has it."""
        if not self.name:
            self.name = provider.default_name(self, manager)
        elif manager.get(self.name, None) not in (None, self) and manager.get(self.name).running:
            raise ClusterError(
                f"a cluster named {self.name!r} is already running; pick another --name or stop it first"
            )

    def _start_guarded(self, provider: Provider, manager: Any, say: Progress) -> tuple[int, float, float]:
        """Connect, size and start the worker group; on any failure (Ctrl-C too: launched instances must not be
        left running and untracked) tear down what the provider launched and close our connection, then raise.
        Returns the workers, CPUs and GPUs each."""
        connection: _connect.RayConnection | None = None
        try:
            provider.launched(self, say)
            connection = self.connection = _connect.connect(
                self.address,
                dashboard=self.settings.runtime.dashboard,
                progress=say,
                runtime_env=_package_check.job_env(
                    self.address, self.settings.runtime.ship_package, self.settings.launch.cloud
                ),
            )
            return self._start_group(provider, say)
        except BaseException as exc:
            self.state = "failed"
            if isinstance(exc, KeyboardInterrupt):
                why = "interrupted while starting"
            elif connection is None:
                why = "the notebook could not connect to the new cluster"
            else:
                why = "the worker group could not start"
            try:
                provider.teardown(self, say, why)  # first: it is what costs money
            finally:
                if connection is not None and self._last_user_of_connection(manager):
                    _connect.disconnect()
            raise

    def _start_group(self, provider: Provider, say: Progress) -> tuple[int, float, float]:
        """Size the worker group on the connected Ray cluster and start it; returns its sizes."""
        workers, cpus, gpus = self._size_workers()
        backend = self.settings.resources.backend
        if backend == "nccl" and not gpus:  # before any worker starts: they would all fail
            raise ClusterError(nccl_needs_gpus("this cluster has no GPUs"))
        runtime_env, worker_env = provider.worker_env(self, say)  # --working-dir, --pip, --env
        self.group = self._new_group(
            workers,
            cpus_per_worker=cpus,
            gpus_per_worker=gpus,
            backend=backend,
            gpu_visibility=self.settings.runtime.gpu_visibility,
            env=worker_env,
            runtime_env=runtime_env,
            max_result_bytes=self.settings.runtime.max_result_bytes,
            timeouts=self.timeouts,
            log=self.log,
        )
        self.group.start(progress=say)
        return workers, cpus, gpus

    def _attach_policies(self, say: Progress) -> None:
        """The idle stop and the budget cap, when asked for."""
        policies = self.settings.policies
        if policies.idle_stop or policies.budget:
            self.policies = cost.attach_policies(
                self, idle_stop_minutes=policies.idle_stop, budget_usd=policies.budget
            )
            say(self._policy_text())

    def _follow_ray_address(self, say: Progress) -> None:
        """No address and no cloud: use the cluster ``RAY_ADDRESS`` names, as ``ray.init()`` does."""
        if self.address is not None or self.settings.launch.cloud or self._local_requested:
            return
        env = _connect.address_from_env()
        if env is None:
            return
        # a notebook on a Ray cluster's node or pod
        try:
            self.address = _connect.normalise_address(env)
        except _connect.ConnectError as exc:
            raise _connect.ConnectError(f"RAY_ADDRESS: {exc}; unset it for a local Ray") from None
        say(
            f"RAY_ADDRESS is set: using the Ray cluster at {env} (--address local starts a local Ray instead)"
        )

    def _new_group(self, workers: int, **kwargs: Any) -> WorkerGroup:
        """The worker group to start (a workshop student's is placed by the workshop's broker)."""
        return WorkerGroup(workers, **kwargs)

    def _size_workers(self) -> tuple[int, float, float]:
        return size_workers(self)

    def kernel_shutdown(self) -> str:
        """The Jupyter kernel is asked to shut down or restart: stop as at its exit, now, while it has the time
        (a cloud cluster's provider hands its teardown to the reaper instead). See
        :meth:`gpu_notebook._registry.ClusterManager.kernel_shutdown`."""
        if not self.provider.stops_at_kernel_shutdown(self):
            # not stopped again at the kernel's exit (which now comes at once): a second ``ray down`` would race
            # the reaper's, and the stop would release the reaper's lease
            get_manager().remove(self)
            return f"cluster {self.name!r}: its teardown is left to the reaper process"
        return self.stop("kernel exit")

    def stop(self, reason: str = "stopped by the user") -> str:
        """End the workers and, if this cluster started Ray, Ray itself. Returns a one-line summary."""
        if self.state in ("stopped", "new"):
            return f"cluster {self.name!r} is not running"
        if self.state == "stopping":  # another thread (a budget stop, say) is ending it now
            return f"cluster {self.name!r} is already being stopped"
        manager = get_manager()
        self.state = "stopping"  # every view says so at once, not "running" while the workers end
        try:
            for hook in list(self._stop_hooks):
                try:
                    hook(reason)
                except Exception as exc:  # noqa: BLE001 - a hook must not keep workers alive
                    print(f"gpu_notebook: stop hook failed: {exc}", file=sys.stderr)
            n = self.world_size
            if self.group is not None:
                self.group.stop(reason)  # a running cell's error says "Cluster stopped: <reason>"
            last_user = self._last_user_of_connection(manager)
            shut_ray = bool(last_user and self.connection and self.connection.started_here)
            if last_user:  # a local Ray we started shuts down; a remote one is only disconnected from
                _connect.disconnect()
        finally:  # even when ending the workers failed: they are not running for anyone to use
            self.state = "stopped"
            manager.remove(self)
        teardown = self.provider.teardown(self, None, reason)
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
            and conn is _connect.recorded_connection()
            and not manager.others_on_connection(self)
        )

    @staticmethod
    def attach(name: str, **kwargs: Any) -> Cluster:
        """Re-bind the workers of the detached cluster ``name`` with their state (``address=``, ``take=``,
        ``progress=``: see :func:`gpu_notebook.cluster._detached.attach`)."""
        return Cluster.variants["detach"].attach(name, **kwargs)

    # ---- cloud ---------------------------------------------------------------------------------------------
    def cloud_spec(self) -> cloud.ClusterSpec:
        """The provider-neutral spec of a ``cloud=`` cluster (see :mod:`gpu_notebook.cloud`)."""
        return cloud_spec(self)

    def plan(self) -> cloud.Plan:
        """What ``start`` would launch for a cloud cluster, and its estimated cost: launches nothing."""
        provider = self.provider
        if not isinstance(provider, CloudProvider):
            raise ClusterError("plan() is for cloud clusters: give cloud='aws'|'gcp'|'azure'|'kubernetes'")
        return provider.plan(self)

    def _policy_text(self) -> str:
        parts = []
        policies = self.settings.policies
        if policies.idle_stop:
            parts.append(f"idle stop after {policies.idle_stop:g} min")
        if policies.budget:
            parts.append(f"budget cap ${policies.budget:g}")
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
        self.touch()
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
        refuse_second(self.group, doing)
        if self.busy:
            raise ClusterError(
                f"a cell is running on cluster {self.name!r}: {doing} it now would end the workers under that "
                f"cell. Wait for the cell to finish, or interrupt it (the stop button), then try again."
            )

    def _require_running(self) -> None:
        if not self.running:
            raise not_running(self.name)

    def touch(self) -> None:
        """Note activity now (a cell, a call, a resize ended): the idle stop counts from the last one."""
        self.last_activity = time.time()

    def await_stop(self, result: CellResult, limit_s: float = 30.0) -> None:
        """When ``result`` ended because the cluster was stopped from another thread (a budget or idle stop),
        wait until that thread has ended the workers (at most ``limit_s``): the cell's error then comes once the
        cluster says "stopped", so every view agrees with it."""
        if not any(f.kind == "stopped" for f in result.failures):
            return
        deadline = time.monotonic() + limit_s
        while self.state == "stopping" and time.monotonic() < deadline:
            time.sleep(0.02)

    # ---- status ------------------------------------------------------------------------------------------
    def ray_nodes(self) -> list[dict[str, Any]]:
        """The alive nodes of the Ray cluster (``ray.nodes()`` entries)."""
        return _connect.cluster_nodes()

    def status(self) -> ClusterStatus:
        """Nodes, workers (rank, node, pid, GPUs/CPUs, alive) and uptime."""
        return cluster_status(self)

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
                f"cluster {self.name!r} has no rank {rank}: ranks {format_ranks(known) if known else 'none yet'}"
            )
        ranks = [rank] if rank is not None else (self.log.ranks() or list(range(self.world_size)))
        return {r: self.log.tail(r, tail) for r in ranks}

    def stacks(self, timeout: float = 5.0, native: bool = False) -> StacksReport:
        """Each rank's Python stack of every thread, also while a cell runs; ranks silent for ``timeout`` s are
        named as not answering; ``native``: also the cell thread's native frames, by py-spy on the workers (see
        :mod:`gpu_notebook.distributed._stacks`)."""
        self._require_running()
        assert self.group is not None
        return gather_stacks(
            self.group.workers, timeout + (NATIVE_TIMEOUT_S if native else 0.0), native=native
        )

    # ---- running code ----------------------------------------------------------------------------------------
    @overload
    def run(
        self, code: str, ranks: str | Sequence[int] | None = ..., timeout: float | None = ...,
        stream: bool = ..., sink: Callable[[str], None] | None = ..., label: str | None = ...,
        progress: Progress | None = ..., header: str | None = ..., max_result_bytes: int | None = ...,
        block: Literal[True] = ...,
    ) -> CellResult: ...  # fmt: skip
    @overload
    def run(
        self, code: str, ranks: str | Sequence[int] | None = ..., timeout: float | None = ...,
        stream: bool = ..., sink: Callable[[str], None] | None = ..., label: str | None = ...,
        progress: Progress | None = ..., header: str | None = ..., max_result_bytes: int | None = ...,
        *, block: Literal[False], name: str | None = ..., live: bool = ...,
        on_done: Callable[[BackgroundCell], None] | None = ...,
    ) -> BackgroundCell: ...  # fmt: skip
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
        block: bool = True,
        *,
        name: str | None = None,
        live: bool = False,
        on_done: Callable[[BackgroundCell], None] | None = None,
    ) -> CellResult | BackgroundCell:
        """Run ``code`` on the selected ranks (all by default): what ``%%distributed`` does.

        Output lines stream to ``sink`` (default: this process's stdout) prefixed ``[rank N]``; with
        ``stream=False`` they are collected and available in the result only. ``max_result_bytes``: the most
        a rank's value may take, pickled, for this cell (None: the cluster's limit, 64 MiB by default; 0: no
        limit); a larger value comes back as a placeholder that says how to fetch it. ``block=False`` returns
        a :class:`~gpu_notebook.distributed._background.BackgroundCell` at once (``.get()`` waits for the
        values); while it runs, another cell on these workers is refused (BusyError). A background cell's
        ``name`` is how :func:`~gpu_notebook.distributed._background.find` knows it (default: a count); ``live``
        keeps its view updated in a Jupyter kernel; ``on_done(cell)`` is called when it ends.
        """
        self._require_running()
        assert self.group is not None
        refuse_second(self.group)
        self._cell_counter += 1
        if not block:
            return run_in_background(
                self, code, ranks=ranks, timeout=timeout, sink=sink, header=header,
                label=label or f"distributed-cell-{self._cell_counter}", name=name or str(self._cell_counter),
                max_result_bytes=max_result_bytes, live=live, on_done=on_done,
            )  # fmt: skip
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
            self.touch()

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
        refuse_second(self.group)
        try:
            result = self.group.call(fn, args, kwargs, ranks=ranks, timeout=timeout)
        finally:
            self.touch()
        result.raise_for_failures(self.world_size)
        return list(result.values)

    def debug(self, rank: int | None = None, read: Callable[[str], str] | None = None) -> None:
        """pdb on the ranks paused at a ``breakpoint()``, else post-mortem on ``rank``'s last failed cell (default:
        the lowest failed rank): what ``%gpu_debug`` does; ``read`` asks for each command (default ``input``)."""
        debug(self, rank, read)

    def push(self, ranks: str | Sequence[int] | None = None, **values: Any) -> None:
        """Send values to the workers' namespaces: ``c.push(lr=0.1, data=batch)``."""
        self._require_running()
        assert self.group is not None
        self.group.push(values, ranks=ranks)

    def pull(self, name: str, rank: int = 0, keep_device: bool = False) -> Any:
        """Bring a variable back from one rank's namespace; its tensors come to the CPU, as a cell's value's
        do, unless ``keep_device`` (then a CUDA tensor needs a GPU here to be rebuilt)."""
        self._require_running()
        assert self.group is not None
        return self.group.pull(name, rank, keep_device=keep_device)


def _stdout_sink(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
