"""Persistent distributed workers: rank actors with torch.distributed initialised, cells run on every rank.

The modules, one concern each: ``_group`` (the :class:`WorkerGroup`: placement, running cells, stop),
``_worker`` (the rank actor, and the driver's :class:`Worker` record of one), ``_process_group`` (backend
choice, the torchrun environment, joining the group), ``_recovery`` (dead workers, stuck ranks, collectives out
of step, rebuilds), ``_capture`` (a rank's output), ``_remains`` (what a dead rank left: its undrained output
and faulthandler's report), ``_quiet`` (Ray's own notice of a death the cell reports, kept out), ``_ranks``
(rank layout and selections), ``_output`` (prefixed streaming and the per-rank log) and ``_results`` (what a
cell gives back). Importing this package imports no ray or torch.
"""

from gpu_notebook.distributed._background import BackgroundCell, BusyError
from gpu_notebook.distributed._background import find as find_background
from gpu_notebook.distributed._group import GroupError, GroupTimeouts, WorkerGroup
from gpu_notebook.distributed._output import RankLog
from gpu_notebook.distributed._process_group import choose_backend, torchrun_env
from gpu_notebook.distributed._ranks import RankPlan, format_ranks, parse_ranks, plan_ranks
from gpu_notebook.distributed._results import (
    CellResult,
    DistributedError,
    RankFailure,
    RankResults,
    push_hint,
    value_groups,
    value_lines,
)
from gpu_notebook.distributed._worker import Worker

__all__ = [
    "BackgroundCell",
    "BusyError",
    "CellResult",
    "DistributedError",
    "GroupError",
    "GroupTimeouts",
    "RankFailure",
    "RankLog",
    "RankPlan",
    "RankResults",
    "Worker",
    "WorkerGroup",
    "choose_backend",
    "find_background",
    "format_ranks",
    "parse_ranks",
    "plan_ranks",
    "push_hint",
    "torchrun_env",
    "value_groups",
    "value_lines",
]
