"""What ``Cluster.status()`` returns: the nodes, the rank workers and the uptime of a cluster."""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClusterStatus", "NodeInfo", "WorkerInfo"]


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
