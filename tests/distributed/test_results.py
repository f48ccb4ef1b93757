"""Per-rank results and the grouped error report."""

import pytest

from gpu_notebook.distributed import DistributedError, RankFailure, RankLog, RankResults


def test_rank_results_index_by_rank_and_iterate_in_rank_order():
    r = RankResults({2: "c", 0: "a"})
    assert r[0] == "a" and r[2] == "c"
    assert list(r) == ["a", "c"] and len(r) == 2 and r.ranks == [0, 2]
    with pytest.raises(IndexError, match="ranks that ran: 0,2"):
        r[1]
    full = RankResults({0: 1, 1: 2})
    assert full == [1, 2] and repr(full) == "[1, 2]" and full[-1] == 2


def _err(rank, msg="boom", tb='Traceback...\n  File "<cell>", line 2\nValueError: boom\n'):
    return RankFailure(rank=rank, kind="error", etype="ValueError", evalue=msg, traceback=tb, cell_lines=[2])


def test_identical_tracebacks_are_shown_once_with_their_ranks():
    err = DistributedError([_err(0), _err(1), _err(3), _err(2, "other", tb="T2\n")], world_size=4)
    text = err.render()
    assert text.count("ValueError: boom at cell line 2") == 1
    assert "--- ranks 0-1,3: ValueError: boom" in text
    assert "--- rank 2: ValueError: other" in text
    assert "4 of 4 rank(s) failed" in text
    assert err._render_traceback_() == text.splitlines()


def test_a_dead_rank_is_reported_with_its_last_output():
    f = RankFailure(
        rank=1,
        kind="died",
        detail="the worker process (pid 42 on 10.0.0.1) died",
        last_output=["step 9", "step 10"],
    )
    text = DistributedError([f], note="Worker state was reset.").render()
    assert "rank 1: died: the worker process (pid 42" in text
    assert "| step 10" in text and text.rstrip().endswith("Worker state was reset.")


def test_rank_log_keeps_lines_partial_lines_and_drops_ray_markers():
    log = RankLog(max_lines=3)
    assert log.feed(0, ":actor_name:RankWorker\nhel") == []
    assert log.feed(0, "lo\nwor") == ["hello"]
    assert log.tail(0) == ["hello", "wor"]
    assert log.flush(0) == ["wor"]
    for i in range(5):
        log.feed(0, f"{i}\n")
    dropped, *kept = log.tail(0)  # the ring says what it dropped
    assert kept == ["2", "3", "4"] and dropped.startswith("... 4 earlier lines dropped")
    assert log.tail(0, 1)[1:] == ["4"] and log.tail(0, 0) == []


def test_progress_bar_redraws_keep_the_final_state_of_the_line():
    log = RankLog()
    assert log.feed(0, "  0%|   |\r 50%|#  |\r100%|###|\nnext\n") == ["100%|###|", "next"]
