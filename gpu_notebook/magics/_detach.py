"""``%gpu_cluster`` for long runs: ``start --detach`` and ``attach`` (thin over :mod:`gpu_notebook.cluster._detached`).

::

    %gpu_cluster start --detach --name run1 --workers 2 --idle-stop 30
    %%distributed --noblock -o losses      # the long cell; close the laptop
    ...
    %gpu_cluster attach                    # in any kernel later: what can be attached
    %gpu_cluster attach run1               # the workers back, variables and all
    %gpu_result                            # the cell's output since, then its values (into losses)

:mod:`gpu_notebook.magics._cluster` declares these options with its own and dispatches here.
"""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError

from gpu_notebook.cluster import DetachedCluster, attachable
from gpu_notebook.distributed import BackgroundCell
from gpu_notebook.magics._args import text
from gpu_notebook.magics._common import option, progress_printer

__all__ = ["ATTACH_ARGS", "DETACH_ARGS", "attach", "note_cell"]

#: ``start --detach``
DETACH_ARGS = (
    option(
        "--detach",
        action="store_true",
        help="start: the workers (and a local cluster's Ray) outlive this kernel: %%gpu_cluster attach NAME from "
        "any kernel brings them back with their state (a --cloud cluster needs --budget or --idle-stop)",
    ),
    option(
        "--log-to",
        type=text("a folder or s3://bucket/prefix"),
        metavar="DEST",
        help="start --detach: also upload the ranks' log files there in batches (a folder or s3://bucket/prefix)",
    ),
)
#: ``attach``: besides NAME and --address
ATTACH_ARGS = (
    option(
        "--take",
        action="store_true",
        help="attach: take the workers over even while another live kernel holds them (it then lets go)",
    ),
)


def note_cell(cluster: Any, name: str, out: str | None) -> None:
    """A background cell started on a detached cluster: the keeper keeps its ``-o`` name, so a kernel that
    attaches later fills that variable as this one would have."""
    if isinstance(cluster, DetachedCluster) and out:
        cluster.note_cell(name, out=out)


def attach(args: argparse.Namespace, ns: dict[str, Any], live: bool) -> None:
    """``%gpu_cluster attach [NAME] [--address A] [--take]``."""
    if len(args.args) > 1:
        raise UsageError("attach takes at most one cluster name (see %gpu_cluster attach)")
    if not args.args:
        if args.take:
            raise UsageError("--take goes with the cluster's name: %gpu_cluster attach NAME --take")
        print(repr(attachable(args.address, progress=progress_printer())))
        return

    def bind(bg: BackgroundCell, out: str | None) -> None:  # -o NAME of the cell, as if started here
        if out and bg.result is not None and (len(bg.result.values) or not bg.result.failures):
            ns[out] = bg.result.values

    cluster = DetachedCluster.attach(
        args.args[0], address=args.address, take=args.take, progress=progress_printer(), live=live, bind=bind
    )
    print(f"current cluster: {cluster.name!r} ({cluster.world_size} workers)")
