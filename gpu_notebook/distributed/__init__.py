"""Persistent distributed workers: rank actors with torch.distributed initialised, cells run on every rank.

The modules, one concern each: ``_group`` (the :class:`WorkerGroup`: placement, running cells, stop),
``_worker`` (the rank actor, and the driver's :class:`Worker` record of one), ``_process_group`` (backend
choice, the torchrun environment, joining the group), ``_recovery`` (dead workers, stuck ranks, collectives out
of step, rebuilds), ``_capture`` (a rank's output), ``_remains`` (what a dead rank left: its undrained output
and faulthandler's report), ``_quiet`` (Ray's own notice of a death the cell reports, kept out), ``_ranks``
(rank layout and selections), ``_debugger`` and ``_debug`` (pdb on a rank, and the notebook's prompt for it), ``_output`` (prefixed streaming and the per-rank log), ``_results`` (what a
cell gives back), ``_placement`` (where the workers' resources come from: the :class:`Placement` seam and its
default, :class:`RayPlacement`) and ``_handover`` (a :class:`GroupRecord`, for another kernel to
:meth:`~WorkerGroup.adopt` the workers). Importing this package imports no ray or torch.
"""

from gpu_notebook.distributed._background import BackgroundCell, BusyError, refuse_second, running_on
from gpu_notebook.distributed._background import find as find_background
from gpu_notebook.distributed._debug import DebugError, paused_ranks
from gpu_notebook.distributed._debug import debug as debug_ranks
from gpu_notebook.distributed._errors import GroupError
from gpu_notebook.distributed._group import GroupTimeouts, WorkerGroup
from gpu_notebook.distributed._handover import GroupRecord
from gpu_notebook.distributed._output import RankLog
from gpu_notebook.distributed._placement import (
    Placement,
    PlacementRequest,
    RayPlacement,
    impossible_request,
    placement_error,
    wait_until_placed,
    worker_bundle,
)
from gpu_notebook.distributed._process_group import (
    RANK_VARIABLES,
    choose_backend,
    nccl_needs_gpus,
    torchrun_env,
)
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
from gpu_notebook.distributed._script import ScriptError, run_script, script_for, too_large
from gpu_notebook.distributed._settings import MASK, rank_settings
from gpu_notebook.distributed._stacks import NATIVE_TIMEOUT_S, StacksReport
from gpu_notebook.distributed._stacks import gather as gather_stacks
from gpu_notebook.distributed._worker import Worker

__all__ = [
    "BackgroundCell",
    "BusyError",
    "CellResult",
    "DebugError",
    "DistributedError",
    "GroupError",
    "GroupRecord",
    "GroupTimeouts",
    "MASK",
    "NATIVE_TIMEOUT_S",
    "Placement",
    "PlacementRequest",
    "RANK_VARIABLES",
    "RankFailure",
    "RankLog",
    "RankPlan",
    "RankResults",
    "RayPlacement",
    "ScriptError",
    "StacksReport",
    "Worker",
    "WorkerGroup",
    "choose_backend",
    "debug_ranks",
    "find_background",
    "format_ranks",
    "gather_stacks",
    "impossible_request",
    "nccl_needs_gpus",
    "parse_ranks",
    "paused_ranks",
    "placement_error",
    "plan_ranks",
    "push_hint",
    "rank_settings",
    "refuse_second",
    "running_on",
    "run_script",
    "script_for",
    "too_large",
    "torchrun_env",
    "value_groups",
    "value_lines",
    "wait_until_placed",
    "worker_bundle",
]
