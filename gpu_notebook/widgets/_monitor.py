"""The live GPU dashboard: a header row of numbers, plotly charts, under-use advice; throttled updates.

:class:`MonitorWidget` is a cached view of a :class:`~gpu_notebook.monitor.Monitor`: stock ipywidgets (``HTML``,
``VBox``) and one plotly ``FigureWidget`` with stacked subplots (utilisation and memory per GPU over time,
power, and a node x GPU heat map when there are many GPUs; CPU, memory and network on nodes without GPUs).
A daemon thread refreshes it on a timer, so the kernel stays free for cells. The header row holds the
numbers and, when a GPU stays under 70%, the advice naming it.

Message budget: every comm message our widgets send is counted, and a refresh is skipped (its data simply
arrives with the next one) when it would push the last second over ``max_msgs_per_s`` (default 5), whatever
the number of GPUs. Plots send at most ``max_points`` points per trace and at most ``max_traces`` lines per
chart (per GPU, else per node means, else cluster mean/min/max). The mime bundle carries a static
``text/html`` table so a saved notebook shows a snapshot instead of an empty box, and :meth:`stop` replaces a
displayed dashboard by that snapshot.
"""

from __future__ import annotations

import html
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

import numpy as np

from gpu_notebook.monitor._html import WAITING
from gpu_notebook.widgets._live import LiveView, RateCap

if TYPE_CHECKING:  # pragma: no cover
    from gpu_notebook.monitor import Advice, GpuMetric, GpuSeries, HostSeries, Monitor

__all__ = ["MonitorWidget", "RateCap"]

#: A line of a chart: ("gpu", node, GPU index), ("node", node, None: GPU mean | "host"), ("all", "mean"|"min"|"max", None)
TraceKey = tuple[Literal["gpu", "node", "all"], str, int | str | None]


class _Plan(NamedTuple):
    """The structure of the figure; the figure is rebuilt when a new plan differs from the one it shows."""

    mode: Literal["gpu", "host"]  # GPU charts, or host charts when no node has a GPU
    keys: tuple[TraceKey, ...]  # the lines of each chart, in order
    heat: bool  # with the node x GPU heat map


def _decimate(t: np.ndarray, y: np.ndarray, max_points: int) -> tuple[np.ndarray, np.ndarray]:
    if len(t) <= max_points:
        return t, y
    step = int(math.ceil(len(t) / max_points))
    return t[-1::-step][::-1], y[-1::-step][::-1]


def _binned(
    parts: list[tuple[np.ndarray, np.ndarray]], since: float, now: float, nbins: int, how: str
) -> tuple[np.ndarray, np.ndarray]:
    """Combine many series onto a common time grid: mean/min/max of all values in each bin."""
    if not parts:
        return np.zeros(0), np.zeros(0)
    t = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    ok = np.isfinite(y)
    t, y = t[ok], y[ok]
    if len(t) == 0:
        return np.zeros(0), np.zeros(0)
    width = max((now - since) / nbins, 1e-9)
    idx = np.clip(((t - since) / width).astype(np.int64), 0, nbins - 1)
    order = np.argsort(idx, kind="stable")
    idx, y = idx[order], y[order]
    uniq, starts = np.unique(idx, return_index=True)
    if how == "mean":
        vals = np.add.reduceat(y, starts) / np.diff(np.append(starts, len(y)))
    elif how == "min":
        vals = np.minimum.reduceat(y, starts)
    else:
        vals = np.maximum.reduceat(y, starts)
    return since + (uniq + 0.5) * width, vals


def _to_ms(t: np.ndarray) -> np.ndarray:
    """Epoch seconds to local-time epoch milliseconds (float64) for a ``type="date"`` axis.

    plotly.js reads numbers on a date axis as UTC milliseconds; adding the local UTC offset makes it show local
    wall-clock time. A float64 array travels as one binary buffer (no per-point datetime objects, no JSON).
    """
    t = np.asarray(t, dtype=np.float64)
    offset = time.localtime(float(t[-1]) if len(t) else time.time()).tm_gmtoff
    return np.round((t + offset) * 1000.0)


def _num(v: float, spec: str, unit: str = "") -> str:
    """A header number, or "–" when nothing reported it (NaN)."""
    return "–" if math.isnan(v) else f"{v:{spec}}{unit}"


def _y_out(y: np.ndarray) -> np.ndarray:
    """Values rounded to 2 decimals as float64 (NaN stays NaN: plotly.js draws a gap there)."""
    return np.round(np.asarray(y, dtype=np.float64), 2)


class _MainThreadLoad:
    """CPU share of one core used by the main thread (the one running cells) since the previous call.

    Reads ``/proc/self/task/<tid>/stat`` (a few µs); where that does not exist it always answers 0.
    """

    def __init__(self) -> None:
        import os

        tid = threading.main_thread().native_id
        self.path = f"/proc/self/task/{tid}/stat"
        self.ok = os.path.exists(self.path)
        self.tick = float(os.sysconf("SC_CLK_TCK")) if self.ok else 100.0
        self.last: tuple[float, float] | None = None

    def _cpu(self) -> float:
        with open(self.path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / self.tick  # utime + stime

    def share(self) -> float:
        if not self.ok:
            return 0.0
        try:
            now, cpu = time.monotonic(), self._cpu()
        except (OSError, ValueError, IndexError):
            return 0.0
        last, self.last = self.last, (now, cpu)
        if last is None or now <= last[0]:
            return 0.0
        return (cpu - last[1]) / (now - last[0])


class MonitorWidget(LiveView):
    """Live dashboard of a :class:`~gpu_notebook.monitor.Monitor`.

    Parameters
    ----------
    monitor
        The monitor to show (started if it is not).
    interval
        Seconds between refreshes (default 1 s).
    window_s
        Seconds of history on the charts (default 300).
    max_points
        Points per trace sent to the browser (default 300).
    max_msgs_per_s
        Cap on widget messages per second, whatever the GPU count (default 5, the least that fits one refresh:
        plotly's FigureWidget spends 4 messages per update, the header 1).
    max_traces
        Most lines per chart before falling back to per-node means, then cluster mean/min/max (default 16).
    heatmap_min_gpus
        Show the node x GPU heat map from this many GPUs on (default 9).
    busy_interval
        Seconds between refreshes while the kernel is computing (its main thread used more than half a core
        since the last timer tick), so an in-kernel training loop shares its interpreter with the dashboard
        less often (default 3 s; ``None`` keeps ``interval`` always). Cells that wait on cluster workers
        (``%%distributed``) use no CPU in the kernel, so the dashboard stays at ``interval`` then.
    autostart
        Start the refresh thread now (default True).
    clock
        Seconds; inject a simulated clock in tests (then call :meth:`refresh` yourself).

    Examples
    --------
    In [1]: from gpu_notebook.monitor import Monitor
    In [2]: Monitor.local().start().widget()
    """

    def __init__(
        self,
        monitor: Monitor,
        *,
        interval: float = 1.0,
        window_s: float = 300.0,
        max_points: int = 300,
        max_msgs_per_s: float = 5.0,
        max_traces: int = 16,
        heatmap_min_gpus: int = 9,
        busy_interval: float | None = 3.0,
        autostart: bool = True,
        clock: Callable[[], float] | None = None,
        height: int | None = None,
    ) -> None:
        import ipywidgets as W

        self.monitor = monitor
        if not getattr(monitor, "started", True):
            monitor.start()
        self.interval = max(0.1, float(interval))
        self.window_s = float(window_s)
        self.max_points = int(max_points)
        self.max_traces = int(max_traces)
        self.heatmap_min_gpus = int(heatmap_min_gpus)
        self.busy_interval = None if busy_interval is None else max(self.interval, float(busy_interval))
        self.clock: Callable[[], float] = clock or getattr(monitor, "clock", None) or time.time
        self.height = height
        self._init_live(RateCap(max(5.0, float(max_msgs_per_s)), self.clock))
        self.refreshes = 0
        self.skipped = 0
        self.unchanged = 0  # timer ticks with no new rows since the last refresh (nothing sent)
        self.deferred = 0  # timer ticks skipped because the kernel was busy (see busy_interval)
        self._version: tuple[Any, ...] | None = None
        self._sent: dict[int, tuple[int, float]] = {}  # trace index -> (points, last x) last sent
        self._last_refresh = -math.inf
        self._load = _MainThreadLoad()
        self._fig_cost = 4
        self._advice = ""
        self._structure: _Plan | None = None
        self._date_axes: dict[str, str] = {}
        self._traces: list[tuple[str, str, TraceKey | None]] = []
        self._waiting = False  # the charts show WAITING: no sample has arrived yet
        self._colours: dict[str, str] = {}  # trace name -> its colour on every chart, kept across rebuilds
        self._advice_at = -math.inf
        self.header = W.HTML(value=self._header_html())
        self.fig = self._build_figure()
        self.box = W.VBox([self.header, self.fig])
        self.box.add_class("gpu-notebook-monitor")
        for w in (self.header, self.box, self.fig):
            self._count(w)
        self.refresh(force=True)
        if autostart:
            self.start()

    # -- figure structure -----------------------------------------------------------------------------------------
    def _plan(self) -> _Plan:
        agg = self.monitor.aggregator
        states = agg.states()  # a copy: the pull thread may add nodes meanwhile
        gpus = [(n, g) for n, s in states for g in s.gpus]
        nodes = [n for n, s in states if s.gpus] if gpus else [n for n, _ in states]
        if gpus:
            mode: Literal["gpu", "host"] = "gpu"
            if len(gpus) <= self.max_traces:
                keys: tuple[TraceKey, ...] = tuple(("gpu", n, g["index"]) for n, g in gpus)
            elif len(nodes) <= self.max_traces:
                keys = tuple(("node", n, None) for n in nodes)
            else:
                keys = (("all", "mean", None), ("all", "min", None), ("all", "max", None))
            heat = len(gpus) >= self.heatmap_min_gpus
        else:
            mode = "host"
            keys = (
                tuple(("node", n, "host") for n in nodes)
                if len(nodes) <= self.max_traces
                else (("all", "mean", None), ("all", "min", None), ("all", "max", None))
            )
            heat = False
        return _Plan(mode, keys, heat)

    @staticmethod
    def _label(key: TraceKey) -> str:
        kind, node, idx = key
        if kind == "gpu":
            return f"{node[:8]}/gpu{idx}"
        if kind == "node":
            return f"{node[:8]} (mean)" if idx is None else node[:8]  # GPU mean per node, or host metrics
        return f"cluster {node}"

    def _colour(self, name: str) -> str:
        """The colour of trace ``name`` on every chart (plotly would give each chart's n-th line the n-th)."""
        from plotly.colors import qualitative

        palette = qualitative.Plotly + qualitative.D3  # 20: the default max_traces lines stay distinct
        return self._colours.setdefault(name, palette[len(self._colours) % len(palette)])

    def _rows(self, plan: _Plan) -> list[tuple[str, str]]:
        if plan.mode == "gpu":
            rows = [
                ("util_gpu", "GPU utilisation %"),
                ("mem_used_mib", "GPU memory used GiB"),
                ("power_w", "power W"),
            ]
            if plan.heat:
                rows.append(("heat", "utilisation now: node x GPU"))
            return rows
        return [
            ("cpu_percent", "host CPU %"),
            ("mem_used_mib", "host memory used GiB"),
            ("net_rx_Bps", "network receive MB/s"),
        ]

    def _build_figure(self) -> Any:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        plan = self._plan()
        rows = self._rows(plan)
        fig = make_subplots(
            rows=len(rows),
            cols=1,
            subplot_titles=[r[1] for r in rows],
            vertical_spacing=0.22 / len(rows) + 0.03,
        )
        self._traces = []
        for r, (metric, _title) in enumerate(rows, start=1):
            if metric == "heat":
                fig.add_trace(
                    go.Heatmap(
                        z=[[0.0]],
                        zmin=0,
                        zmax=100,
                        colorscale="Viridis",
                        showscale=True,
                        colorbar={"len": 1.0 / len(rows), "y": 0.5 / len(rows)},
                    ),
                    row=r,
                    col=1,
                )
                self._traces.append(("heat", "", None))
                continue
            for i, key in enumerate(plan.keys):
                fig.add_trace(
                    go.Scatter(
                        x=[],
                        y=[],
                        mode="lines",
                        name=self._label(key),
                        legendgroup=str(i),
                        showlegend=(r == 1),  # one legend: the first chart's entries toggle every chart
                        line={"width": 1.5, "color": self._colour(self._label(key))},
                    ),
                    row=r,
                    col=1,
                )
                self._traces.append((metric, "series", key))
        fig.update_layout(
            height=self.height or 210 * len(rows) + 40,
            margin={"l": 50, "r": 20, "t": 30, "b": 20},
            uirevision="gpu-notebook-monitor",
            template="plotly_white",
            legend={"orientation": "h", "y": -0.05},
        )
        fig.update_yaxes(rangemode="tozero")
        # x arrives as local-time epoch milliseconds (binary float64), shown as dates
        self._date_axes = {}
        for r, (metric, _title) in enumerate(rows, start=1):
            if metric != "heat":
                fig.update_xaxes(type="date", row=r, col=1)
                self._date_axes[f"xaxis{'' if r == 1 else r}.type"] = "date"
        if plan.mode == "gpu" or plan.mode == "host":
            fig.update_yaxes(range=[0, 100], row=1, col=1)
        self._waiting = self.monitor.aggregator.rows_in == 0
        if self._waiting:
            self._add_waiting_notes(fig, rows)
        self._structure = plan
        self._sent = {}
        return go.FigureWidget(fig)

    def _add_waiting_notes(self, fig: Any, rows: list[tuple[str, str]]) -> None:
        """Say what an empty chart waits for, on the current time window (an empty date axis would show
        plotly's default range, January to December 2000)."""
        now = self.clock()
        window = _to_ms(np.array([now - self.window_s, now])).tolist()
        for r, (metric, _title) in enumerate(rows, start=1):
            if metric == "heat":
                continue
            fig.update_xaxes(range=window, row=r, col=1)
            suffix = "" if r == 1 else str(r)
            fig.add_annotation(
                text=WAITING,
                name="waiting",
                xref=f"x{suffix} domain",
                yref=f"y{suffix} domain",
                x=0.5,
                y=0.5,
                showarrow=False,
                font={"color": "#888", "size": 14},
            )

    def _stop_waiting(self) -> None:
        """The first samples arrived: drop the notes and let the time axes follow the data."""
        self._waiting = False
        fig = self.fig
        with fig.batch_update():
            fig.layout.annotations = [a for a in fig.layout.annotations if a.name != "waiting"]
            for key in self._date_axes:
                axis = fig.layout[key.split(".")[0]]
                axis.range, axis.autorange = None, True

    # -- data -----------------------------------------------------------------------------------------------------
    def _series(
        self,
        metric: str,
        key: TraceKey,
        since: float,
        now: float,
        cache: dict[str, list[GpuSeries] | list[HostSeries]],
    ) -> tuple[np.ndarray, np.ndarray]:
        mode = self._structure.mode if self._structure else "gpu"
        if metric not in cache:
            agg = self.monitor.aggregator
            cache[metric] = agg.gpu_series(metric, since) if mode == "gpu" else agg.host_series(metric, since)
        series = cache[metric]
        kind, node, idx = key
        scale = 1 / 1024 if metric == "mem_used_mib" else (1e-6 if metric == "net_rx_Bps" else 1.0)
        if kind == "gpu":
            for s in cast("list[GpuSeries]", series):  # a "gpu" key is only planned in mode "gpu"
                if s["node"] == node and s["index"] == idx:
                    t, y = _decimate(s["t"], s["y"], self.max_points)
                    return t, y * scale
            return np.zeros(0), np.zeros(0)
        if kind == "node":
            parts = [(s["t"], s["y"]) for s in series if s["node"] == node]
            if mode == "host" and parts:
                t, y = _decimate(parts[0][0], parts[0][1], self.max_points)
                return t, y * scale
            t, y = _binned(parts, since, now, self.max_points, "mean")
            return t, y * scale
        t, y = _binned([(s["t"], s["y"]) for s in series], since, now, self.max_points, node)
        return t, y * scale

    def _heat(self) -> tuple[list[list[float | None]], list[str], list[str]]:
        latest = self.monitor.aggregator.latest()["gpus"]
        nodes: list[str] = []
        for r in latest:
            if r["node"] not in nodes:
                nodes.append(r["node"])
        width = max((r["index"] for r in latest), default=-1) + 1
        z = np.full((len(nodes), max(width, 1)), np.nan)
        pos = {n: i for i, n in enumerate(nodes)}
        for r in latest:
            z[pos[r["node"]], r["index"]] = r["util_gpu"]
        zl = [[None if math.isnan(v) else v for v in row] for row in z.round(1).tolist()]
        return zl, [f"gpu{i}" for i in range(max(width, 1))], [n[:8] for n in nodes]

    def _header_html(self) -> str:
        mon = self.monitor
        latest = mon.aggregator.latest()
        states = mon.aggregator.states()
        failed = getattr(mon, "failed_nodes", {})  # nodes whose sampler could not be started count as down
        up = sum(1 for _, s in states if s.up)
        cells: list[tuple[str, str]] = [("nodes", f"{up}/{len(states) + len(failed)}")]
        g = latest["gpus"]
        if g:

            def mean(k: GpuMetric) -> float:
                v = [r[k] for r in g if not math.isnan(r[k])]
                return float(np.mean(v)) if v else math.nan

            def total(k: GpuMetric) -> float:  # NaN if no GPU reports it (NVML_ERROR_NOT_SUPPORTED), never 0
                v = [r[k] for r in g if not math.isnan(r[k])]
                return float(sum(v)) if v else math.nan

            cells += [
                ("GPUs", str(len(g))),
                ("mean util", _num(mean("util_gpu"), ".0f", "%")),
                (
                    "memory",
                    f"{_num(total('mem_used_mib') / 1024, '.1f')}/"
                    f"{_num(total('mem_total_mib') / 1024, '.0f')} GiB",
                ),
                ("power", _num(total("power_w"), ".0f", " W")),
            ]
            sm = mean("sm_active")
            if not math.isnan(sm):
                cells.append(("SM active", f"{sm:.2f}"))
            temp = max((r["temp_c"] for r in g if not math.isnan(r["temp_c"])), default=math.nan)
            if not math.isnan(temp):
                cells.append(("max temp", f"{temp:.0f} °C"))
        else:
            h = latest["hosts"]
            cpu = [r["cpu_percent"] for r in h if not math.isnan(r["cpu_percent"])]
            mems = [r["mem_used_mib"] for r in h if not math.isnan(r["mem_used_mib"])]
            cells += [
                ("GPUs", "none (host metrics)"),
                ("mean CPU", f"{np.mean(cpu):.0f}%" if cpu else "–"),
                ("memory", _num(sum(mems) / 1024 if mems else math.nan, ".1f", " GiB")),
            ]
        body = "".join(
            f"<div style='display:inline-block;margin-right:1.6em'><div style='font-size:0.8em;color:#666'>"
            f"{html.escape(k)}</div><div style='font-size:1.3em;font-weight:600'>{html.escape(v)}</div></div>"
            for k, v in cells
        )
        down = ""
        if failed:
            from gpu_notebook.monitor._html import down_nodes_html

            down = down_nodes_html(mon)
        return f"<div class='gpu-notebook-monitor-header'>{body}{down}</div>"

    def _advice_html(self) -> str:
        """One compact block: the under-used GPUs by name, then the remedies once."""
        from gpu_notebook.monitor import REMEDIES

        items = self.monitor.advice()
        if not items:
            return ""

        def names(group: list[Advice]) -> str:
            shown = ", ".join(f"{a.node[:8]}/gpu{a.gpu} {a.mean_util:.0f}%" for a in group[:12])
            return shown + (f" … and {len(group) - 12} more" if len(group) > 12 else "")

        a0 = items[0]
        minutes = a0.window_s / 60
        span = f"{minutes:.0f} min" if minutes >= 1 else f"{a0.window_s:.0f} s"
        low = [a for a in items if not a.idle]
        idle = [a for a in items if a.idle]
        parts = []
        if low:
            gpu_names = sorted({a.name for a in low})
            parts.append(
                f"<div><b>Under {a0.threshold:.0f}% for the last {span}</b> ({html.escape(', '.join(gpu_names))}): "
                f"{html.escape(names(low))}. Try " + html.escape(", ".join(REMEDIES)) + ".</div>"
            )
        if idle:
            parts.append(f"<div><b>Idle for the last {span}</b>: {html.escape(names(idle))}.</div>")
        return f"<div class='gpu-notebook-monitor-advice' style='color:#8a5a00;margin-top:4px'>{''.join(parts)}</div>"

    # -- refresh --------------------------------------------------------------------------------------------------
    def _push(self, restyle: dict[str, Any], idx: list[int]) -> None:
        """One ``Plotly.update``: the new trace data plus the x axes' ``type="date"``.

        plotly.js resets an axis type to "autodetect" whenever a restyle replaces x, and numbers would then
        autodetect as a linear axis; an update that names the type in the same message keeps the date axis.
        plotly.py only sends the layout keys that changed on its side, so the message is built here from its
        (long-standing) internal steps: apply to the Python-side figure, then send one update message.
        """
        fig = self.fig
        perform = getattr(fig, "_perform_plotly_restyle", None)
        send = getattr(fig, "_send_update_msg", None)
        if (
            perform is None or send is None
        ):  # pragma: no cover - a plotly without them: public API, numeric axes
            fig.plotly_restyle(restyle, idx)
            return
        changes = perform(restyle, idx)
        if changes:
            send(changes, dict(self._date_axes), idx)

    def _data_version(self) -> tuple[Any, ...]:
        """Changes whenever the aggregator received rows or a node went up/down."""
        agg = self.monitor.aggregator
        states = agg.states()
        failed = tuple(getattr(self.monitor, "failed_nodes", {}))
        return (agg.rows_in, len(states), tuple(st.up for _, st in states), failed)

    def refresh(self, force: bool = False) -> bool:
        """Push new data to the browser unless the message cap says wait; returns whether it updated.

        Nothing is computed or sent when no new rows arrived since the last refresh (unless ``force``, or the
        window needs sliding after 10 s). The figure update is one ``restyle`` of only the traces whose data
        changed, with x and y as binary float64 buffers; it costs a fixed number of messages (4 with plotly's
        FigureWidget); the header (numbers and advice, one message) is sent only when it changed and only if
        it still fits in the budget.
        """
        with self._lock:
            now = self.clock()
            version = self._data_version()
            if not force and version == self._version and now - self._last_refresh < 10.0:
                self.unchanged += 1
                return False
            if not force and not self.rate.allows(self._fig_cost + 1):
                self.skipped += 1
                return False
            if self._plan() != self._structure:
                self.fig = self._build_figure()
                self._count(self.fig)
                self.box.children = (self.header, self.fig)
            self._version = version
            self._last_refresh = now
            before = self.rate.total
            restyle, idx = self._restyle(now, force)
            if idx:
                self._push(restyle, idx)
                self._fig_cost = max(1, self.rate.total - before)
            if self._waiting and self.monitor.aggregator.rows_in:
                self._stop_waiting()
            if now - self._advice_at >= 10.0:
                self._advice_at = now
                self._advice = self._advice_html()
            header = self._header_html() + self._advice
            if header != self.header.value and (force or self.rate.recent() + 1 <= self.rate.max):
                self.header.value = header
            self.refreshes += 1
            return True

    def _restyle(self, now: float, force: bool) -> tuple[dict[str, Any], list[int]]:
        """The restyle of the traces whose data changed since they were last sent (all with ``force``), and
        their indices; the heat map, when shown, is always in it."""
        from plotly.basedatatypes import Undefined  # "leave this trace's property alone" in a restyle

        since = now - self.window_s
        cache: dict[str, list[GpuSeries] | list[HostSeries]] = {}
        idx: list[int] = []
        xs: list[Any] = []
        ys: list[Any] = []
        zs: list[Any] = []
        heat_at: int | None = None
        for i, (metric, _kind, key) in enumerate(self._traces):
            if metric == "heat":
                heat_at = i
                continue
            t, y = self._series(metric, cast("TraceKey", key), since, now, cache)  # (heat has no key)
            mark = (len(t), float(t[-1]) if len(t) else math.nan)
            if not force and self._sent.get(i) == mark:
                continue  # this trace got nothing new (a stale node): do not resend it
            self._sent[i] = mark
            idx.append(i)
            xs.append(_to_ms(t))
            ys.append(_y_out(y))
            zs.append(Undefined)
        if heat_at is not None:
            z, hx, hy = self._heat()
            idx.append(heat_at)
            xs.append(hx)
            ys.append(hy)
            zs.append(z)
        restyle: dict[str, Any] = {"x": xs, "y": ys}
        if heat_at is not None:
            restyle["z"] = zs
        return restyle, idx

    thread_name = "gpu_notebook-monitor-widget"

    def _parts(self) -> tuple[Any, ...]:
        return (self.box, self.header, self.fig)

    def _thread_started(self) -> None:
        self._load.share()  # the first reading: the next one measures the kernel's load since now

    def _finished(self) -> bool:
        return not getattr(self.monitor, "started", True)  # the monitor stopped (cluster stop)

    def _tick(self) -> None:
        busy = self.busy_interval is not None and self._load.share() > 0.5
        if busy and self.clock() - self._last_refresh < float(self.busy_interval or 0.0):
            self.deferred += 1
            return
        self.refresh()

    # -- display --------------------------------------------------------------------------------------------------
    def snapshot_html(self) -> str:
        """The static HTML table fallback (no scripts, no images)."""
        return self.monitor.snapshot_html()

    def snapshot_text(self) -> str:
        """The same table as :meth:`snapshot_html`, as plain text."""
        return str(self.monitor.snapshot_text())

    def show(self) -> None:
        """Display the dashboard and keep a handle so :meth:`stop` can leave a static snapshot behind."""
        self._show()

    def __repr__(self) -> str:
        state = "live" if self.live else "paused"
        return (
            f"MonitorWidget({len(self.monitor.nodes)} nodes, {self.monitor.gpu_count} GPUs, "
            f"every {self.interval:g}s, {state})"
        )
