"""What ``Cluster.status()`` returns: the nodes, the rank workers, the uptime and the dashboards of a cluster.

Dashboards (the Prometheus endpoints this kernel serves, Ray's dashboard when it is on) are linked through the
Jupyter server's ``jupyter-server-proxy`` (``<base_url>proxy/<port>/``) when the kernel runs under one, so a
browser that reaches only the notebook (Binder, JupyterHub, a tunnel to one port) opens them too. The kernel
finds the server's base URL, in this order: ``GPU_NOTEBOOK_PROXY_PREFIX`` (a path such as ``/user/me/``, or
``off``); ``JUPYTERHUB_SERVICE_PREFIX`` (set by JupyterHub and Binder for the single-user server); the running
Jupyter server that started this kernel (its pid is the kernel's parent, as listed in Jupyter's runtime
directory). Without a prefix, or without ``jupyter_server_proxy`` installed, links point at the port itself.
"""

from __future__ import annotations

import html
import importlib.util
import ipaddress
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_notebook import _settings
from gpu_notebook._display import fmt_duration
from gpu_notebook.distributed import paused_ranks
from gpu_notebook.monitor._export import running_servers

__all__ = [
    "ClusterStatus",
    "LifecycleState",
    "DashboardLink",
    "NodeInfo",
    "WorkerInfo",
    "dashboard_link",
    "dashboard_links",
    "cluster_status",
    "jupyter_proxy_prefix",
    "ray_dashboard_url",
]


@dataclass(frozen=True)
class DashboardLink:
    """A dashboard of the cluster and where to open it."""

    name: str  # "Prometheus metrics", "Ray dashboard"
    url: str  # what to open: through the Jupyter server's proxy when there is one, else ``direct``
    direct: str  # the port itself, e.g. http://127.0.0.1:9400/metrics

    @property
    def proxied(self) -> bool:
        return self.url != self.direct


def jupyter_proxy_prefix(environ: dict[str, str] | None = None) -> str | None:
    """The base URL path under which this kernel's Jupyter server proxies local ports, or None.

    See the module docstring for the order of the sources. The result ends with ``/``: a link is
    ``prefix + "proxy/<port>/"``.
    """
    env = os.environ if environ is None else environ
    given = _settings.proxy_prefix(env)
    if given.lower() in ("off", "0", "none", "false", "no"):
        return None
    if not given:
        if importlib.util.find_spec("jupyter_server_proxy") is None:
            return None
        given = env.get("JUPYTERHUB_SERVICE_PREFIX", "").strip() or (_parent_server_base_url() or "")
    if not given:
        return None
    return "/" + given.strip("/") + "/" if given.strip("/") else "/"


def _parent_server_base_url() -> str | None:
    """The ``base_url`` of the running Jupyter server whose process started this kernel."""
    try:
        from jupyter_server.serverapp import list_running_servers
    except ImportError:
        return None
    parent = os.getppid()
    try:
        for info in list_running_servers():
            if int(info.get("pid", -1)) == parent:
                return str(info.get("base_url") or "/")
    except Exception:  # noqa: BLE001 - an unreadable runtime file means no server found, never a failed status
        return None
    return None


def ray_dashboard_url() -> str | None:
    """``host:port`` of Ray's dashboard when this process is connected to a Ray that runs one, else None."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        from ray._private.worker import get_dashboard_url

        url = get_dashboard_url()
    except Exception:  # noqa: BLE001 - Ray Client or a Ray without the private helper: no link, no failure
        return None
    return str(url) if url else None


def _is_local(host: str) -> bool:
    """Whether the proxy (which connects to ``localhost``) reaches a port bound on ``host``."""
    if host in ("localhost", ""):
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return addr.is_loopback or addr.is_unspecified


def dashboard_link(
    name: str, host: str, port: int, path: str = "", prefix: str | None = None
) -> DashboardLink:
    """The link to a dashboard served on ``host:port`` (through the Jupyter server's proxy when it can be).

    ``prefix``: the server's base URL path (default: :func:`jupyter_proxy_prefix`).
    """
    return _link(name, host, port, path, jupyter_proxy_prefix() if prefix is None else prefix)


def _link(name: str, host: str, port: int, path: str, prefix: str | None) -> DashboardLink:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    direct = f"http://{shown}:{port}/{path}"
    if prefix is None or not _is_local(host):
        return DashboardLink(name, direct, direct)
    return DashboardLink(name, f"{prefix}proxy/{port}/{path}", direct)


def dashboard_links(ray_dashboard: str | None = None, prefix: str | None = None) -> list[DashboardLink]:
    """The dashboards to link from a status: this process's Prometheus endpoints, Ray's dashboard if given.

    Parameters
    ----------
    ray_dashboard
        ``host:port`` (or ``http://host:port``) of Ray's dashboard, e.g. from :func:`ray_dashboard_url`.
    prefix
        The Jupyter server's base URL path (default: :func:`jupyter_proxy_prefix`).
    """
    prefix = jupyter_proxy_prefix() if prefix is None else prefix
    links = [_link("Prometheus metrics", srv.host, srv.port, "metrics", prefix) for srv in running_servers()]
    if ray_dashboard:
        hostport = ray_dashboard.split("://", 1)[-1].rstrip("/")
        host, _, port = hostport.rpartition(":")
        if port.isdigit():
            links.append(_link("Ray dashboard", host, int(port), "", prefix))
    return links


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
    debugger: bool = False  # its code waits in the debugger (a breakpoint() of a background cell)


@dataclass
class NodeInfo:
    """One Ray node."""

    node_id: str
    ip: str
    cpus: float
    gpus: float
    alive: bool
    is_head: bool = False


#: Where a :class:`~gpu_notebook.Cluster` is in its life: made, started (or failed to start), stopping, stopped
#: (not :class:`gpu_notebook.cloud.ClusterState`, the record of what a cloud launch created).
LifecycleState = Literal["new", "running", "failed", "stopping", "stopped"]


@dataclass
class ClusterStatus:
    """A snapshot of a cluster: nodes, workers, uptime. Shows as an HTML table in notebooks."""

    name: str
    kind: str
    address: str
    state: LifecycleState
    backend: str | None
    uptime_s: float
    nodes: list[NodeInfo] = field(default_factory=list)
    workers: list[WorkerInfo] = field(default_factory=list)
    dashboards: list[DashboardLink] = field(default_factory=list)
    #: a detached cluster: who holds it, its guards and what it cost so far ("" for any other cluster)
    detached: str = ""

    def __str__(self) -> str:
        lines = [
            f"Cluster {self.name!r} ({self.kind}, {self.address}): {self.state}, backend {self.backend or '-'}, "
            f"up {fmt_duration(self.uptime_s)}",
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
                f"{w.num_cpus:<5g} {'alive' if w.alive else 'DEAD'}{', in the debugger' if w.debugger else ''}"
            )
        if self.dashboards:
            lines.append("Dashboards:")
            for d in self.dashboards:
                lines.append(f"  {d.name:<19} {d.url}" + (f"  (direct: {d.direct})" if d.proxied else ""))
        if self.detached:
            lines.append(f"Detached: {self.detached}")
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
            f"<td style='color:{'green' if w.alive else 'red'}'>{'alive' if w.alive else 'dead'}"
            f"{', in the debugger' if w.debugger else ''}</td></tr>"
            for w in self.workers
        )
        nodes = "".join(
            f"<tr><td><code>{e(n.node_id[:12])}</code></td><td>{e(n.ip)}</td><td>{n.cpus:g}</td>"
            f"<td>{n.gpus:g}</td><td>{'alive' if n.alive else 'dead'}{' (head)' if n.is_head else ''}</td></tr>"
            for n in self.nodes
        )
        links = " &middot; ".join(
            f"<a href='{e(d.url)}' target='_blank' title='{e(d.direct)}'>{e(d.name)}</a>"
            for d in self.dashboards
        )
        return (
            f"<div class='gpu-notebook-status'><b>Cluster {e(self.name)}</b> ({e(self.kind)}, "
            f"<code>{e(self.address)}</code>): {e(self.state)}, backend {e(self.backend or '-')}, "
            f"up {fmt_duration(self.uptime_s)}"
            f"<table><thead><tr><th>node</th><th>IP</th><th>CPUs</th><th>GPUs</th><th>state</th></tr></thead>"
            f"<tbody>{nodes}</tbody></table>"
            f"<table><thead><tr><th>rank</th><th>node</th><th>IP</th><th>pid</th><th>GPUs</th><th>CPUs</th>"
            f"<th>state</th></tr></thead><tbody>{rows}</tbody></table>"
            + (f"<div>Dashboards: {links}</div>" if links else "")
            + (f"<div>Detached: {e(self.detached)}</div>" if self.detached else "")
            + "</div>"
        )


def cluster_status(cluster: Any) -> ClusterStatus:
    """A :class:`~gpu_notebook.cluster.Cluster`'s nodes, workers (rank, node, pid, GPUs/CPUs, alive) and uptime:
    what its ``status()`` returns."""
    nodes: list[NodeInfo] = []
    workers: list[WorkerInfo] = []
    if cluster.running:
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
        assert cluster.group is not None
        alive = cluster.group.alive()
        paused = paused_ranks(cluster.group.workers)
        for plan, meta, ok in zip(cluster.group.plans, cluster.group.metas, alive, strict=False):
            workers.append(
                WorkerInfo(
                    rank=plan.rank,
                    node_id=plan.node_id,
                    node_ip=plan.node_ip,
                    pid=meta["pid"],
                    gpu_ids=list(plan.gpu_ids),
                    num_cpus=cluster.group.cpus_per_worker,
                    num_gpus=cluster.group.gpus_per_worker,
                    alive=ok,
                    local_rank=plan.local_rank,
                    debugger=plan.rank in paused,
                )
            )
    return ClusterStatus(
        name=cluster.name,
        kind=cluster.kind,
        address=cluster.connection.address if cluster.connection else (cluster.address or "local"),
        state=cluster.state,
        backend=cluster.backend,
        uptime_s=time.time() - cluster.started_at if cluster.started_at else 0.0,
        nodes=nodes,
        workers=workers,
        dashboards=dashboard_links(ray_dashboard_url()) if cluster.running else [],
    )
