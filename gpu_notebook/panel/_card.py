"""What the JupyterLab panel shows of one cluster: its card, its live figures and its recent series.

Everything here reads what the kernel already keeps: the cluster's own fields, the shared monitor that
``%gpu_monitor`` uses (:func:`gpu_notebook.monitor.running_monitor`) and the shared cost meter and policy watcher.
Nothing samples the nodes a second time. The shapes are those of ``docs/dev/panel-protocol.md``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from gpu_notebook import _feed, _registry
from gpu_notebook.cloud._reaper import lease_path, log_path
from gpu_notebook.cost import cost_meter_for
from gpu_notebook.monitor import running_monitor

#: seconds of history the dashboard pane shows (the monitor keeps more)
SERIES_WINDOW_S = 120.0
#: points per series at most (older points are thinned)
SERIES_POINTS = 240
SERIES_METRICS = ("util_gpu", "mem_used_mib", "power_w")
HOST_SERIES_METRICS = ("cpu_percent", "mem_used_mib", "net_rx_Bps", "net_tx_Bps")


def _num(x: Any) -> float | None:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def card(cluster: Any, kernel: dict[str, Any]) -> dict[str, Any]:
    """The cluster's card: who owns it, what it is, how it is guarded (never a credential)."""
    settings = cluster.settings
    conn = getattr(cluster, "connection", None)
    address = getattr(conn, "address", None) or cluster.address
    kind = str(cluster.kind)
    cloud = kind.split(":", 1)[1] if kind.startswith("cloud:") else None
    reaper = None
    if cloud:
        reaper = {"lease": str(lease_path(cluster.name)), "log": str(log_path(cluster.name))}
    return {
        "name": cluster.name,
        "kind": "cloud" if cloud else kind,
        "cloud": cloud,
        "state": cluster.state,
        "kernel_id": kernel["kernel_id"],
        "pid": kernel["pid"],
        "notebook": kernel.get("session"),
        "workers": cluster.world_size,
        "gpus_per_worker": settings.resources.gpus_per_worker,
        "backend": cluster.backend,
        "started_at": cluster.started_at,
        "busy": cluster.busy,
        "address": address if address and address != "local" else None,
        "dashboard_url": (getattr(conn, "dashboard_url", "") or None) if conn else None,
        "budget_usd": _num(settings.policies.budget),
        "idle_stop_min": _num(settings.policies.idle_stop),
        "attach_code": attach_code(cluster, address),
        "reaper": reaper,
    }


def attach_code(cluster: Any, address: str | None) -> str:
    """The cell "use in this notebook" inserts: this notebook's kernel joins the same Ray cluster."""
    name = f"{cluster.name}-here" if cluster.name else "shared"
    if address and address not in ("local", "auto"):
        # a Ray that ray.init() started here asks every driver for its token, and Ray sends it to an address given
        # by hand only in token mode (the token itself stays in ~/.ray/auth_token, never in the cell)
        auth = "%env RAY_AUTH_MODE=token\n" if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else ""
        return f"%load_ext gpu_notebook\n{auth}%gpu_cluster start --address {address} --name {name}"
    return f"%load_ext gpu_notebook\n%gpu_cluster start --name {name}"


def live(cluster: Any, meter: Any, now: float | None = None) -> dict[str, Any]:
    """The figures of the sidebar row and the status-bar item, now."""
    now = time.time() if now is None else now
    mon = running_monitor(cluster)
    out: dict[str, Any] = {
        "t": now,
        "monitoring": mon is not None,
        "busy": cluster.busy,
        "state": cluster.state,
    }
    if mon is not None:
        latest = mon.latest()
        gpus = list(latest["gpus"])
        utils = [u for u in (_num(g.get("util_gpu")) for g in gpus) if u is not None]
        out.update(
            nodes=len(mon.nodes),
            gpus=len(gpus),
            util_gpu=sum(utils) / len(utils) if utils else None,
            mem_used_mib=sum(_num(g.get("mem_used_mib")) or 0.0 for g in gpus) if gpus else None,
        )
        if not gpus:  # CPU-only nodes: the busiest host's CPU
            hosts = list(latest["hosts"])
            cpus = [c for c in (_num(h.get("cpu_percent")) for h in hosts) if c is not None]
            out["cpu_percent"] = sum(cpus) / len(cpus) if cpus else None
    else:
        out.update(
            nodes=None, gpus=int(cluster.world_size * (cluster.settings.resources.gpus_per_worker or 0))
        )
    if meter is not None:
        snap = meter.snapshot(at=now)
        out.update(usd_per_hour=_num(snap.usd_per_hour), spent_usd=_num(snap.spent_usd))
        budget = _num(cluster.settings.policies.budget)
        if budget:
            out["budget_left_usd"] = budget - (snap.spent_usd or 0.0)
    watcher = getattr(cluster, "policies", None)
    if watcher is not None:
        for st in watcher.status(now):
            if st.get("remaining_s") is not None:
                out["idle_stop_in_s"] = _num(st["remaining_s"])
    return out


def _short(node: str) -> str:
    """A node id as a label: Ray's node ids are 56 hex digits, the first 8 tell them apart."""
    return node[:8] if len(node) > 12 else node


def _thin(n: int) -> slice:
    return slice(None, None, max(1, math.ceil(n / SERIES_POINTS)))


def _on_axis(axis: Any, t: Any, y: Any, gap_s: float) -> list[float | None]:
    """``y`` (sampled at times ``t``, in order) read at each time of ``axis``: the latest sample at or before it,
    None where there is none within ``gap_s`` (a node that stopped answering shows a gap, not its last value)."""
    t, y = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
    if len(t) == 0:
        return [None] * len(axis)
    at = np.searchsorted(t, axis, side="right") - 1
    ok = (at >= 0) & (axis - t[np.maximum(at, 0)] <= gap_s)
    # two decimals: what a chart shows (a percent, MiB, W); a fifth of the JSON a full repr writes
    v = np.round(np.where(ok, y[np.maximum(at, 0)], np.nan), 2)
    out: list[float | None] = v.tolist()
    for i in np.flatnonzero(~np.isfinite(v)).tolist():  # the gaps (and a NaN reading) as JSON nulls
        out[i] = None
    return out


def series(cluster: Any, meter: Any) -> dict[str, Any]:
    """The dashboard pane's recent series: per-GPU utilisation, memory and power, per-host CPU, memory and
    network, and the cost so far. The GPUs and hosts share one time axis ``t`` (every node samples on its own
    clock; each series is read at the axis's times), of at most :data:`SERIES_POINTS` points."""
    mon = running_monitor(cluster)
    out: dict[str, Any] = {"window_s": SERIES_WINDOW_S, "t": [], "gpus": [], "hosts": [], "cost": None}
    if mon is not None:
        raw: list[tuple[dict[str, Any], str, Any, Any]] = []
        gpus: dict[tuple[str, int], dict[str, Any]] = {}
        for metric in SERIES_METRICS:
            for s in mon.gpu_series(metric, window_s=SERIES_WINDOW_S):
                key = (s["node"], s["index"])
                entry = gpus.setdefault(
                    key,
                    {"node": s["node"], "index": s["index"], "label": f"{_short(s['node'])} gpu{s['index']}"},
                )
                raw.append((entry, metric, s["t"], s["y"]))
        hosts: dict[str, dict[str, Any]] = {}
        for metric in HOST_SERIES_METRICS:
            for h in mon.host_series(metric, window_s=SERIES_WINDOW_S):
                entry = hosts.setdefault(h["node"], {"node": h["node"], "label": _short(h["node"])})
                raw.append((entry, metric, h["t"], h["y"]))
        stamps = [np.round(np.asarray(ts, dtype=float), 3) for _, _, ts, _ in raw]
        times = np.unique(np.concatenate(stamps)) if stamps else np.zeros(0)
        axis = times[_thin(len(times))]
        if len(times) and axis[-1] != times[-1]:
            axis = np.append(axis, times[-1])  # the latest sample is always shown
        gap = max(5.0, 4 * float(getattr(mon, "interval", 1.0) or 1.0))
        for (entry, metric, _, ys), ts in zip(raw, stamps, strict=True):
            entry[metric] = _on_axis(axis, ts, ys, gap)
        out["t"] = axis.tolist()
        out["gpus"] = list(gpus.values())
        out["hosts"] = list(hosts.values())
        latest = mon.latest()
        totals = {(g["node"], g["index"]): _num(g["mem_total_mib"]) for g in latest["gpus"]}
        for entry in out["gpus"]:
            entry["mem_total_mib"] = totals.get((entry["node"], entry["index"]))
    if meter is not None:
        hist = meter.history[-SERIES_POINTS:]
        out["cost"] = {
            "t": [round(t, 3) for t, _, _ in hist],
            "spent_usd": [_num(s) for _, s, _ in hist],
            "usd_per_hour": [_num(r) for _, _, r in hist],
        }
    return out


def cost_meter(cluster: Any) -> Any:
    """The cluster's shared cost meter (made on first use, as ``%gpu_cost`` does)."""
    meter = _registry.cost_meters.get(cluster)
    if meter is None:
        meter = cost_meter_for(cluster)
    return meter


def kernel_identity() -> dict[str, Any] | None:
    """This process's kernel record for the feed, or None outside a Jupyter kernel (nothing is published)."""
    if "ipykernel" not in __import__("sys").modules:
        return None
    try:
        from ipykernel.connect import get_connection_file

        path = get_connection_file()
    except Exception:  # noqa: BLE001 - not a running kernel (an IPython terminal, a script, a test)
        return None
    base = os.path.basename(path)
    kernel_id = base[len("kernel-") : -len(".json")] if base.startswith("kernel-") else f"pid-{os.getpid()}"
    return _feed.kernel_record(kernel_id)
