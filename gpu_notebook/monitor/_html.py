"""Static HTML of a monitor's newest reading (what a saved notebook, or one without widgets, shows) and its
``text/plain`` twin (what a terminal or a plain-text log shows)."""

from __future__ import annotations

import html
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gpu_notebook._display import text_table
from gpu_notebook.monitor._advice import Advice

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._shapes import Latest

__all__ = ["WAITING", "down_nodes_html", "snapshot_table_html", "snapshot_table_text"]

#: what a monitor with no data yet shows instead of a table, and its empty charts
WAITING = "waiting for the first sample"


class _Shown(Protocol):
    """What the HTML shows of a :class:`~gpu_notebook.monitor.Monitor`."""

    clock: Callable[[], float]

    @property
    def nodes(self) -> list[str]: ...

    @property
    def gpu_count(self) -> int: ...

    @property
    def failed_nodes(self) -> dict[str, str]: ...

    def latest(self) -> Latest: ...

    def advice(self, window_s: float | None = None, threshold: float | None = None) -> list[Advice]: ...


def _fmt(v: float, spec: str = ".0f", unit: str = "") -> str:
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:{spec}}{unit}"


def snapshot_table_html(mon: _Shown) -> str:
    """Plain HTML (no scripts, no images) of the newest reading and the current advice."""
    latest = mon.latest()
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mon.clock()))
    head = (
        f"<div class='gpu-notebook-monitor-snapshot'><b>GPU monitor</b> snapshot {html.escape(when)} · "
        f"{len(mon.nodes)} node(s), {mon.gpu_count} GPU(s)"
    )
    rows = []
    if latest["gpus"]:
        rows.append(
            "<tr><th>node</th><th>GPU</th><th>name</th><th>util %</th><th>memory MiB</th>"
            "<th>power W</th><th>temp °C</th><th>SM active</th></tr>"
        )
        for r in latest["gpus"]:
            rows.append(
                f"<tr><td>{html.escape(r['node'][:12])}</td><td>{r['index']}</td><td>{html.escape(r['name'])}</td>"
                f"<td>{_fmt(r['util_gpu'])}</td><td>{_fmt(r['mem_used_mib'])} / {_fmt(r['mem_total_mib'])}</td>"
                f"<td>{_fmt(r['power_w'])} / {_fmt(r['power_limit_w'])}</td><td>{_fmt(r['temp_c'])}</td>"
                f"<td>{_fmt(r['sm_active'], '.2f')}</td></tr>"
            )
    if latest["hosts"]:
        rows.append(
            "<tr><th>node</th><th colspan=2>host</th><th>CPU %</th><th>memory MiB</th>"
            "<th colspan=3>network rx / tx kB/s</th></tr>"
        )
        for h in latest["hosts"]:
            rows.append(
                f"<tr><td>{html.escape(h['node'][:12])}</td><td colspan=2>{'GPU node' if h['has_gpu'] else 'CPU only'}"
                f"</td><td>{_fmt(h['cpu_percent'])}</td><td>{_fmt(h['mem_used_mib'])} / {_fmt(h['mem_total_mib'])}"
                f"</td><td colspan=3>{_fmt(h['net_rx_Bps'] / 1e3, '.1f')} / {_fmt(h['net_tx_Bps'] / 1e3, '.1f')}"
                "</td></tr>"
            )
    table = f"<table>{''.join(rows)}</table>" if rows else f"<p>{WAITING}{_down_note(mon)}</p>"
    adv = "".join(f"<li>{html.escape(a.message)}</li>" for a in mon.advice())
    return head + table + down_nodes_html(mon) + (f"<ul>{adv}</ul>" if adv else "") + "</div>"


def _down_note(mon: _Shown) -> str:
    """A pointer to the down nodes when no sampler has started at all (the wait may then be long)."""
    return " (no node's sampler has started: see below)" if mon.failed_nodes and not mon.nodes else ""


def down_nodes_html(mon: _Shown) -> str:
    """One line per node whose sampler could not be started, with the reason ("" when there is none)."""
    failed = mon.failed_nodes
    if not failed:
        return ""
    items = "".join(f"<li>node {html.escape(n[:12])} down: {html.escape(r)}</li>" for n, r in failed.items())
    return f"<ul class='gpu-notebook-monitor-down' style='color:#a00'>{items}</ul>"


def snapshot_table_text(mon: _Shown) -> str:
    """The same reading, advice and down nodes as :func:`snapshot_table_html`, as plain text."""
    latest = mon.latest()
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mon.clock()))
    parts = [f"GPU monitor snapshot {when} · {len(mon.nodes)} node(s), {mon.gpu_count} GPU(s)"]
    if latest["gpus"]:
        parts.append(
            text_table(
                ["node", "GPU", "name", "util %", "memory MiB", "power W", "temp °C", "SM active"],
                [
                    [
                        r["node"][:12],
                        str(r["index"]),
                        r["name"],
                        _fmt(r["util_gpu"]),
                        f"{_fmt(r['mem_used_mib'])} / {_fmt(r['mem_total_mib'])}",
                        f"{_fmt(r['power_w'])} / {_fmt(r['power_limit_w'])}",
                        _fmt(r["temp_c"]),
                        _fmt(r["sm_active"], ".2f"),
                    ]
                    for r in latest["gpus"]
                ],
            )
        )
    if latest["hosts"]:
        parts.append(
            text_table(
                ["node", "host", "CPU %", "memory MiB", "network rx / tx kB/s"],
                [
                    [
                        h["node"][:12],
                        "GPU node" if h["has_gpu"] else "CPU only",
                        _fmt(h["cpu_percent"]),
                        f"{_fmt(h['mem_used_mib'])} / {_fmt(h['mem_total_mib'])}",
                        f"{_fmt(h['net_rx_Bps'] / 1e3, '.1f')} / {_fmt(h['net_tx_Bps'] / 1e3, '.1f')}",
                    ]
                    for h in latest["hosts"]
                ],
            )
        )
    if not latest["gpus"] and not latest["hosts"]:
        parts.append(WAITING + _down_note(mon))
    parts += [f"node {n[:12]} down: {r}" for n, r in mon.failed_nodes.items()]
    parts += [f"- {a.message}" for a in mon.advice()]
    return "\n".join(parts)
