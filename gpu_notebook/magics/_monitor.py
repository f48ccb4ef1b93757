"""``%gpu_monitor``: the live GPU dashboard and its exports (thin over :mod:`gpu_notebook.monitor`)."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from traitlets import Float

from gpu_notebook.cluster._status import dashboard_link
from gpu_notebook.cost import cost_meter_for
from gpu_notebook.magics._args import duration, path, percent, tcp_port, text
from gpu_notebook.magics._common import (
    MagicError,
    Option,
    option,
    options,
    parse,
    refuse_others,
    reported,
    subcommands,
)
from gpu_notebook.monitor import monitor_for, running_monitor, stop_monitors
from gpu_notebook.widgets import Static

COMMANDS = ["show", "stop", "status", "snapshot", "advice", "csv", "prometheus"]


#: the shortest sampling or refresh period (20 per second; shorter ones would only load the kernel)
MIN_PERIOD_S = 0.05
LOCAL = option("--local", action="store_true", help="watch only this machine, even when a cluster is running")
INTERVAL = option(
    "--interval",
    type=duration(minimum=MIN_PERIOD_S, maximum=3600),
    metavar="SECONDS",
    help="sampling period on each node, seconds (default 0.5)",
)
REFRESH = option(
    "--refresh",
    type=duration(minimum=MIN_PERIOD_S, maximum=3600),
    metavar="SECONDS",
    help="show: dashboard refresh period (default 1)",
)
WINDOW = option(
    "--window",
    type=duration(),
    metavar="SECONDS",
    help="show: seconds of history on the charts (default 300)",
)
ADVICE_WINDOW = option(
    "--advice-window",
    type=duration(),
    metavar="SECONDS",
    help="seconds a GPU must stay under the threshold (default 300)",
)
THRESHOLD = option(
    "--threshold",
    type=percent(),
    metavar="PERCENT",
    help="utilisation %% below which a GPU is under-used (default 70)",
)
PORT = option("--port", type=tcp_port(), default=0, help="prometheus: TCP port (default: a free one)")
HOST = option(
    "--host",
    type=text("an address to bind such as 127.0.0.1 or 0.0.0.0"),
    default="127.0.0.1",
    help="prometheus: address to bind (default 127.0.0.1)",
)
PATH = option("--path", type=path("file"), help="csv: write to this file instead of printing")
EVERY_OPTION = (LOCAL, INTERVAL, REFRESH, WINDOW, ADVICE_WINDOW, THRESHOLD, PORT, HOST, PATH)
#: the options each subcommand takes (the sampling ones start a monitor, so every command that may start one
#: takes them); any other option given is a usage error, never ignored
SAMPLING = (LOCAL, INTERVAL, ADVICE_WINDOW, THRESHOLD)
OPTIONS: dict[str, tuple[Option, ...]] = {
    "show": (*SAMPLING, REFRESH, WINDOW),
    "stop": (LOCAL,),
    "status": (LOCAL,),
    "snapshot": SAMPLING,
    "advice": SAMPLING,
    "csv": (*SAMPLING, PATH),
    "prometheus": (*SAMPLING, PORT, HOST),
}


@magics_class
class MonitorMagics(Magics):
    """The ``%gpu_monitor`` magic. Defaults are configurable, e.g. ``c.MonitorMagics.interval = 1.0``."""

    interval = Float(0.5, config=True, help="Seconds between samples on each node (fast tier).")
    refresh = Float(1.0, config=True, help="Seconds between dashboard refreshes.")
    window = Float(300.0, config=True, help="Seconds of history on the dashboard charts.")
    advice_window = Float(
        300.0, config=True, help="Seconds a GPU must stay under the threshold to be flagged."
    )
    threshold = Float(70.0, config=True, help="Utilisation percent below which a GPU counts as under-used.")
    max_msgs_per_s = Float(5.0, config=True, help="Cap on dashboard widget messages per second (at least 5).")

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self._widgets: list[Any] = []

    @magic_arguments()
    @argument("command", nargs="?", default="show", choices=COMMANDS, help="what to do (default: show)")
    @options(*EVERY_OPTION)
    @subcommands(OPTIONS)
    @line_magic
    def gpu_monitor(self, line: str) -> Any:
        """Live dashboard of every GPU on every node (CPU/memory/network where there is no GPU).

        Examples
        --------
        In [1]: %gpu_monitor
        In [2]: %gpu_monitor show --refresh 2 --window 600
        In [3]: %gpu_monitor advice --advice-window 120
        In [4]: %gpu_monitor prometheus --port 9400
        In [5]: %gpu_monitor csv --path gpu.csv
        In [6]: %gpu_monitor stop
        """
        args = parse(self.gpu_monitor, line)
        with reported(self.gpu_monitor, command=args.command):
            refuse_others(args, OPTIONS, args.command)
        for name in ("interval", "refresh", "window", "advice_window", "threshold"):
            if getattr(args, name) is None:
                setattr(args, name, getattr(self, name))
        with reported(self.gpu_monitor, command=args.command):
            try:
                return getattr(self, f"_cmd_{args.command}")(args)
            except OSError as exc:  # csv --path unwritable, prometheus --port taken: the machine's, not ours
                raise MagicError(str(exc)) from None
        return None

    @staticmethod
    def _monitor(args: argparse.Namespace) -> Any:
        return monitor_for(
            local=args.local,
            interval=args.interval,
            advice_window=args.advice_window,
            advice_threshold=args.threshold,
        )

    def _cmd_show(self, args: argparse.Namespace) -> Any:
        w = self._monitor(args).widget(
            interval=args.refresh, window_s=args.window, max_msgs_per_s=self.max_msgs_per_s
        )
        self._widgets.append(w)
        w.show()
        return None

    @staticmethod
    def _running(args: argparse.Namespace) -> Any:
        return running_monitor(local=args.local)

    def _cmd_stop(self, args: argparse.Namespace) -> None:
        had_widgets = bool(self._widgets)
        for w in self._widgets:
            w.stop()
        self._widgets.clear()
        # never starts samplers only to stop them; without --local, a --local monitor stops too
        stopped = stop_monitors(local=args.local, every=not args.local)
        if stopped:  # say which: a cluster's, this machine's (--local), or both
            print(f"GPU monitor stopped. Stopped: {', '.join(stopped)}.")
        else:
            print("GPU monitor stopped." if had_widgets else "No GPU monitor is running.")

    def _cmd_status(self, args: argparse.Namespace) -> None:
        mon = self._running(args)
        print(repr(mon) if mon is not None else "No GPU monitor is running; start one with %gpu_monitor")

    def _cmd_snapshot(self, args: argparse.Namespace) -> None:
        mon = self._monitor(args)
        display(Static(mon.snapshot_html(), mon.snapshot_text()))

    def _cmd_advice(self, args: argparse.Namespace) -> None:
        items = self._monitor(args).advice(args.advice_window, args.threshold)
        print(
            "\n".join(a.message for a in items)
            if items
            else "No under-used GPU (or not enough history yet for the advice window)."
        )

    def _cmd_csv(self, args: argparse.Namespace) -> None:
        mon = self._monitor(args)
        # no GPU anywhere: the host metrics, not an empty nvidia-smi table
        text = mon.to_csv(args.path, hosts=mon.gpu_count == 0)
        print(f"wrote {args.path}" if args.path else text, end="\n" if args.path else "")

    def _cmd_prometheus(self, args: argparse.Namespace) -> None:
        mon = self._monitor(args)
        if mon.cluster is not None:  # the export carries the cluster's cost, read from its shared meter
            cost_meter_for(mon.cluster)
        srv = mon.serve_prometheus(port=args.port, host=args.host)
        link = dashboard_link("Prometheus metrics", srv.host, srv.port, "metrics")
        if link.proxied:  # Binder, JupyterHub: the browser reaches the port only through the notebook server
            print(f"Prometheus metrics through Jupyter at {link.url}")
        print(f"Prometheus metrics at {srv.url}")


__all__ = ["MonitorMagics"]
