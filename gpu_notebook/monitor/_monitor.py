"""The :class:`Monitor`: samplers on every node of a cluster (or this machine), one aggregator, exports.

``Monitor(cluster)`` places one sampler actor per Ray node (``cluster.ray_nodes()``) with
``NodeAffinitySchedulingStrategy``, each node on its own: a node whose sampler does not start within
``node_timeout`` (gone, full, unreachable) is shown as down with the reason and retried later with a growing
delay, while the other nodes are sampled from the start; ``Monitor.local()`` samples just this machine in a thread, no Ray needed;
``Monitor(samplers=[...])`` takes ready-made samplers (fake nodes in tests and benchmarks). A background thread
pulls what is new once per ``pull_interval``. Everything a widget or magic shows comes from here.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

from gpu_notebook import _registry
from gpu_notebook._display import error_line
from gpu_notebook.monitor._advice import Advice, advise, utilisation_summary_from
from gpu_notebook.monitor._aggregator import Aggregator, LocalHandle, RayHandle
from gpu_notebook.monitor._export import PrometheusServer, host_csv, monitor_text, nvidia_smi_csv
from gpu_notebook.monitor._html import snapshot_table_html, snapshot_table_text
from gpu_notebook.monitor._sampler import NodeSampler, sampler_actor_class

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._shapes import (
        GpuProcess,
        GpuSeries,
        HostSeries,
        Latest,
        MonitoredCluster,
        UtilisationSummary,
    )
    from gpu_notebook.widgets import MonitorWidget

__all__ = [
    "Monitor",
    "busiest_utilisation",
    "monitor_for",
    "running_monitor",
    "stop_monitors",
    "utilisation_summary",
]


class Monitor:
    """Live GPU (or host) metrics of every node of a cluster.

    Parameters
    ----------
    cluster
        A :class:`gpu_notebook.Cluster` (anything with ``ray_nodes()``); one sampler actor per node.
        ``None`` with no ``samplers`` means this machine only (same as :meth:`local`).
    interval
        Sampling period on each node (default 0.5 s = 2 Hz).
    pull_interval
        How often the aggregator pulls new rows (default 1 s).
    slow_interval
        Slow-tier period (process lists, PCIe), at least 10 s.
    history_s
        Seconds of full-rate history kept per node (default one hour).
    nvml
        ``"auto"``, ``None``, an NVML-like module, or a factory (e.g. ``lambda: FakeNVML(8)``), per node.
    samplers
        Ready-made samplers instead of creating them: :class:`NodeSampler` objects or sampler actor handles.
    clock
        Wall-clock seconds; inject a simulated clock in tests (then call :meth:`pull` yourself).
    autopull
        Pull in a background thread after :meth:`start` (default True).
    sampler_cpus
        Logical CPUs each sampler actor reserves (default 0: none). A sampler must start on a node whose CPUs
        the workers hold (the default on a small machine), and an actor that reserves nothing neither waits
        for them nor keeps an autoscaled node alive; a sampler uses well under 1% of a core.
    node_timeout
        Seconds a new node's sampler actor gets to start (default 20). :meth:`start` waits at most this long
        (for all nodes at once, each registered as soon as it answers); a node that misses it is listed in
        :attr:`failed_nodes` and retried in the background.
    retry_s
        Delay before the first retry of a node whose sampler did not start (default 15 s); it doubles on each
        failure, up to 5 minutes.

    Examples
    --------
    >>> mon = Monitor.local(interval=0.5).start()      # doctest: +SKIP
    >>> mon.latest()["hosts"][0]["cpu_percent"]          # doctest: +SKIP
    """

    def __init__(
        self,
        cluster: MonitoredCluster | None = None,
        *,
        interval: float = 0.5,
        pull_interval: float = 1.0,
        slow_interval: float = 10.0,
        history_s: float = 3600.0,
        nvml: Any = "auto",
        samplers: Iterable[Any] | None = None,
        clock: Callable[[], float] | None = None,
        autopull: bool = True,
        advice_window: float = 300.0,
        advice_threshold: float = 70.0,
        timeout: float = 0.5,
        sampler_cpus: float = 0.0,
        node_timeout: float = 20.0,
        retry_s: float = 15.0,
    ) -> None:
        self.cluster = cluster
        self.node_timeout = max(0.1, float(node_timeout))
        self.retry_s = max(0.05, float(retry_s))
        self.sampler_cpus = float(sampler_cpus)
        self.interval = float(interval)
        self.pull_interval = max(0.05, float(pull_interval))
        self.slow_interval = float(slow_interval)
        self.history_s = float(history_s)
        self.nvml = nvml
        self.clock = clock or time.time
        self.autopull = autopull
        self.advice_window = float(advice_window)
        self.advice_threshold = float(advice_threshold)
        self._given = list(samplers) if samplers is not None else None
        self.aggregator = Aggregator(history_s=history_s, timeout=timeout, clock=self.clock)
        self._own_local: list[NodeSampler] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._servers: list[PrometheusServer] = []
        self._listeners: list[Callable[[Monitor], None]] = []
        self._sync_lock = threading.Lock()
        self._starting: dict[str, _Starting] = {}  # node -> sampler actor created, not answered yet
        self._failed: dict[str, _Failure] = {}  # node -> why its sampler did not start, when to retry
        self._failed_lock = threading.Lock()  # held only to change or copy _failed (readers: widget, repr)
        self.started = False
        self.created_at = self.clock()
        _registry.stop_at_exit(self, _signal_stop)

    @classmethod
    def local(cls, **kwargs: Any) -> Monitor:
        """A monitor of this machine only (no Ray)."""
        return cls(None, **kwargs)

    # -- lifecycle ------------------------------------------------------------------------------------------------
    @property
    def kind(self) -> Literal["samplers", "local", "cluster"]:
        if self._given is not None:
            return "samplers"
        return "local" if self.cluster is None else "cluster"

    def start(self) -> Monitor:
        """Create/start the samplers and the pull thread (idempotent); returns self."""
        if self.started:
            return self
        if self._given is not None:
            for s in self._given:
                self.aggregator.add(_handle_for(s))
        elif self.cluster is None:
            s = NodeSampler(
                nvml=self.nvml,
                interval=self.interval,
                slow_interval=self.slow_interval,
                history_s=self.history_s,
                clock=self.clock if self.clock is not time.time else None,
            )
            s.tick()  # a first sample right away, so a dashboard shown now is not empty
            s.start()
            self._own_local.append(s)
            self.aggregator.add(LocalHandle(s))
        else:
            # started again after stop(): the sampler actors stop() ended are gone; each node gets a new one below
            for node, h in list(self.aggregator.handles.items()):
                if isinstance(h, RayHandle):
                    self.aggregator.remove(node)
            self.sync_nodes()
            hook = getattr(self.cluster, "add_stop_hook", None)
            if hook is not None:
                ref = weakref.ref(self)

                def _on_cluster_stop(reason: str) -> None:
                    m = ref()
                    if m is not None:
                        m.stop()

                hook(_on_cluster_stop)
        self.started = True
        self._stop.clear()
        self.pull()
        if self.autopull:
            self._thread = threading.Thread(target=self._run, daemon=True, name="gpu_notebook-monitor-pull")
            self._thread.start()
        return self

    def sync_nodes(self, timeout: float | None = None) -> list[str]:
        """Cluster mode: start a sampler on every Ray node that has none; returns the nodes registered now.

        Every node's sampler is started and checked on its own: this waits at most ``timeout`` seconds (default
        ``node_timeout``) and registers each node as soon as its sampler answers. A node whose sampler failed or
        did not answer within ``node_timeout`` goes to :attr:`failed_nodes` and is retried after a delay that
        doubles each time (``retry_s`` up to 5 minutes); the pull thread does that without waiting.
        """
        if self.cluster is None:
            return []
        nodes = [n for n in self.cluster.ray_nodes() if n.get("Alive", True)]
        with self._sync_lock:
            self._launch_all(nodes)
            return self._settle(self.node_timeout if timeout is None else float(timeout))

    def _launch_all(self, nodes: list[dict[str, Any]]) -> None:
        alive = {str(n["NodeID"]) for n in nodes}
        with self._failed_lock:
            for node in [n for n in self._failed if n not in alive]:  # it left the cluster: stop retrying
                del self._failed[node]
        for n in nodes:
            self._launch(str(n["NodeID"]), str(n.get("NodeManagerAddress", "")))

    def _launch(self, node_id: str, ip: str) -> None:
        """Create the sampler actor of one node, unless it has one, one is starting, or its retry is not due."""
        if node_id in self.aggregator.handles or node_id in self._starting:
            return
        failure = self._failed.get(node_id)
        if failure is not None and time.monotonic() < failure.retry_at:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        attempts = failure.attempts if failure is not None else 0
        try:
            actor = (
                sampler_actor_class()
                .options(
                    num_cpus=self.sampler_cpus,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                )
                .remote(
                    node_id=node_id,
                    nvml=self.nvml,
                    interval=self.interval,
                    slow_interval=self.slow_interval,
                    history_s=self.history_s,
                    labels={"ip": ip},
                )
            )
            ref = actor.info.remote()
        except Exception as exc:  # noqa: BLE001 - any Ray error here is this node's failure, retried later
            self._fail(node_id, ip, f"{type(exc).__name__}: {exc}")
            return
        # a retry after repeated failures gets longer to start (a slow node is not killed over and over)
        limit = self.node_timeout * min(2**attempts, 8)
        self._starting[node_id] = _Starting(actor, ref, ip, time.monotonic() + limit, limit)

    def _settle(self, wait: float) -> list[str]:
        """Register the starting samplers that answered (waiting up to ``wait`` s); fail the late or broken."""
        if not self._starting:
            return []
        import ray

        added: list[str] = []
        deadline = time.monotonic() + max(0.0, wait)
        while self._starting:
            by_ref = {st.ref: node for node, st in self._starting.items()}
            ready, _ = ray.wait(list(by_ref), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for ref in ready:
                node = by_ref[ref]
                st = self._starting.pop(node)
                try:
                    info = ray.get(ref)
                # unschedulable (node gone), sampler crashed in __init__, ...: this node's failure, retried later
                except Exception as exc:  # noqa: BLE001
                    self._kill(st.actor)
                    self._fail(node, st.ip, error_line(exc))
                    continue
                self.aggregator.add(RayHandle(st.actor, node, info))
                with self._failed_lock:
                    self._failed.pop(node, None)
                added.append(node)
        now = time.monotonic()
        for node, st in list(self._starting.items()):
            if now + 0.1 >= st.deadline:  # (ray.wait may return a hair early)
                del self._starting[node]
                self._kill(st.actor)
                self._fail(
                    node,
                    st.ip,
                    f"sampler did not start within {st.limit:g} s (node full, busy or "
                    "unreachable; Ray keeps it pending)",
                )
        return added

    def _fail(self, node_id: str, ip: str, reason: str) -> None:
        prev = self._failed.get(node_id)
        attempts = (prev.attempts if prev is not None else 0) + 1
        delay = min(self.retry_s * 2 ** (attempts - 1), _MAX_RETRY_S)
        with self._failed_lock:
            self._failed[node_id] = _Failure(reason, ip, attempts, delay, time.monotonic() + delay)

    @staticmethod
    def _kill(actor: Any) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - the actor (or its node, or Ray) may already be gone: nothing to end
            pass

    def _background_sync(self, full: bool) -> None:
        """From the pull thread: never waits. ``full`` also asks Ray for the node list (new nodes)."""
        if full:  # (the pull thread calls it only in cluster mode)
            nodes = [n for n in cast("MonitoredCluster", self.cluster).ray_nodes() if n.get("Alive", True)]
        if not self._sync_lock.acquire(blocking=False):
            return  # sync_nodes() runs in another thread
        try:
            if full:
                self._launch_all(nodes)
            else:
                now = time.monotonic()
                with self._failed_lock:
                    due = [(node, f.ip) for node, f in self._failed.items() if now >= f.retry_at]
                for node, ip in due:
                    self._launch(node, ip)
            self._settle(0.0)
        finally:
            self._sync_lock.release()

    @property
    def failed_nodes(self) -> dict[str, str]:
        """Nodes whose sampler could not be started (cluster mode), with the reason; they are retried."""
        with self._failed_lock:
            items = list(self._failed.items())
        return {node: f"{f.reason} (attempt {f.attempts}; retried after {f.delay:g} s)" for node, f in items}

    def _run(self) -> None:
        k = 0
        # the pull thread lives as long as the monitor: a failed round (Ray busy, a node going) is retried next time
        while not self._stop.wait(self.pull_interval):
            try:
                self.pull()
            except Exception:  # noqa: BLE001 - the pull thread must outlive a failed round
                pass
            k += 1
            if self.cluster is not None and self.kind == "cluster":
                try:
                    self._background_sync(full=k % 15 == 0)
                except Exception:  # noqa: BLE001 - as above: retried next round
                    pass

    def pull(self) -> int:
        """Pull new rows from every node now; returns the number of rows received."""
        n = self.aggregator.pull()
        for fn in list(self._listeners):
            try:
                fn(self)
            except Exception:  # noqa: BLE001 - one broken listener (a closed widget) must not stop the others
                pass
        return n

    def on_pull(self, fn: Callable[[Monitor], None]) -> None:
        """Call ``fn(monitor)`` after every pull (from the pull thread)."""
        self._listeners.append(fn)

    def stop(self) -> None:
        """Stop pulling, stop the samplers, close Prometheus servers. History stays readable."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for srv in self._servers:
            srv.close()
        self._servers = []
        with self._sync_lock:  # samplers still starting are not wanted any more
            starting, self._starting = list(self._starting.values()), {}
        for st in starting:
            self._kill(st.actor)
        if self.started:
            for h in list(self.aggregator.handles.values()):
                if isinstance(h, RayHandle) or h.sampler in self._own_local or self._given is not None:
                    h.stop()
        self.started = False
        # a stopped shared monitor is released; monitor_for starts a new one when asked again
        _registry.monitors.discard(_key(self.cluster), self)

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- data -----------------------------------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return [n for n, _ in self.aggregator.states()]

    @property
    def gpu_count(self) -> int:
        return sum(len(s.gpus) for _, s in self.aggregator.states())

    def latest(self) -> Latest:
        """Newest reading per GPU and per host (see :meth:`Aggregator.latest`)."""
        return self.aggregator.latest()

    def gpu_series(self, metric: str = "util_gpu", window_s: float = 300.0) -> list[GpuSeries]:
        """Per-GPU time series of ``metric`` over the last ``window_s`` seconds."""
        return self.aggregator.gpu_series(metric, self.clock() - window_s)

    def host_series(self, metric: str = "cpu_percent", window_s: float = 300.0) -> list[HostSeries]:
        """Per-node host series of ``metric`` over the last ``window_s`` seconds."""
        return self.aggregator.host_series(metric, self.clock() - window_s)

    def utilisation_summary(self, window_s: float) -> UtilisationSummary:
        """Per-node/per-GPU mean utilisation over the last ``window_s``; see :func:`utilisation_summary`."""
        return utilisation_summary_from(self.aggregator, window_s, now=self.clock())

    def advice(self, window_s: float | None = None, threshold: float | None = None) -> list[Advice]:
        """GPUs that stayed under ``threshold`` % utilisation for the whole window, with remedies."""
        return advise(
            self.aggregator,
            self.advice_window if window_s is None else window_s,
            self.advice_threshold if threshold is None else threshold,
            now=self.clock(),
        )

    def slow(self) -> dict[str, dict[str, Any]]:
        """Latest slow-tier data per node (GPU processes, PCIe throughput)."""
        return {n: dict(s.slow) for n, s in self.aggregator.states()}

    def gpu_processes(self) -> list[GpuProcess]:
        """Processes on each GPU (slow tier), with the cluster rank when the pid is one of its workers.

        Returns rows ``{"node", "gpu", "pid", "used_mib", "rank"}`` (``rank`` is None for other processes).
        """
        ranks: dict[tuple[str, int], int] = {}
        status = getattr(self.cluster, "status", None)
        if callable(status):
            try:
                for w in status().workers:
                    ranks[(str(w.node_id), int(w.pid))] = int(w.rank)
            except Exception:  # noqa: BLE001 - ranks are a nicety: the processes are listed without them
                pass
        rows: list[GpuProcess] = []
        for node, st in self.aggregator.states():
            for g in st.slow.get("gpus", []):
                for p in g.get("processes", []):
                    rows.append(
                        {
                            "node": node,
                            "gpu": int(g["index"]),
                            "pid": int(p["pid"]),
                            "used_mib": float(p["used_mib"]),
                            "rank": ranks.get((node, int(p["pid"]))),
                        }
                    )
        return rows

    # -- exports --------------------------------------------------------------------------------------------------
    def prometheus_text(self) -> str:
        """Newest samples, advice, cluster state and cost in Prometheus text format (see ``monitor_text``)."""
        return monitor_text(self)

    def to_csv(
        self,
        path: str | None = None,
        window_s: float | None = None,
        node_column: bool = False,
        hosts: bool = False,
    ) -> str:
        """History in ``nvidia-smi --query-gpu=timestamp,name,utilization.gpu,memory.used --format=csv`` shape.

        With ``hosts``, the host metrics of every node instead (CPU, memory, network: what a cluster without
        GPUs has). Writes it to ``path`` when given; always returns the text.
        """
        since = 0.0 if window_s is None else self.clock() - window_s
        text = (
            host_csv(self.aggregator, since)
            if hosts
            else nvidia_smi_csv(self.aggregator, since, node_column=node_column)
        )
        if path:
            with open(path, "w") as f:
                f.write(text)
        return text

    def serve_prometheus(self, port: int = 0, host: str = "127.0.0.1") -> PrometheusServer:
        """Serve ``/metrics`` (and ``/csv``) over HTTP on ``port`` (0 = a free port) until :meth:`stop`."""
        srv = PrometheusServer(
            self.prometheus_text, lambda: self.to_csv(node_column=True), port=port, host=host
        )
        self._servers.append(srv)
        return srv

    # -- display --------------------------------------------------------------------------------------------------
    def widget(self, **kwargs: Any) -> MonitorWidget:
        """A live dashboard widget (see :class:`gpu_notebook.widgets.MonitorWidget`)."""
        from gpu_notebook.widgets import MonitorWidget

        return MonitorWidget(self, **kwargs)

    def __repr__(self) -> str:
        state = "running" if self.started else "stopped"
        return (
            f"Monitor({self.kind}, {len(self.nodes)} nodes, {self.gpu_count} GPUs, "
            f"every {self.interval:g}s, {state})"
        )

    def snapshot_html(self) -> str:
        """A static HTML table of the newest reading (what a saved notebook shows)."""
        return snapshot_table_html(self)

    def snapshot_text(self) -> str:
        """The same reading as :meth:`snapshot_html`, as plain text (what a terminal shows)."""
        return snapshot_table_text(self)

    def _repr_html_(self) -> str:
        return snapshot_table_html(self)


_MAX_RETRY_S = 300.0


@dataclass
class _Starting:
    """A node's sampler actor that was created and has not answered ``info`` yet."""

    actor: Any
    ref: Any
    ip: str
    deadline: float  # time.monotonic() after which it counts as failed
    limit: float


@dataclass
class _Failure:
    """Why a node's sampler could not be started, and when to try again."""

    reason: str
    ip: str
    attempts: int
    delay: float
    retry_at: float  # time.monotonic()


def _handle_for(s: Any) -> LocalHandle | RayHandle:
    if isinstance(s, (LocalHandle, RayHandle)):
        return s
    if isinstance(s, NodeSampler):
        return LocalHandle(s)
    # a Ray actor handle of sampler_actor_class()
    import ray

    info = ray.get(s.info.remote(), timeout=60)
    return RayHandle(s, str(info["node"]), info)


def utilisation_summary(monitor: Monitor, window_s: float) -> UtilisationSummary:
    """Mean utilisation per node and GPU over the last ``window_s`` seconds (idle stop reads this).

    Returns
    -------
    UtilisationSummary
        ``{node_id: {"has_gpu": bool, "gpus": {gpu_index: mean_util_percent}, "mean_gpu_util": float,
        "max_gpu_util": float, "cpu_percent": float, "samples": int, "span_s": float, "up": bool}}``.
        Values are NaN where there is no data (e.g. ``mean_gpu_util`` on a CPU-only node). ``span_s`` tells how
        much of the window the samples cover, so callers can wait until a whole window has been seen.
    """
    return monitor.utilisation_summary(window_s)


def busiest_utilisation(summary: UtilisationSummary) -> tuple[Literal["gpu", "cpu"], float | None]:
    """What idle detection compares with its threshold: ``("gpu", busiest GPU's mean %)``, or, when no node has
    a GPU, ``("cpu", busiest node's CPU %)``; the value is None when no node has samples yet.

    On a GPU cluster the CPU of a CPU-only head (Ray's own daemons, the notebook) says nothing about whether the
    GPUs are used, so only GPU nodes count there.
    """
    nodes = [node for node in summary.values() if node.get("samples")]
    any_gpu = any(node.get("has_gpu") for node in nodes)
    key: Literal["max_gpu_util", "cpu_percent"] = "max_gpu_util" if any_gpu else "cpu_percent"
    vals = [
        float(v)
        for node in nodes
        if node.get("has_gpu") or not any_gpu
        for v in [node.get(key, math.nan)]
        if v is not None and not math.isnan(v)
    ]
    return ("gpu" if any_gpu else "cpu"), (max(vals) if vals else None)


def _signal_stop(mon: Monitor) -> None:
    """At exit: end the pull loop without waiting (its thread is a daemon)."""
    mon._stop.set()


def _key(cluster: Any) -> Any:
    return _registry.LOCAL if cluster is None else cluster


def _default_cluster(cluster: Any, local: bool) -> Any:
    if cluster is None and not local:
        cluster = _registry.current_cluster()
        if cluster is not None and not getattr(cluster, "running", True):
            cluster = None
    return cluster


def running_monitor(cluster: MonitoredCluster | None = None, *, local: bool = False) -> Monitor | None:
    """The shared monitor :func:`monitor_for` would return, if it is running; never starts one (None then)."""
    mon = _registry.monitors.get(_key(_default_cluster(cluster, local)))
    return mon if mon is not None and mon.started else None


def monitor_for(cluster: MonitoredCluster | None = None, *, local: bool = False, **kwargs: Any) -> Monitor:
    """The shared, started monitor for ``cluster`` (default: the current cluster, else this machine).

    ``%gpu_monitor`` uses this, so repeated calls reuse the same samplers.
    """
    cluster = _default_cluster(cluster, local)
    key = _key(cluster)
    with _registry.monitors.lock:  # the panel's thread and a cell asking at once get one monitor, not two
        mon = _registry.monitors.get(key)
        if mon is None or not mon.started:
            mon = (Monitor.local(**kwargs) if cluster is None else Monitor(cluster, **kwargs)).start()
            _registry.monitors.set(key, mon)
    return mon


def stop_monitors(
    cluster: MonitoredCluster | None = None, *, local: bool = False, every: bool = False
) -> list[str]:
    """Stop the shared monitor :func:`running_monitor` finds (``every``: also this machine's and every
    cluster's); returns what was stopped, in words (``"this machine"``, ``"cluster 'shared'"``).

    A ``--local`` monitor runs next to a cluster's: a plain stop that left it running while saying "stopped"
    would leave a sampling thread nobody sees.
    """
    keys = [_key(_default_cluster(cluster, local))]
    if every:
        keys += [_registry.LOCAL, *_registry.get_manager().list()]
    stopped: list[str] = []
    seen: list[Any] = []
    for key in keys:
        if any(key is k for k in seen):
            continue
        seen.append(key)
        mon = _registry.monitors.get(key)
        if mon is not None and mon.started:
            mon.stop()
            stopped.append(
                "this machine" if key is _registry.LOCAL else f"cluster {getattr(key, 'name', '?')!r}"
            )
    return stopped
