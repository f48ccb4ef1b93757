"""The live cost view: $/hour now, $ so far, next-hour projection, market comparison, budget and idle countdown.

:class:`CostWidget` is a cached view of a :class:`~gpu_notebook.cost.CostMeter`: a stock ipywidgets ``HTML``
header (the numbers, the budget bar, the idle-stop countdown, the estimate label) above one plotly
``FigureWidget`` (dollars accrued over time, and what the same node-hours cost on-demand / spot / 1-year
reserved). A daemon thread refreshes it every few seconds and sends only what changed, at most
``max_msgs_per_s`` messages per second. The mime bundle carries a static ``text/html`` card, so a saved
notebook shows the last numbers, and :meth:`stop` replaces a displayed view by that card.
Without ipywidgets/plotly, :func:`cost_view` returns the meter's static snapshot instead.
"""

from __future__ import annotations

import datetime as _dt
import html
import time
from collections.abc import Callable
from typing import Any

from gpu_notebook._display import fmt_duration
from gpu_notebook.widgets._live import LiveView, RateCap

__all__ = ["CostWidget", "cost_view"]

_MARKET_LABELS = {"on_demand": "on-demand", "spot": "spot", "reserved_1y": "1-year reserved"}


def _fmt_s(s: float | None) -> str:
    return "?" if s is None else fmt_duration(s, minutes=True)


def header_html(snap: Any) -> str:
    """The header card: numbers, budget bar, policy lines and the estimate label."""
    from gpu_notebook.cost._meter import snapshot_html

    parts = [snapshot_html(snap)]
    for p in snap.policies:
        if p.get("name") == "idle stop" and p.get("state") == "countdown":
            parts.insert(
                0,
                "<div style='background:#fdebd0;padding:4px;border-left:4px solid #e67e22'>"
                f"<b>Idle stop in {_fmt_s(p.get('remaining_s'))}</b>: run any cell to keep the "
                "workers</div>",
            )
        if p.get("state") == "stopped":
            parts.insert(
                0,
                "<div style='background:#fadbd8;padding:4px;border-left:4px solid #c0392b'>"
                f"<b>Workers stopped</b>: {html.escape(str(p.get('message', '')))}</div>",
            )
    return "".join(parts)


class CostWidget(LiveView):
    """Live view of a :class:`~gpu_notebook.cost.CostMeter`.

    Parameters
    ----------
    meter
        The cost meter to show.
    interval
        Seconds between refreshes (default 2).
    max_points
        Points kept on the $ over time chart (default 300).
    max_msgs_per_s
        Cap on widget messages per second (default 5).
    autostart
        Start the refresh thread now (default True).
    clock
        Seconds; defaults to the meter's clock (inject a simulated one in tests and call :meth:`refresh`).

    Examples
    --------
    In [1]: from gpu_notebook.cost import cost_meter_for
    In [2]: CostWidget(cost_meter_for(cluster)).show()
    """

    def __init__(
        self,
        meter: Any,
        *,
        interval: float = 2.0,
        max_points: int = 300,
        max_msgs_per_s: float = 5.0,
        autostart: bool = True,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import ipywidgets as W
        import plotly.graph_objects as go

        self.meter = meter
        self.interval = max(0.2, float(interval))
        self.max_points = int(max_points)
        self.max_msgs_per_s = float(max_msgs_per_s)
        self.clock: Callable[[], float] = clock or getattr(meter, "clock", None) or time.time
        # the message budget is counted in real seconds, whatever clock the meter runs on
        self._init_live(RateCap(self.max_msgs_per_s, time.monotonic))
        self.refreshes = 0
        self.skipped = 0
        self._last: tuple[Any, ...] | None = None
        snap = meter.snapshot(self.clock())
        self.header = W.HTML(value=header_html(snap))
        fig = go.FigureWidget(
            layout=dict(
                height=260,
                margin=dict(l=50, r=10, t=30, b=30),
                showlegend=False,
                xaxis=dict(domain=[0, 0.62], title=None),
                yaxis=dict(title="USD so far", rangemode="tozero"),
                xaxis2=dict(domain=[0.72, 1.0]),
                yaxis2=dict(anchor="x2", title="same node-hours, USD", rangemode="tozero"),
                title=dict(text="cost (estimate)", font=dict(size=12)),
            )
        )
        fig.add_scatter(x=[], y=[], mode="lines", name="USD so far", line=dict(shape="hv"))
        fig.add_bar(
            x=[_MARKET_LABELS[m] for m in ("on_demand", "spot", "reserved_1y")],
            y=[0, 0, 0],
            xaxis="x2",
            yaxis="y2",
            name="markets",
        )
        self.fig = fig
        self.box = W.VBox([self.header, self.fig])
        self.box.add_class("gpu-notebook-cost")
        for w in (self.header, self.fig, self.box):
            self._count(w)
        self.refresh(force=True)
        if autostart:
            self.start()

    def _finished(self) -> bool:
        """The meter's cluster has stopped: one last refresh shows the final figure, then the thread ends."""
        cluster = getattr(self.meter, "cluster", None)
        return cluster is not None and getattr(cluster, "state", "running") in ("stopped", "failed")

    # -- refresh -----------------------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> bool:
        """Send new numbers if they changed and the message cap allows; returns whether anything was sent."""
        with self._lock:
            if not force and self.rate.recent() + 5 > self.rate.max:  # a refresh costs up to 5 messages
                self.skipped += 1
                return False
            now = self.clock()
            try:
                self.meter.poll(
                    now
                )  # nodes that joined or left since the last look (no policy watcher polls)
            except Exception:  # noqa: BLE001 - a display problem must never reach the user's cells
                pass
            snap = self.meter.snapshot(now)
            hist = self.meter.history[-self.max_points :]
            key = (
                round(snap.spent_usd, 2),
                round(snap.usd_per_hour, 2),
                snap.nodes_running,
                tuple((p.get("state"), p.get("message")) for p in snap.policies),
                len(hist),
            )
            if key == self._last and not force:
                return False
            self._last = key
            head = header_html(snap)
            if head != self.header.value:
                self.header.value = head
            xs = [_dt.datetime.fromtimestamp(t) for t, _s, _r in hist]
            with self.fig.batch_update():
                self.fig.data[0].x = xs
                self.fig.data[0].y = [round(s, 4) for _t, s, _r in hist]
                self.fig.data[1].y = [
                    round(snap.by_market[m], 4) for m in ("on_demand", "spot", "reserved_1y")
                ]
                self.fig.layout.title.text = (
                    "local cluster: $0"
                    if snap.is_local
                    else f"${snap.spent_usd:,.2f} so far (estimate"
                    + (f", prices as of {snap.date})" if snap.date else ")")
                )
            self.refreshes += 1
            return True

    thread_name = "gpu_notebook-cost-widget"

    def _parts(self) -> tuple[Any, ...]:
        return (self.box, self.header, self.fig)

    # -- display -----------------------------------------------------------------------------------------------
    def snapshot_html(self) -> str:
        return header_html(self.meter.snapshot(self.clock()))

    def show(self) -> Any:
        """Display the view and keep a handle so :meth:`stop` can leave a static card behind."""
        return self._show()

    def _text_plain(self) -> str:
        return str(self.meter.snapshot(self.clock()))

    def __repr__(self) -> str:
        state = "live" if self.live else "paused"
        return f"CostWidget({self.meter!r}, every {self.interval:g}s, {state})"


def cost_view(meter: Any, **kwargs: Any) -> Any:
    """A live :class:`CostWidget`, or the meter's static snapshot where ipywidgets/plotly are missing."""
    try:
        import ipywidgets  # noqa: F401
        import plotly  # noqa: F401
    except ImportError:
        return meter.snapshot()
    return CostWidget(meter, **kwargs)
