"""``%gpu_cost``: live cost of the current cluster, budget and idle-stop policies, the price catalog (thin over
:mod:`gpu_notebook.cost` and :mod:`gpu_notebook.catalog`)."""

from __future__ import annotations

import argparse
import html
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display

from gpu_notebook._display import text_table
from gpu_notebook.catalog import get_catalog
from gpu_notebook.cluster import get_manager
from gpu_notebook.cost import (
    add_policies,
    cost_meter_for,
    describe,
    watcher_for,
)
from gpu_notebook.cost._watcher import last_stopped
from gpu_notebook.magics._args import budget_usd, duration, idle_minutes, text
from gpu_notebook.magics._common import (
    MagicError,
    Option,
    option,
    options,
    parse,
    refuse_others,
    reported,
    subcommands,
    usage_errors,
)
from gpu_notebook.widgets import Static, cost_view
from gpu_notebook.widgets._cost import CostWidget
from gpu_notebook.widgets._live import stop_live_views

COMMANDS = ["show", "status", "policies", "catalog", "refresh", "stop"]

BUDGET = option(
    "--budget",
    type=budget_usd(),
    metavar="USD",
    help="policies: stop the workers when the estimate reaches USD",
)
IDLE_STOP = option(
    "--idle-stop",
    type=idle_minutes(),
    metavar="MINUTES",
    help="policies: stop the workers after MINUTES idle",
)
REFRESH = option(
    "--refresh",
    type=duration(minimum=0.1, maximum=3600),
    default=2.0,
    metavar="SECONDS",
    help="show: seconds between updates (default 2)",
)
TEXT = option("--text", action="store_true", help="show: print the numbers once instead of a live view")
CLOUD = option("--cloud", type=text("a cloud: aws, gcp or azure"), help="catalog/refresh: aws, gcp or azure")
GPU = option("--gpu", type=text("a GPU type such as A100"), help="catalog: GPU type, e.g. A100 or A100-80GB")
REGION = option(
    "--region", type=text("a region such as us-east-1"), help="catalog/refresh: region, e.g. us-east-1"
)
EVERY_OPTION = (BUDGET, IDLE_STOP, REFRESH, TEXT, CLOUD, GPU, REGION)
#: the options each subcommand takes; any other one given is a usage error, never ignored
OPTIONS: dict[str, tuple[Option, ...]] = {
    "show": (REFRESH, TEXT),
    "status": (),
    "policies": (BUDGET, IDLE_STOP),
    "catalog": (CLOUD, GPU, REGION),
    "refresh": (CLOUD, REGION),
    "stop": (),
}


@magics_class
class CostMagics(Magics):
    """The ``%gpu_cost`` magic."""

    def __init__(self, shell: Any = None, **kwargs: Any) -> None:
        super().__init__(shell, **kwargs)
        self._widgets: list[Any] = []

    @magic_arguments()
    @argument("command", nargs="?", default="show", choices=COMMANDS, help="what to do (default: show)")
    @options(*EVERY_OPTION)
    @subcommands(OPTIONS)
    @line_magic
    def gpu_cost(self, line: str) -> Any:
        """Live cost of the current cluster: $/hour now, $ so far, next hour, on-demand vs spot vs reserved.

        Prices are list-price estimates from the catalog (source and date shown); a local cluster costs $0.
        With no cluster running, ``status`` shows the final figures of the last one a budget, an idle stop or
        a stop ended (when it had policies).

        Examples
        --------
        In [1]: %gpu_cost
        In [2]: %gpu_cost status
        In [3]: %gpu_cost policies --budget 25 --idle-stop 60
        In [4]: %gpu_cost catalog --cloud aws --gpu A100
        In [5]: %gpu_cost refresh --cloud azure
        In [6]: %gpu_cost stop
        """
        args = parse(self.gpu_cost, line)
        with reported(self.gpu_cost, command=args.command):
            refuse_others(args, OPTIONS, args.command)
            try:
                return getattr(self, f"_cmd_{args.command}")(args)
            except OSError as exc:  # refresh: the price APIs' network, the catalog cache's files
                raise MagicError(str(exc)) from None
        return None

    @staticmethod
    def _meter() -> Any:

        cluster = get_manager().current
        if cluster is None:
            raise MagicError("no cluster: start one with %gpu_cluster start")
        meter = cost_meter_for(cluster)
        meter.poll()  # the nodes as they are now (one may have left or joined since the meter last looked)
        return meter

    def _cmd_show(self, args: argparse.Namespace) -> None:
        meter = self._meter()
        if args.text:
            print(meter.snapshot())
            return
        view = cost_view(meter, interval=args.refresh)
        if hasattr(view, "show"):
            self._widgets.append(view)
            view.show()
        else:
            display(view)

    def _cmd_status(self, args: argparse.Namespace) -> None:
        last = last_stopped() if get_manager().current is None else None
        if last is not None:  # after a budget or idle stop: what the stopped cluster cost, its final figure
            name, meter, reason = last
            print(f"cluster {name!r} stopped ({reason}); no cluster is running. Its cost:")
            print(meter.snapshot())
            return
        print(self._meter().snapshot())

    def _cmd_policies(self, args: argparse.Namespace) -> None:

        cluster = get_manager().current
        if cluster is None:
            raise MagicError("no cluster: start one with %gpu_cluster start")
        if args.budget is None and args.idle_stop is None:
            w = watcher_for(cluster)
            print(
                "\n".join(f"{s['name']}: {s['state']} {s['message']}" for s in w.status())
                if w and w.policies
                else "No cost policies; add them with %gpu_cost policies --budget USD --idle-stop MINUTES"
            )
            return
        # policies add up: the one not given is kept as it is; one given replaces its kind, and says so
        with usage_errors(ValueError):  # the policies' own checks: --budget 0, --idle-stop -5
            w, replaced = add_policies(cluster, idle_stop_minutes=args.idle_stop, budget_usd=args.budget)
        print(
            f"cluster {cluster.name!r}: {describe(w)}"
            + (f" (replaces {' and '.join(replaced)})" if replaced else "")
        )

    def _cmd_catalog(self, args: argparse.Namespace) -> None:

        cat = get_catalog()
        rows = cat.table(cloud=args.cloud, gpu=args.gpu, region=args.region)
        if not rows:
            print("No instance types match.")
            return
        cols = [
            "cloud",
            "instance_type",
            "gpu",
            "vcpus",
            "memory_gb",
            "region",
            "on_demand",
            "spot",
            "reserved_1y",
        ]

        def cell(r: dict[str, Any], c: str) -> str:
            v = r.get(c, "")
            return f"{v:.3f}" if isinstance(v, float) and c in cols[6:] else str(v)

        cells = [[cell(r, c) for c in cols] for r in rows]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in cells)
        title = f"USD per hour, estimates — {cat.source}, as of {cat.date}"
        display(
            Static(
                f"<div><b>USD per hour, estimates</b> &mdash; {html.escape(cat.source)}, as of "
                f"{html.escape(cat.date)}<table><tr>{head}</tr>{body}</table></div>",
                f"{title}\n{text_table(cols, cells)}",
            )
        )

    def _cmd_refresh(self, args: argparse.Namespace) -> None:

        clouds = [args.cloud] if args.cloud else None
        regions = [args.region] if args.region else None
        print(get_catalog().refresh(clouds=clouds, regions=regions))

    def _cmd_stop(self, args: argparse.Namespace) -> None:
        n = sum(w.live for w in self._widgets)
        for w in self._widgets:  # also one whose thread ended with its cluster: it leaves its snapshot behind
            w.stop()
        self._widgets.clear()
        # and every other live cost view: one made by magics since reloaded (%reload_ext) is in no list of ours
        n += stop_live_views(CostWidget)
        print(f"{n} cost view(s) stopped." if n else "No live cost view.")


__all__ = ["CostMagics"]
