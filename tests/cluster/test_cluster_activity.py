"""What Cluster does for the magics without Ray: note activity (touch), wait for a stop another thread makes
(await_stop), and refuse work while not running (the one 'is not running' error)."""

from __future__ import annotations

import threading
import time

import pytest

from gpu_notebook import Cluster
from gpu_notebook.cluster import ClusterError
from gpu_notebook.distributed import CellResult, RankFailure, RankResults


def _result(*kinds: str) -> CellResult:
    failures = [RankFailure(rank, kind) for rank, kind in enumerate(kinds)]
    return CellResult(list(range(len(kinds))), RankResults({}), {}, 0.1, failures=failures)


def test_touch_notes_activity_now():
    c = Cluster(name="t")
    c.last_activity = 0.0
    before = time.time()
    c.touch()
    assert before <= c.last_activity <= time.time()


def test_await_stop_waits_until_the_stopping_thread_is_done():
    c = Cluster(name="t")
    c.state = "stopping"

    def finish() -> None:
        time.sleep(0.2)
        c.state = "stopped"

    threading.Thread(target=finish, daemon=True).start()
    t0 = time.monotonic()
    c.await_stop(_result("stopped", "stopped"))
    assert c.state == "stopped" and time.monotonic() - t0 >= 0.15


def test_await_stop_returns_at_once_when_the_cell_did_not_end_by_a_stop():
    c = Cluster(name="t")
    c.state = "stopping"
    t0 = time.monotonic()
    c.await_stop(_result("error"))
    c.await_stop(_result())
    assert time.monotonic() - t0 < 0.1


def test_await_stop_gives_up_after_its_limit():
    c = Cluster(name="t")
    c.state = "stopping"
    t0 = time.monotonic()
    c.await_stop(_result("stopped"), limit_s=0.1)
    assert 0.1 <= time.monotonic() - t0 < 2 and c.state == "stopping"


@pytest.mark.parametrize("block", [True, False])
def test_a_cluster_not_running_refuses_a_cell(block: bool):
    c = Cluster(name="idle")
    with pytest.raises(
        ClusterError, match="^cluster 'idle' is not running: start it with %gpu_cluster start$"
    ):
        c.run("1", block=block)
