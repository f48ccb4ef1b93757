"""Where is each rank (issue 19, item 4): ``%gpu_cluster stacks`` shows every rank's Python stack while a
background cell runs: rank 1 in the cell's ``wait_here()``, rank 0 waiting in ``dist.barrier()``, and the
collective sequence numbers say rank 1 has not entered the barrier rank 0 is in."""

from __future__ import annotations

import doctest
import time

import pytest
from IPython.utils.capture import capture_output

from gpu_notebook import _settings
from gpu_notebook.distributed import _stall
from gpu_notebook.distributed._background import BackgroundCell

CELL = """%%distributed --noblock
import time
import torch.distributed as dist

def wait_here():
    while not globals().get("go"):
        time.sleep(0.02)

if rank == 1:
    wait_here()
dist.barrier()
rank
"""


def test_stacks_show_where_each_rank_waits(ip, shared) -> None:
    ip.run_cell("%%distributed\ngo = False\n")
    with capture_output() as cap:
        res = ip.run_cell(CELL)
    h = res.result
    assert isinstance(h, BackgroundCell), (cap.stdout, cap.stderr, res.error_in_exec)
    try:
        deadline = time.monotonic() + 30
        while True:  # until rank 0 is in the barrier and rank 1 in wait_here
            report = shared.stacks()
            cells = {r.rank: next((t for t in r.threads if t.cell), None) for r in report.ranks}
            text = {rank: "".join(t.frames) if t else "" for rank, t in cells.items()}
            if "wait_here" in text[1] and "barrier" in text[0]:
                break
            assert time.monotonic() < deadline, str(report)
            time.sleep(0.1)
        assert "wait_here" not in text[0]
        assert report.not_answering == []
        assert all(r.busy for r in report.ranks)
        seq0, seq1 = report.ranks[0].seq, report.ranks[1].seq
        assert seq0 is not None and seq1 is not None and seq0 == seq1 + 1, str(report)
        assert report.behind() == ([1], [0])

        with capture_output() as cap:
            ip.run_line_magic("gpu_cluster", "stacks")
        out = cap.stdout
        assert "== rank 0" in out and "== rank 1" in out, out
        assert "the cell's thread" in out and "frames of Ray and gpu_notebook hidden" in out
        rank1 = out.split("== rank 1")[1]
        assert "in wait_here" in rank1 and "<cell In[" in rank1
        assert "_worker.py" not in out  # our own frames are hidden
        assert "rank 1 has not entered the collective that rank 0 may be waiting in" in out

        # the native frames of each cell's thread, by py-spy on the ranks (ptrace works here, as in CI)
        with capture_output() as cap:
            ip.run_line_magic("gpu_cluster", "stacks --native")
        out = cap.stdout
        assert out.count("-- the cell's thread, native frames (py-spy):") == 2, out
        native1 = out.split("== rank 1")[1].split("native frames (py-spy):")[1]
        assert "wait_here" in native1 and ("sleep" in native1 or "nanosleep" in native1), out
        native0 = out.split("== rank 1")[0].split("native frames (py-spy):")[1]
        assert "barrier" in native0 or "gloo" in native0 or "wait" in native0, out

        ip.user_ns["go"] = True
        with capture_output():
            ip.run_line_magic("gpu_push", "go")
        assert list(h.get(timeout=30)) == [0, 1]
    finally:
        if (
            not h.ready()
        ):  # let it end (a cancel would rebuild the group: rank 0's barrier cannot be interrupted)
            ip.user_ns["go"] = True
            with capture_output():
                ip.run_line_magic("gpu_push", "go")
            h.wait(30)
    # the shared cluster is left with 2 working workers, and idle ranks answer too
    assert list(shared.run("rank").values) == [0, 1]
    idle = shared.stacks()
    assert [r.busy for r in idle.ranks] == [False, False] and idle.not_answering == []


def test_a_rank_that_does_not_answer_is_named_and_threads_are_captured_in_process() -> None:
    import threading

    from gpu_notebook.distributed._stacks import RankStacks, StacksReport, capture

    stop = threading.Event()

    def parked_here() -> None:
        stop.wait(30)

    t = threading.Thread(target=parked_here, name="parker")
    t.start()
    try:
        got = capture(t.ident, rank=0)
    finally:
        stop.set()
        t.join()
    cell = got["threads"][0]
    assert cell["cell"] and cell["name"] == "parker"
    assert any("in parked_here" in f for f in cell["frames"]) and cell["hidden"] >= 1  # threading's bootstrap
    assert got["busy"] and got["seq"] is None  # no process group in this process

    report = StacksReport([RankStacks(0, True, 1, False, 3), RankStacks(1, False)], timeout_s=5)
    assert report.not_answering == [1]
    text = str(report)
    assert "== rank 1: not answering (no reply within 5 s" in text and text.endswith("not answering: rank 1")


STALLED = """%%distributed -o stalled
import time
import torch.distributed as dist

def late():
    time.sleep(10)

if rank == 1:
    late()
dist.barrier()
rank
"""


def test_a_cell_stalled_in_a_collective_shows_the_stacks_once_naming_the_late_rank(
    ip, shared, monkeypatch
) -> None:
    """The automatic report: rank 0 waits in a barrier that rank 1 has not entered; after the threshold
    ($GPU_NOTEBOOK_STALL_REPORT, 2 s here) the cell shows every rank's stack once, and then ends normally."""
    monkeypatch.setenv(_settings.STALL_REPORT_VAR, "2")
    with capture_output() as cap:
        res = ip.run_cell(STALLED)
    out = cap.stdout + cap.stderr
    assert res.error_in_exec is None, out
    assert list(ip.user_ns["stalled"]) == [0, 1], out
    assert out.count("no collective has completed for") == 1, out
    assert "rank 1 issued" in out and "rank 1 has not entered the collective the others wait in" in out, out
    rank1 = out.split("== rank 1")[1]
    assert "in late" in rank1, out  # where rank 1 is instead
    assert "GPU_NOTEBOOK_STALL_REPORT=0 turns it off" in out


def test_no_stall_report_when_it_is_off_or_the_ranks_agree(ip, shared, monkeypatch) -> None:
    monkeypatch.setenv(_settings.STALL_REPORT_VAR, "0")
    with capture_output() as cap:
        ip.run_cell(STALLED.replace("time.sleep(10)", "time.sleep(3)"))
    assert "no collective has completed" not in cap.stdout, cap.stdout
    monkeypatch.setenv(_settings.STALL_REPORT_VAR, "1")
    with capture_output() as cap:  # both ranks sleep: equal numbers, nothing waits in a collective
        ip.run_cell("%%distributed\nimport time\ntime.sleep(4)\n")
    assert "no collective has completed" not in cap.stdout, cap.stdout


def test_stall_clock_and_setting() -> None:
    assert doctest.testmod(_stall).failed == 0
    for bad in ("nan", "-1", "soon", "inf"):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(_settings.STALL_REPORT_VAR, bad)
            with pytest.raises(ValueError, match="GPU_NOTEBOOK_STALL_REPORT must be a number of seconds"):
                _settings.stall_report_s()
    said: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(_settings.STALL_REPORT_VAR, "nan")
        assert _stall.watch_for([object(), object()], [0, 1], "gloo", said.append) is None
    assert "this cell has no hang report" in said[0]
    assert (
        _stall.watch_for([object(), object()], [0], "gloo", said.append) is None
    )  # some ranks: not this check
    assert _stall.watch_for([object(), object()], [0, 1], None, said.append) is None  # no process group
