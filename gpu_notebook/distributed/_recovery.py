"""Failed ranks: what each failure is, and what it means for the group after a cell.

Each rank's failure becomes a :class:`RankFailure` here: its code raised, its value cannot be rebuilt in the
notebook, it was interrupted or stuck, or its worker process died (:func:`died_failure` names its rank, pid
and node). Some failures leave the workers unusable: a worker died, a rank did not stop when interrupted (a
thread blocked inside a collective), or the ranks' collectives are out of step (:func:`out_of_step`). Then the
group is rebuilt with fresh workers (:func:`rebuild`) and the user is told that worker state was reset. Any
other failure keeps the workers and their state. When the group was stopped under the cell, nothing is
rebuilt: the cell ends as "cluster stopped".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gpu_notebook._display import Progress, first_line, format_ranks
from gpu_notebook.distributed import _batch
from gpu_notebook.distributed._output import Streamer
from gpu_notebook.distributed._remains import fault_summary
from gpu_notebook.distributed._results import CellResult, FailureKind, RankFailure, RankResults
from gpu_notebook.distributed._worker import CellReply, Worker
from gpu_notebook.errors import GpuNotebookError

__all__ = [
    "CellRun",
    "died_failure",
    "lost_ranks",
    "mark_stopped",
    "mark_stuck",
    "out_of_step",
    "ray_cause",
    "rebuild",
    "reply_failure",
    "unreturned_failure",
]

#: Why the running ranks of a cell were interrupted, the state :meth:`WorkerGroup._poll` moves through: "" (not
#: interrupted), "hung" (still running after another rank failed), "timeout" (the cell's timeout expired) or
#: "interrupted" (the user's stop button); the failure kind of the ranks it ends.
InterruptReason = Literal["", "hung", "timeout", "interrupted"]

#: Kinds of failure after which a rank's last output is shown (its own traceback says nothing).
_SHOW_LAST_OUTPUT = ("died", "hung", "timeout", "interrupted")
#: How many of its last lines a report shows (of the failing cell's output only: earlier cells' are in the logs).
LAST_LINES = 10


@dataclass
class CellRun:
    """One cell (or call) while it runs and just after: what the wait saw, and what recovery decides from."""

    workers: list[Worker]  # the ranks when the cell started (stop() from another thread empties the group's)
    selected: list[int]  # the ranks it runs on
    streamer: Streamer  # their output, prefixed, to the cell and the group's log
    start: float  # time.monotonic() when it was submitted
    log_mark: dict[int, int] = field(default_factory=dict)  # where the group's log was when the cell started
    pending: dict[Any, int] = field(default_factory=dict)  # Ray object ref -> rank, for ranks not yet replied
    values: dict[int, Any] = field(default_factory=dict)
    failures: dict[int, RankFailure] = field(default_factory=dict)
    first_failure_at: float | None = None  # when a rank first failed in a way that can leave others hanging
    interrupted_at: float | None = None  # when the running ranks were interrupted
    interrupt_reason: InterruptReason = ""  # why: "hung", "timeout" or "interrupted" (the user)
    rebuild_reason: InterruptReason = ""  # set when interrupted ranks did not stop and were given up on
    stopped: str | None = None  # why the group was stopped under the cell
    poll: float = 0.002  # the next wait for replies, in seconds (grows to 0.1 s)
    last_drain: float = 0.0  # time.monotonic() of the last output drain
    last_pid_check: float = 0.0  # time.monotonic() of the last look for ranks whose process is gone
    drain_every: float = 0.1  # seconds between output drains (backs off while the ranks print nothing)
    stall: Any = None  # the cell's _stall.StallWatch (None: no hang report for this cell)

    def died(self) -> list[int]:
        """The ranks whose worker process died, in order."""
        return sorted(r for r, f in self.failures.items() if f.kind == "died")

    def last_output(self, rank: int) -> list[str]:
        """The last lines ``rank`` printed in this cell (not in earlier ones)."""
        return self.streamer.log.since(rank, self.log_mark, LAST_LINES)

    def result(self, notes: Sequence[str]) -> CellResult:
        return CellResult(
            ranks=self.selected,
            values=RankResults(self.values),
            outputs=dict(self.streamer.captured),
            duration_s=time.monotonic() - self.start,
            failures=sorted(self.failures.values(), key=lambda f: f.rank),
            note="\n".join(notes),
        )


# ---- what each failure is --------------------------------------------------------------------------------------
_INTERRUPTED_DETAIL = {
    "hung": "interrupted: it was still running after another rank failed",
    "timeout": "interrupted: the timeout expired",
    "interrupted": "interrupted by the user",
}


def reply_failure(rank: int, reply: CellReply, interrupt_reason: InterruptReason) -> RankFailure:
    """The failure a rank reported itself (its code raised): ``"error"``, or the interrupt's reason.

    A KeyboardInterrupt is the group's own interrupt when it sent one (``interrupt_reason``); otherwise the
    user's code raised it, and it is an error like any other.
    """
    kind: FailureKind = "error"
    if reply.get("etype") == "KeyboardInterrupt" and interrupt_reason:
        kind = interrupt_reason
    return RankFailure(
        rank=rank,
        kind=kind,
        etype=reply.get("etype", ""),
        evalue=reply.get("evalue", ""),
        traceback=reply.get("traceback", ""),
        cell_lines=reply.get("cell_lines", []),
        detail=_INTERRUPTED_DETAIL.get(kind, ""),
    )


class ProcessGone(GpuNotebookError):
    """A rank's process exited while Ray still counted it alive (see :func:`._batch.gone`)."""

    def __init__(self) -> None:
        super().__init__(
            "its process is gone, though Ray had not noticed (a process it started, such as a DataLoader "
            "worker, still holds its connection)"
        )


def gone_pending(run: CellRun, now: float, every: float) -> list[tuple[Any, int]]:
    """The pending (reply, rank) pairs whose process is gone from this node, looked for every ``every`` s."""
    if not run.pending or now - run.last_pid_check < every:
        return []
    run.last_pid_check = now
    gone = _batch.gone(run.workers, run.pending.values())
    return [(ref, rank) for ref, rank in run.pending.items() if rank in gone]


def died_failure(
    rank: int, worker: Worker | None, exc: BaseException, last_output: list[str], fault: str = ""
) -> RankFailure:
    """The failure of a rank whose worker process died: its pid and node, Ray's word, its last output.

    Args:
        rank: the rank.
        worker: its record (None if the group no longer knows it: then the pid is shown as ``?``).
        exc: the Ray actor error its reply raised.
        last_output: its last lines in this cell.
        fault: what faulthandler wrote when a fatal signal (a segfault) killed it ("" for none).
    """
    where = worker.where() if worker is not None else "pid ? on ?"
    summary = fault_summary(fault)
    etype, _, evalue = summary.partition(": ")
    return RankFailure(
        rank=rank,
        kind="died",
        detail=f"the worker process ({where}) died: {first_line(str(exc))[:300]}",
        etype=etype,
        evalue=evalue,
        last_output=list(last_output),
    )


def unreturned_failure(rank: int, exc: BaseException) -> RankFailure:
    """The failure of a rank whose reply Ray could not hand over (any Ray error but a dead actor's).

    A value that came back but cannot be unpickled in the notebook fails as ``"value"``: the cell ran, and
    the rank's state is intact.
    """
    import ray

    if isinstance(exc, ray.exceptions.RaySystemError) and isinstance(exc.client_exc, BaseException):
        # a CUDA tensor on a notebook without a GPU, a class the notebook cannot import, ...
        return RankFailure(
            rank=rank,
            kind="value",
            detail=(
                f"the cell ran, but its value cannot be rebuilt in the notebook: {ray_cause(exc)}. "
                f"Keep such values on the workers (end the cell with `;` or an assignment), or "
                f"convert them first (`.cpu()`, `.tolist()`, `str(...)`)"
            ),
        )
    cause = getattr(exc, "cause", None)
    cause = cause if isinstance(cause, BaseException) else exc
    return RankFailure(
        rank=rank,
        kind="error",
        etype=type(cause).__name__,
        evalue=first_line(str(cause))[:300],
        detail=f"Ray could not return this rank's result ({type(exc).__name__})",
        traceback=f"Ray could not return this rank's result: {type(exc).__name__}\n",
    )


def ray_cause(exc: BaseException) -> str:
    """``Type: message`` of what a RaySystemError wraps (a deserialization error, say)."""
    cause = getattr(exc, "client_exc", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {first_line(str(cause))[:300]}"
    text = first_line(str(cause if cause is not None else exc))[:300]
    return text.removeprefix("System error: ")


# ---- after the wait --------------------------------------------------------------------------------------------
def mark_stopped(run: CellRun, stuck: Sequence[int]) -> str:
    """Fail the ranks the stop ended as ``"stopped"``; the cell's note.

    Those are the ranks still running, those that died with it, and those whose code the stop's own interrupt
    ended (a ``KeyboardInterrupt`` reply): that one is not the stop button, and must not read like it.
    """
    interrupted = [r for r, f in run.failures.items() if f.kind == "error" and f.etype == "KeyboardInterrupt"]
    for rank in [*stuck, *run.died(), *interrupted]:
        run.failures[rank] = RankFailure(
            rank=rank,
            kind="stopped",
            detail="cluster stopped while the cell ran",
            last_output=run.last_output(rank),
            reason=run.stopped or "",
        )
    return (
        f"Cluster stopped: {run.stopped}. Its workers were ended while the cell ran; nothing was "
        f"restarted. Start a cluster again (%gpu_cluster start) to go on."
    )


def mark_stuck(run: CellRun, stuck: Sequence[int]) -> None:
    """Fail the ranks that never came back, and give every rank left without a traceback its last output
    (of this cell: what earlier cells printed would read as if this one had)."""
    for rank in stuck:
        run.failures[rank] = RankFailure(
            rank=rank,
            kind=run.rebuild_reason or "hung",
            detail=_stuck_detail(run.rebuild_reason),
            last_output=run.last_output(rank),
        )
    for f in run.failures.values():
        if f.kind in _SHOW_LAST_OUTPUT and not f.last_output:
            f.last_output = run.last_output(f.rank)


def _stuck_detail(reason: InterruptReason) -> str:
    if reason == "timeout":
        return "still running when the timeout expired and did not stop when interrupted"
    if reason == "interrupted":
        return "did not stop when interrupted"
    return (
        "left waiting (probably inside a collective) after another rank failed; did not stop when interrupted"
    )


def lost_ranks(died: Sequence[int], stuck: Sequence[int]) -> str:
    """Why the workers must be replaced ("" when no rank died or stuck).

    >>> lost_ranks([1], [0, 2])
    'rank(s) 1 died; rank(s) 0,2 could not be interrupted'
    """
    why = []
    if died:
        why.append(f"rank(s) {format_ranks(died)} died")
    if stuck:
        why.append(f"rank(s) {format_ranks(stuck)} could not be interrupted")
    return "; ".join(why)


def out_of_step(
    seqs: dict[int, int], size: int, backend: str | None, failures: dict[int, RankFailure]
) -> str:
    """Why the ranks' collectives are out of step after a cell, or "" when they are not (or cannot be told).

    A collective that some ranks started and the others never joined (one rank raised before it, say) stays
    queued: the next collective would be paired with it, and compute wrong results or hang. Every rank
    reports how many collectives it has issued on the default process group at the end of each cell
    (``seqs``: rank -> count); they must be equal. With NCCL (collectives run asynchronously, so the ranks
    that issued one finish their cell as if all went well) this is checked after every cell. With gloo a
    collective blocks until every rank joins, and ``send``/``recv`` count too (a pipeline's ranks
    legitimately differ), so it is checked only after a cell in which a rank failed or was interrupted (an
    ``async_op`` collective left behind). A value the notebook could not rebuild is no such failure.

    >>> out_of_step({0: 4, 1: 5}, 2, "nccl", {})[:60]
    "the ranks' collectives are out of step (collectives issued, "
    """
    if len(seqs) < size or len(set(seqs.values())) < 2:
        return ""
    if backend != "nccl" and not any(f.kind != "value" for f in failures.values()):
        return ""
    by_count: dict[int, list[int]] = {}
    for rank, seq in sorted(seqs.items()):
        by_count.setdefault(seq, []).append(rank)
    counts = ", ".join(
        f"rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)}: {seq}"
        for seq, ranks in sorted(by_count.items(), reverse=True)
    )
    return (
        f"the ranks' collectives are out of step (collectives issued, {counts}): a collective some ranks "
        f"started was never joined by the others, and the next one would be paired with it"
    )


# ---- rebuilding ------------------------------------------------------------------------------------------------
def rebuild(
    why: str,
    size: int,
    stopping: Callable[[], str | None],
    restart: Callable[[], object],
    say: Progress,
) -> str:
    """Replace every worker after ``why``; returns the note that tells the user what became of their state.

    Args:
        why: what made the workers unusable (one line).
        size: how many workers the group has.
        stopping: why the group is being stopped, or None; asked before and after the rebuild, since
            ``stop()`` may come from another thread meanwhile. A group being stopped is not rebuilt.
        restart: ends the old workers and starts fresh ones (raises when that fails).
        say: progress lines for the user.
    """
    if (stopped := stopping()) is not None:  # the group is going away: do not start workers on it again
        return f"Cluster stopped: {stopped} ({why}); nothing was restarted."
    say(f"rebuilding the worker group: {why}")
    try:
        restart()
    except Exception as exc:  # noqa: BLE001 - a failed rebuild is reported in the cell's note, not raised
        if (stopped := stopping()) is not None:
            return f"Cluster stopped: {stopped} ({why}); nothing was restarted."
        return (
            f"Worker state was lost: {why}. Rebuilding the group failed ({exc}); run "
            f"`%gpu_cluster scale {size}` once resources are back."
        )
    return (
        f"Worker state was reset: {why}, so the group was rebuilt with {size} fresh worker(s) "
        f"(new process group). Variables, models and optimizers defined on the workers are gone: re-run "
        f"your setup cells."
    )
