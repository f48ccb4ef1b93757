"""Persistent distributed workers: rank actors with torch.distributed initialised, cells run on every rank."""

from gpu_notebook.distributed._group import GroupError, GroupTimeouts, WorkerGroup
from gpu_notebook.distributed._output import RankLog
from gpu_notebook.distributed._ranks import RankPlan, choose_backend, format_ranks, parse_ranks, plan_ranks
from gpu_notebook.distributed._results import CellResult, DistributedError, RankFailure, RankResults

__all__ = [
    "CellResult",
    "DistributedError",
    "GroupError",
    "GroupTimeouts",
    "RankFailure",
    "RankLog",
    "RankPlan",
    "RankResults",
    "WorkerGroup",
    "choose_backend",
    "format_ranks",
    "parse_ranks",
    "plan_ranks",
]
