"""The report of a cell ended by a death or a stop says what happened once, without the noise that follows it.

Pure tests of the report (DistributedError) and of the filter of Ray's own death notices (``_quiet``).
"""

from __future__ import annotations

from gpu_notebook.distributed import DistributedError, RankFailure
from gpu_notebook.distributed._quiet import deaths_reported_by_the_cell, is_reported_death

GLOO = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [127.0.0.1]:41234: "
    "Connection reset by peer"
)
RAYLET = (
    "A worker died or was killed while executing a task by an unexpected system error. To troubleshoot the "
    "problem, check the logs for the dead worker. Lease ID: 01 Worker ID: ab Node ID: cd Worker IP address: "
    "127.0.0.1 Worker port: 4 Worker PID: {pid} Worker exit type: SYSTEM_ERROR Worker exit detail: Worker "
    "unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the "
    "process was killed by the OOM killer due to high memory usage, (2) ray stop --force was called"
)


def test_a_stop_reads_as_its_reason_said_once() -> None:
    reason = "budget of $5.00 reached: $5.12 spent (estimate)"
    failures = [
        RankFailure(rank=r, kind="stopped", detail="cluster stopped while the cell ran", reason=reason)
        for r in (0, 1)
    ]
    note = (
        f"Cluster stopped: {reason}. Its workers were ended while the cell ran; nothing was restarted.\nhint"
    )
    text = str(DistributedError(failures, note, world_size=2))
    assert text.splitlines()[0] == f"Cluster stopped: {reason}"
    assert "The cell was running on 2 of 2 rank(s) (0-1)" in text
    assert text.count(reason) == 1 and text.endswith("\nhint")


def test_a_collective_losing_the_rank_that_died_is_one_line_and_a_real_error_keeps_its_traceback() -> None:
    died = RankFailure(rank=1, kind="died", detail="the worker process (pid 7 on 10.0.0.2) died: gone")
    lost = RankFailure(
        rank=0,
        kind="error",
        etype="DistBackendError",
        evalue=GLOO,
        traceback=f"Traceback (most recent call last):\n  ...\nDistBackendError: {GLOO}\n",
        cell_lines=[4],
    )
    real = RankFailure(
        rank=2, kind="error", etype="ValueError", evalue="bad shape", traceback="ValueError: bad shape\n"
    )
    text = str(DistributedError([died, lost, real], world_size=3))
    assert "Connection reset by peer" not in text and "pair.cc" not in text
    assert (
        "--- rank 0: DistBackendError at cell line 4: its collective lost the connection to rank 1, whose "
        "worker died" in text
    )
    assert "--- rank 2: ValueError: bad shape" in text and "--- rank 1: died" in text
    # without a death, the same error is shown whole: it is then the problem itself
    assert GLOO in str(DistributedError([lost], world_size=2))


def test_rays_death_notice_is_dropped_only_for_ranks_whose_cell_reports_it() -> None:
    notice = {"pid": "raylet", "lines": [RAYLET.format(pid=4242)], "is_err": False}
    assert not is_reported_death(notice)  # no cell ran on pid 4242: Ray's notice is the only one
    with deaths_reported_by_the_cell([4242, None]):
        assert is_reported_death(notice)
        assert not is_reported_death({**notice, "lines": [RAYLET.format(pid=4243)]})  # not a rank of the cell
        other = "Task was killed due to the node running low on memory. Worker PID: 4242"
        assert not is_reported_death({**notice, "lines": [other]})  # Ray's memory monitor: printed
        assert not is_reported_death({**notice, "pid": 4242})  # the worker's own output
    assert is_reported_death(notice)  # a notice that arrives just after the cell is still the cell's
