"""Exports: Prometheus text exposition (served over HTTP) and an ``nvidia-smi --query-gpu`` style CSV.

The Prometheus page has one line per GPU and metric, labelled ``node``, ``gpu`` (index), ``uuid`` and
``name``, plus host metrics labelled ``node``, so a real Prometheus can scrape the notebook machine.
:func:`monitor_text` (what ``Monitor.prometheus_text`` serves) adds the under-use advice per GPU and, for a
cluster, its state and its cost (spent, $/h, budget, per node, from the cluster's shared cost meter in
:mod:`gpu_notebook._registry`: the monitor layer reads the meter it finds and never imports ``cost``).
The Grafana dashboard shipped in ``gpu_notebook/data/grafana_dashboard.json`` (:func:`grafana_dashboard`)
queries these names; ``tests/monitor/test_prometheus_server.py`` runs each of its queries on a real Prometheus.
The CSV has the exact shape of
``nvidia-smi --query-gpu=timestamp,name,utilization.gpu,memory.used --format=csv``.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import TYPE_CHECKING, Any

from gpu_notebook import _registry

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor._aggregator import Aggregator
    from gpu_notebook.monitor._shapes import GpuMetric, HostMetric

__all__ = [
    "prometheus_text",
    "monitor_text",
    "advice_text",
    "cluster_text",
    "cost_text",
    "grafana_dashboard",
    "nvidia_smi_csv",
    "host_csv",
    "PrometheusServer",
    "running_servers",
    "PROMETHEUS_CONTENT_TYPE",
]

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (metric column, exposition name, type, help, scale)
_GPU_EXPORTS: list[tuple[GpuMetric, str, str, str, float]] = [
    (
        "util_gpu",
        "gpu_notebook_gpu_utilization_percent",
        "gauge",
        "Percent of time a kernel was running on the GPU (NVML utilization.gpu).",
        1.0,
    ),
    (
        "util_mem",
        "gpu_notebook_gpu_memory_utilization_percent",
        "gauge",
        "Percent of time device memory was being read or written.",
        1.0,
    ),
    ("mem_used_mib", "gpu_notebook_gpu_memory_used_bytes", "gauge", "GPU memory used.", 2.0**20),
    ("mem_total_mib", "gpu_notebook_gpu_memory_total_bytes", "gauge", "GPU memory total.", 2.0**20),
    ("power_w", "gpu_notebook_gpu_power_watts", "gauge", "Power draw.", 1.0),
    ("power_limit_w", "gpu_notebook_gpu_power_limit_watts", "gauge", "Enforced power limit.", 1.0),
    ("temp_c", "gpu_notebook_gpu_temperature_celsius", "gauge", "GPU temperature.", 1.0),
    ("sm_clock_mhz", "gpu_notebook_gpu_sm_clock_hertz", "gauge", "SM clock.", 1e6),
    (
        "throttle",
        "gpu_notebook_gpu_clocks_throttle_reasons",
        "gauge",
        "Bitmask of NVML clocks throttle reasons (0 = not throttled).",
        1.0,
    ),
    ("energy_j", "gpu_notebook_gpu_energy_joules", "counter", "Energy used since the driver loaded.", 1.0),
    (
        "sm_active",
        "gpu_notebook_gpu_sm_active_ratio",
        "gauge",
        "Fraction of SM cycles with work (NVML GPM, Hopper and newer).",
        1.0,
    ),
]
_HOST_EXPORTS: list[tuple[HostMetric, str, str, str, float]] = [
    ("cpu_percent", "gpu_notebook_host_cpu_percent", "gauge", "Host CPU utilisation.", 1.0),
    ("mem_used_mib", "gpu_notebook_host_memory_used_bytes", "gauge", "Host memory used.", 2.0**20),
    ("mem_total_mib", "gpu_notebook_host_memory_total_bytes", "gauge", "Host memory total.", 2.0**20),
    (
        "net_rx_Bps",
        "gpu_notebook_host_network_receive_bytes_per_second",
        "gauge",
        "Network receive rate.",
        1.0,
    ),
    ("net_tx_Bps", "gpu_notebook_host_network_transmit_bytes_per_second", "gauge", "Network send rate.", 1.0),
    ("load1", "gpu_notebook_host_load1", "gauge", "1-minute load average.", 1.0),
]


def _label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def prometheus_text(agg: Aggregator, down: Iterable[str] = ()) -> str:
    """The newest sample of every GPU and host in Prometheus text exposition format 0.0.4.

    ``down``: nodes known but not registered (a sampler that could not start): ``gpu_notebook_node_up`` 0.
    """
    latest = agg.latest()
    lines: list[str] = []
    for col, name, typ, help_, scale in _GPU_EXPORTS:
        rows = [r for r in latest["gpus"] if not math.isnan(r[col])]
        if not rows:
            continue
        # a counter's samples end in _total, and in format 0.0.4 its HELP/TYPE lines name the same _total metric
        # (as prometheus_client writes them); a TYPE naming the bare name leaves the samples untyped
        sample = name + "_total" if typ == "counter" else name
        lines += [f"# HELP {sample} {help_}", f"# TYPE {sample} {typ}"]
        for r in rows:
            labels = (
                f'node="{_label(r["node"])}",gpu="{r["index"]}",uuid="{_label(r["uuid"])}",'
                f'name="{_label(r["name"])}"'
            )
            lines.append(f"{sample}{{{labels}}} {_num(r[col] * scale)}")
    for host_col, name, typ, help_, scale in _HOST_EXPORTS:
        host_rows = [h for h in latest["hosts"] if not math.isnan(h[host_col])]
        if not host_rows:
            continue
        lines += [f"# HELP {name} {help_}", f"# TYPE {name} {typ}"]
        for h in host_rows:
            lines.append(f'{name}{{node="{_label(h["node"])}"}} {_num(h[host_col] * scale)}')
    lines += [
        "# HELP gpu_notebook_node_up 1 if the node's sampler answered the last pull.",
        "# TYPE gpu_notebook_node_up gauge",
    ]
    seen = set()
    for node, s in agg.states():
        seen.add(node)
        lines.append(f'gpu_notebook_node_up{{node="{_label(node)}"}} {1 if s.up else 0}')
    for node in down:
        if node not in seen:
            lines.append(f'gpu_notebook_node_up{{node="{_label(node)}"}} 0')
    return "\n".join(lines) + "\n"


def _family(name: str, typ: str, help_: str, samples: list[tuple[str, float]]) -> list[str]:
    """One metric family: HELP, TYPE and ``(labels, value)`` samples (nothing at all when there are none)."""
    if not samples:
        return []
    out = [f"# HELP {name} {help_}", f"# TYPE {name} {typ}"]
    out += [f"{name}{{{labels}}} {_num(v)}" if labels else f"{name} {_num(v)}" for labels, v in samples]
    return out


def _text(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def advice_text(monitor: Any) -> str:
    """The under-use advice: ``gpu_notebook_gpu_underused`` 0/1 for every GPU, the message of each flagged one.

    Every GPU gets a series (0 when it is busy enough), so a dashboard panel has data before anything is flagged.
    """
    items = monitor.advice()
    flagged = {(str(a.node), int(a.gpu)): a for a in items}
    under, info = [], []
    for r in monitor.latest()["gpus"]:
        key = (str(r["node"]), int(r["index"]))
        labels = f'node="{_label(r["node"])}",gpu="{r["index"]}",uuid="{_label(r["uuid"])}"'
        under.append((labels, 1.0 if key in flagged else 0.0))
    for a in items:
        info.append((f'node="{_label(a.node)}",gpu="{a.gpu}",message="{_label(a.message)}"', 1.0))
    lines = _family(
        "gpu_notebook_gpu_underused",
        "gauge",
        "1 if the GPU stayed under the advice threshold for the whole advice window.",
        under,
    )
    lines += _family(
        "gpu_notebook_advice_info", "gauge", "The advice for each under-used GPU (value 1).", info
    )
    if under:
        lines += _family(
            "gpu_notebook_advice_threshold_percent",
            "gauge",
            "Utilisation below which a GPU counts as under-used.",
            [("", float(monitor.advice_threshold))],
        )
        lines += _family(
            "gpu_notebook_advice_window_seconds",
            "gauge",
            "How long a GPU must stay under the threshold to be flagged.",
            [("", float(monitor.advice_window))],
        )
    return _text(lines)


def cluster_text(cluster: Any, nodes: int | None = None) -> str:
    """The cluster's state from its attributes (no Ray call): ``gpu_notebook_cluster_{info,up,workers,...}``.

    ``nodes``: how many nodes the monitor samples (``gpu_notebook_cluster_nodes``).
    """
    name = _label(getattr(cluster, "name", "") or "")
    state = str(getattr(cluster, "state", "running"))
    c = f'cluster="{name}"'
    info = f'{c},kind="{_label(getattr(cluster, "kind", ""))}",state="{_label(state)}"'
    info += f',backend="{_label(getattr(cluster, "backend", None) or "")}"'
    lines = _family(
        "gpu_notebook_cluster_info", "gauge", "The cluster, its kind, state and backend.", [(info, 1)]
    )
    lines += _family(
        "gpu_notebook_cluster_up", "gauge", "1 while the cluster is running.", [(c, state == "running")]
    )
    try:
        workers = float(getattr(cluster, "world_size", 0) or 0)
    except Exception:  # noqa: BLE001 - a cluster half stopped may fail to count its workers: report none
        workers = 0.0
    lines += _family("gpu_notebook_cluster_workers", "gauge", "Rank workers of the cluster.", [(c, workers)])
    if nodes is not None:
        lines += _family("gpu_notebook_cluster_nodes", "gauge", "Nodes the monitor samples.", [(c, nodes)])
    started = getattr(cluster, "started_at", None)
    if isinstance(started, (int, float)) and started:
        lines += _family(
            "gpu_notebook_cluster_uptime_seconds",
            "gauge",
            "Seconds since the cluster started.",
            [(c, max(0.0, time.time() - started))],
        )
    return _text(lines)


def cost_text(snapshot: Any, cluster_name: str = "") -> str:
    """A cost snapshot (:class:`gpu_notebook.cost.CostSnapshot`) as ``gpu_notebook_cost_*`` metrics.

    Totals labelled ``cluster``; per node also ``node`` (the same id as the GPU metrics) and ``price``.
    The figures are list-price estimates (``gpu_notebook_cost_info`` says so in its ``estimate`` label).
    """
    c = f'cluster="{_label(cluster_name)}"'
    budget = snapshot.budget_usd
    if budget is None:  # a budget policy attached by hand knows its own figure
        budget = next((p["budget_usd"] for p in snapshot.policies if p.get("budget_usd") is not None), None)
    lines = _family(
        "gpu_notebook_cost_info",
        "gauge",
        "How the cost is estimated (value 1).",
        [
            (
                f'{c},local="{str(bool(snapshot.is_local)).lower()}",estimate="{_label(snapshot.estimate_label)}"',
                1,
            )
        ],
    )
    lines += _family(
        "gpu_notebook_cost_spent_usd", "gauge", "Estimated USD spent so far.", [(c, snapshot.spent_usd)]
    )
    lines += _family(
        "gpu_notebook_cost_usd_per_hour",
        "gauge",
        "Current burn rate, USD per hour.",
        [(c, snapshot.usd_per_hour)],
    )
    lines += _family(
        "gpu_notebook_cost_nodes_running", "gauge", "Nodes being charged now.", [(c, snapshot.nodes_running)]
    )
    if budget is not None:
        lines += _family(
            "gpu_notebook_cost_budget_usd", "gauge", "The budget cap, USD.", [(c, float(budget))]
        )
    per_node = [
        (f'{c},node="{_label(n["node_id"])}",price="{_label(n["label"])}"', n) for n in snapshot.nodes
    ]
    lines += _family(
        "gpu_notebook_cost_node_spent_usd",
        "gauge",
        "Estimated USD spent on the node so far.",
        [(lab, float(n["spent_usd"])) for lab, n in per_node],
    )
    lines += _family(
        "gpu_notebook_cost_node_usd_per_hour",
        "gauge",
        "The node's price now, USD per hour (0 once it left).",
        [(lab, float(n["usd_per_hour"]) if n["running"] else 0.0) for lab, n in per_node],
    )
    return _text(lines)


def monitor_text(monitor: Any) -> str:
    """Everything a scrape of a monitor's endpoint returns: GPUs and hosts, advice, cluster state, cost.

    The cost comes from the cluster's shared cost meter, when one exists (``%gpu_cost``, a budget or an idle
    stop made it); it is polled first so nodes that joined or left since are counted.
    """
    parts = [prometheus_text(monitor.aggregator, down=monitor.failed_nodes), advice_text(monitor)]
    cluster = monitor.cluster
    if cluster is not None:
        parts.append(cluster_text(cluster, nodes=len(monitor.nodes)))
        meter = _registry.cost_meters.get(cluster)
        if meter is not None:
            try:
                meter.poll()
            except Exception:  # noqa: BLE001 - a scrape must answer: the meter keeps its last node set
                pass
            parts.append(cost_text(meter.snapshot(), str(getattr(cluster, "name", "") or "")))
    return "".join(parts)


def grafana_dashboard(path: str | None = None) -> dict[str, Any]:
    """The Grafana dashboard shipped with the package (GPU utilisation, memory, power, cost, advice, state).

    Import it in Grafana (Dashboards > New > Import) and pick a Prometheus data source that scrapes the
    endpoint of ``%gpu_monitor prometheus``. ``path``: also write it there as JSON.

    Returns
    -------
    dict
        The dashboard model; its template variables are ``datasource``, ``instance`` and ``node``.
    """
    text = resources.files("gpu_notebook").joinpath("data/grafana_dashboard.json").read_text("utf-8")
    if path:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    dashboard: dict[str, Any] = json.loads(text)
    return dashboard


def _smi_time(t: float) -> str:
    d = _dt.datetime.fromtimestamp(t)
    return d.strftime("%Y/%m/%d %H:%M:%S.") + f"{d.microsecond // 1000:03d}"


def nvidia_smi_csv(agg: Aggregator, since_t: float = 0.0, *, node_column: bool = False) -> str:
    """History as ``nvidia-smi --query-gpu=timestamp,name,utilization.gpu,memory.used --format=csv``.

    One row per GPU per sample, oldest first; ``node_column=True`` appends a ``node`` column (nvidia-smi has no
    notion of nodes, so it is off by default to keep the exact shape).
    """
    head = "timestamp, name, utilization.gpu [%], memory.used [MiB]"
    lines = [head + (", node" if node_column else "")]
    records: list[tuple[float, str, int, str]] = []
    for node_i, (node, s) in enumerate(agg.states()):
        if not s.gpus:
            continue
        t, data = s.buffer.window(since_t)
        ucols, mcols = s.gpu_cols("util_gpu"), s.gpu_cols("mem_used_mib")
        for k in range(len(t)):
            for g, uc, mc in zip(s.gpus, ucols, mcols, strict=True):
                u, m = data[k, uc], data[k, mc]
                us = "[N/A]" if math.isnan(u) else f"{int(round(u))} %"
                ms = "[N/A]" if math.isnan(m) else f"{int(round(m))} MiB"
                row = f"{_smi_time(float(t[k]))}, {g['name']}, {us}, {ms}"
                records.append(
                    (float(t[k]), row + (f", {node}" if node_column else ""), node_i, str(g["index"]))
                )
    records.sort(key=lambda r: (r[0], r[2], int(r[3])))
    lines += [r[1] for r in records]
    return "\n".join(lines) + "\n"


def host_csv(agg: Aggregator, since_t: float = 0.0) -> str:
    """The host metrics of every node (CPU, memory, network) as CSV: what a cluster without GPUs can export.

    One row per node per sample, oldest first, timestamps as in :func:`nvidia_smi_csv`.
    """
    head = "timestamp, node, cpu [%], memory.used [MiB], memory.total [MiB], net.rx [kB/s], net.tx [kB/s]"
    records: list[tuple[float, int, str]] = []
    metrics = ("cpu_percent", "mem_used_mib", "mem_total_mib", "net_rx_Bps", "net_tx_Bps")
    for node_i, (node, s) in enumerate(agg.states()):
        cols = [s.host_col(m) for m in metrics]
        if any(c is None for c in cols):
            continue
        t, data = s.buffer.window(since_t)
        for k in range(len(t)):
            vals = []
            for m, c in zip(metrics, cols, strict=True):
                v = float(data[k, c])
                if m.endswith("_Bps"):
                    v /= 1e3
                vals.append("[N/A]" if math.isnan(v) else f"{v:.1f}" if m.endswith("_Bps") else f"{v:.0f}")
            records.append((float(t[k]), node_i, f"{_smi_time(float(t[k]))}, {node}, {', '.join(vals)}"))
    records.sort(key=lambda r: (r[0], r[1]))
    return "\n".join([head] + [r[2] for r in records]) + "\n"


#: the servers open in this process (what ``%gpu_cluster status`` links to)
_OPEN: weakref.WeakSet[PrometheusServer] = weakref.WeakSet()


def running_servers() -> list[PrometheusServer]:
    """The :class:`PrometheusServer` objects of this process that are still serving, oldest first."""
    return sorted(_OPEN, key=lambda srv: srv.opened_at)


class PrometheusServer:
    """A tiny HTTP server in a daemon thread: ``GET /metrics`` (Prometheus text), ``GET /csv``.

    Parameters
    ----------
    render
        Returns the Prometheus text on each scrape.
    csv
        Returns the CSV for ``/csv`` (optional).
    port
        TCP port; 0 picks a free one (see :attr:`port`).
    host
        Address to bind; ``127.0.0.1`` by default (use ``0.0.0.0`` for a Prometheus on another machine).
    """

    def __init__(
        self,
        render: Callable[[], str],
        csv: Callable[[], str] | None = None,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?")[0]
                if path in ("/metrics", "/"):
                    body, ctype = outer.render().encode(), PROMETHEUS_CONTENT_TYPE
                elif path == "/csv" and outer.csv is not None:
                    body, ctype = outer.csv().encode(), "text/csv; charset=utf-8"
                else:
                    self.send_error(404)
                    return
                outer.scrapes += 1
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.render = render
        self.csv = csv
        self.scrapes = 0
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, daemon=True, name="gpu_notebook-prometheus"
        )
        self._thread.start()
        self.opened_at = time.monotonic()
        _OPEN.add(self)

    @property
    def url(self) -> str:
        """The scrape URL."""
        return f"http://{self.host}:{self.port}/metrics"

    def __repr__(self) -> str:
        return f"PrometheusServer({self.url})"

    def close(self) -> None:
        """Stop serving and free the port."""
        _OPEN.discard(self)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=2)
