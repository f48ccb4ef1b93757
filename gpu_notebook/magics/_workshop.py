"""``%gpu_cluster`` for workshops: the options and the subcommands a teacher and a student use.

Thin over :mod:`gpu_notebook.cluster.workshop`. The teacher::

    %gpu_cluster workshop start ml101 --quota-cpus 2 --budget 5 --price-cpu-hour 0.05
    %gpu_cluster students                       # the live teacher view (a text table with --text)
    %gpu_cluster students stop bob              # or: %gpu_cluster students stop --all
    %gpu_cluster workshop stop                  # every student's workers, then the broker

A student::

    %gpu_cluster start --address 10.0.0.5:6379 --workshop ml101 --student alice

:mod:`gpu_notebook.magics._cluster` declares these options with its own and dispatches here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from IPython.core.error import UsageError

from gpu_notebook.cluster.workshop import QuotaError, Workshop, WorkshopCluster, current_workshop
from gpu_notebook.magics._args import convert, hourly_usd, name, number
from gpu_notebook.magics._common import option, progress_printer, show, usage_errors
from gpu_notebook.widgets._students import students_view

__all__ = [
    "STUDENTS_ARGS",
    "WORKSHOP_ARGS",
    "WORKSHOP_START_ARGS",
    "start_student",
    "students",
    "workshop",
]

#: ``start``: join a workshop's cluster as a student
WORKSHOP_START_ARGS = (
    option(
        "--workshop",
        type=name("workshop name"),
        metavar="NAME",
        help="start: join this workshop (with --address and --student); students: the workshop to show "
        "(default: the one this kernel started)",
    ),
    option(
        "--student",
        type=name("student ID"),
        metavar="ID",
        help="start --workshop: your student ID; the same ID reconnects to your workers after a kernel restart",
    ),
)
#: ``workshop start``: the rules every student gets (with --budget and --idle-stop, per student)
WORKSHOP_ARGS = (
    option(
        "--quota-cpus",
        type=number("CPUs", maximum=100_000, allow_minimum=True),
        metavar="CPUS",
        help="workshop start: the most CPUs one student's workers may hold in all (default: no limit)",
    ),
    option(
        "--quota-gpus",
        type=number("GPUs", maximum=10_000, allow_minimum=True),
        metavar="GPUS",
        help="workshop start: the most GPUs one student's workers may hold in all (default: no limit)",
    ),
    option(
        "--price-cpu-hour",
        type=hourly_usd(),
        metavar="USD",
        help="workshop start: what a student pays per CPU-hour held (default: the catalog's price on a cloud "
        "cluster, else 0)",
    ),
    option(
        "--price-gpu-hour",
        type=hourly_usd(),
        metavar="USD",
        help="workshop start: what a student pays per GPU-hour held (default: as --price-cpu-hour)",
    ),
)
#: ``students``: the teacher view
STUDENTS_ARGS = (option("--text", action="store_true", help="students: a text table, not the live view"),)

#: the teacher views this kernel shows: a new one replaces the last (one refresh thread at a time)
_VIEWS: list[Any] = []


def start_student(args: argparse.Namespace, cluster_kwargs: Callable[[], dict[str, Any]]) -> None:
    """``%gpu_cluster start --workshop NAME --student ID``: a quota refusal is a usage error.

    ``cluster_kwargs()`` makes the cluster's keywords (their dataclasses check the values: a usage error)."""
    if args.student is None:
        raise UsageError("--workshop needs --student ID (your student ID: it finds your workers again)")
    if args.cloud:
        raise UsageError(
            "--workshop joins the teacher's cluster (--address); it does not launch one (--cloud)"
        )
    with usage_errors(ValueError):
        cluster = WorkshopCluster(args.workshop, args.student, **cluster_kwargs())
    try:
        cluster.start(progress=progress_printer())
    except QuotaError as exc:
        raise UsageError(str(exc)) from None


def workshop(args: argparse.Namespace) -> None:
    """``%gpu_cluster workshop start NAME [rules]``, ``workshop stop [NAME]``, ``workshop status [NAME]``."""
    verb, rest = (args.args[0], args.args[1:]) if args.args else (None, [])
    if verb not in ("start", "stop", "status") or len(rest) > 1 or (verb == "start" and not rest):
        raise UsageError(
            "workshop takes start NAME, stop [NAME] or status [NAME], e.g. "
            "%gpu_cluster workshop start ml101 --quota-cpus 2 --budget 5"
        )
    ws_name = convert_name(rest[0]) if rest else None
    rules = {o.dest for o in WORKSHOP_ARGS} | {"budget", "idle_stop", "address"}
    if verb != "start":
        given = [d for d in sorted(rules) if getattr(args, d, None) is not None]
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} applies to workshop start only")
    if verb == "start":
        assert ws_name is not None
        with usage_errors(ValueError):
            ws = Workshop.start(
                ws_name,
                quota_cpus=args.quota_cpus,
                quota_gpus=args.quota_gpus,
                budget_usd=args.budget,
                price_cpu_hour=args.price_cpu_hour,
                price_gpu_hour=args.price_gpu_hour,
                idle_stop_minutes=args.idle_stop if args.idle_stop is not None else 15.0,
                address=args.address,
                progress=progress_printer(),
            )
        return
    ws = Workshop.connect(ws_name) if ws_name else current_workshop()
    if verb == "stop":
        _stop_views()
        print(ws.stop())
    else:
        show(ws.students())


def students(args: argparse.Namespace) -> None:
    """``%gpu_cluster students [--text]``, ``students stop ID``, ``students stop --all``."""
    verb = args.args[0] if args.args else None
    if verb not in (None, "stop") or (verb == "stop" and len(args.args) != 2 and not args.all):
        raise UsageError(
            "students takes nothing (the teacher view), stop ID or stop --all, e.g. %gpu_cluster students stop bob"
        )
    if args.all and (verb != "stop" or len(args.args) > 1):
        raise UsageError("--all goes with stop and no ID: %gpu_cluster students stop --all")
    if verb == "stop" and args.text:
        raise UsageError("--text applies to the students view, not to stop")
    ws = Workshop.connect(args.workshop) if args.workshop else current_workshop()
    if verb == "stop":
        msgs = ws.stop_all() if args.all else [ws.stop_student(convert_name(args.args[1]))]
        for msg in msgs or ["no student has workers running"]:
            print(msg)
        return
    if args.text:
        print(ws.students().text())
        return
    _stop_views()
    view = students_view(ws)
    if hasattr(view, "show"):
        _VIEWS.append(view)
        view.show()
    else:
        show(view)


def convert_name(text: str) -> str:
    """A workshop or student name typed as a positional, checked as ``--workshop`` checks one."""
    return str(convert(name("name"), text, "a workshop or student name"))


def _stop_views() -> None:
    while _VIEWS:
        _VIEWS.pop().stop()
