"""A cluster stopped while a ``%%distributed`` cell runs on it, four ways: ``Cluster.stop()``, ``%gpu_cluster stop``
from another thread, the budget stop and the idle stop. Each time the cell ends at once with a note that starts
"Cluster stopped: <why>", and nothing is rebuilt.

Each test stops a small cluster of its own, started through ``%gpu_cluster start`` on the session's Ray next to the
shared one, which must be left running with its 2 workers (the ``cluster`` fixture's contract).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from gpu_notebook import Cluster, get_manager
from gpu_notebook.cost import attach_policies
from gpu_notebook.distributed import DistributedError

pytestmark = pytest.mark.timeout(180)

G5 = ("aws", "g5.xlarge", "us-east-1", "on_demand")  # 1.006 USD/h in the shipped catalog
CELL = "import time\nprint('training', flush=True)\ntime.sleep(120)\n"
# a training loop: the stop's interrupt ends it at once, so the rank replies before its worker is ended
LOOP_CELL = "import time\nprint('training', flush=True)\nfor _ in range(6000):\n    time.sleep(0.02)\n"


@pytest.fixture
def small(ip: Any, shared: Cluster) -> Iterator[Callable[..., Cluster]]:
    """``small(name, options)`` starts a 1-worker cluster with ``%gpu_cluster start``; it is stopped at the end."""
    started: list[Cluster] = []

    def start(name: str, options: str = "") -> Cluster:
        res = ip.run_cell(f"%gpu_cluster start --name {name} --workers 1 --cpus-per-worker 0.25 {options}")
        assert res.error_in_exec is None
        c = get_manager().get(name)
        assert c.running and c.world_size == 1
        started.append(c)
        return c

    yield start
    for c in started:
        if c.state == "running":
            c.stop()
    # the shared cluster is untouched: still running, both workers alive, current again
    assert shared.running and shared.world_size == 2
    assert all(w.alive for w in shared.status().workers)
    assert get_manager().current is shared


def _training(c: Cluster) -> bool:
    """The cell is running on the rank: the cluster is busy and the rank's first line has arrived."""
    return c.busy and "training" in c.logs(rank=0, tail=5)[0]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _wait(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def _run_and_stop(
    ip: Any,
    c: Cluster,
    stop: Callable[[], Any],
    *,
    ready: threading.Event | None = None,
    cell: str = CELL,
) -> tuple[str, float]:
    """Run :data:`CELL` on ``c`` through the magic while another thread calls ``stop()``.

    The worker process is gone afterwards. The stopping thread waits until the cell prints, unless ``ready`` is given: then the cell starts only once the
    thread sets it (a stop decided just before the cell started). Returns the cell's error text and its duration.
    """
    errors: list[BaseException] = []

    def stopper() -> None:
        try:
            if ready is None:
                _wait(lambda: _training(c))
            stop()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread below
            errors.append(exc)

    pid = c.status().workers[0].pid
    t = threading.Thread(target=stopper, name="stopper")
    t.start()
    if ready is not None:
        assert ready.wait(30), "the stopping thread never got ready"
    t0 = time.monotonic()
    res = ip.run_cell(f"%%distributed --cluster {c.name}\n{cell}")
    took = time.monotonic() - t0
    t.join(60)
    assert not t.is_alive() and errors == []
    err = res.error_in_exec
    assert isinstance(err, DistributedError), res
    assert [(f.rank, f.kind) for f in err.failures] == [(0, "stopped")]
    _wait(lambda: _gone(pid), 15)
    return "\n".join(err._render_traceback_()), took


def _assert_stopped_cell(text: str, took: float, c: Cluster, why: str) -> None:
    assert took < 60, f"the cell ran on for {took:.0f} s after the stop"
    head = text.splitlines()[0]  # the stop's reason is the error's one line
    assert re.match(f"Cluster stopped: {why}", head), text
    assert "nothing was restarted" in text
    assert "| training" in text  # the rank's last output is shown with the failure
    assert "Worker state was reset" not in text and "rebuilding" not in text
    assert c.state == "stopped" and get_manager().get(c.name, None) is None


def test_cluster_stop_under_a_running_cell(ip, small, capsys) -> None:
    c = small("stop-api")
    text, took = _run_and_stop(ip, c, c.stop)
    _assert_stopped_cell(text, took, c, "stopped by the user")


def test_gpu_cluster_stop_from_another_thread_under_a_running_cell(ip, small, capsys) -> None:
    c = small("stop-magic")
    capsys.readouterr()
    text, took = _run_and_stop(ip, c, lambda: ip.run_line_magic("gpu_cluster", "stop stop-magic"))
    _assert_stopped_cell(text, took, c, "stopped by the user")
    assert "cluster 'stop-magic' stopped: 1 worker(s) ended" in capsys.readouterr().out


def test_the_budget_stop_under_a_running_cell(ip, small, capsys) -> None:
    c = small("stop-budget", "--budget 5")
    assert "budget cap $5" in capsys.readouterr().out
    offset = [0.0]
    msgs: list[str] = []
    # the same budget again, with a priced node and a clock the test moves (the magic's own watcher is replaced)
    w = attach_policies(
        c,
        budget_usd=5.0,
        node_pricing=lambda node_id: G5,
        clock=lambda: time.time() + offset[0],
        start=False,
        notify=msgs.append,
    )
    assert w.tick() == []

    def over_budget() -> None:
        offset[0] = 5.1 * 3600  # 5.1 h x 1.006 USD/h
        assert "workers stopped" in w.tick()[0]

    text, took = _run_and_stop(ip, c, over_budget)
    _assert_stopped_cell(text, took, c, r"budget of \$5\.00 reached: \$5\.1\d spent \(estimate\)")
    assert msgs[-1].startswith("budget of $5.00 reached")


def test_a_budget_stop_ending_a_training_loop_reads_as_the_stop_and_every_view_agrees(
    ip, small, capsys
) -> None:
    """The stop's own interrupt ends the rank's loop: the cell said ``rank 0: KeyboardInterrupt``, as if the
    stop button had been pressed."""
    c = small("stop-budget-loop", "--budget 5")
    offset = [0.0]
    w = attach_policies(
        c,
        budget_usd=5.0,
        node_pricing=lambda node_id: G5,
        clock=lambda: time.time() + offset[0],
        start=False,
        notify=lambda m: None,
    )

    def over_budget() -> None:
        offset[0] = 5.1 * 3600
        assert "workers stopped" in w.tick()[0]

    text, took = _run_and_stop(ip, c, over_budget, cell=LOOP_CELL)
    assert "The cell was running on 1 of 1 rank(s) (0)" in text, text
    assert "KeyboardInterrupt" not in text and "Interrupted" not in text
    _assert_stopped_cell(text, took, c, r"budget of \$5\.00 reached: \$5\.1\d spent \(estimate\)")
    capsys.readouterr()
    ip.run_line_magic("gpu_cluster", "list")
    assert "stop-budget-loop" not in capsys.readouterr().out  # no longer listed as running


def test_the_idle_stop_under_a_running_cell(ip, small, capsys) -> None:
    """A cell started just as the idle window ran out: the policy had already found the cluster not busy."""
    c = small("stop-idle", "--idle-stop 30")
    assert "idle stop after 30 min" in capsys.readouterr().out
    offset = [0.0]
    checking = threading.Event()
    read_busy = threading.Event()

    class Utilisation:
        """Idle hardware; while ``checking``, it holds the check (busy already read) until the cell runs."""

        kind = "gpu"

        def __call__(self, window_s: float) -> float:
            if checking.is_set():
                read_busy.set()
                _wait(lambda: _training(c))
            return 0.0

    w = attach_policies(
        c,
        idle_stop_minutes=30,
        utilisation=Utilisation(),
        clock=lambda: time.time() + offset[0],
        start=False,
        notify=lambda m: None,
    )
    w.tick()

    def idle_window_over() -> None:
        offset[0] = 31 * 60
        checking.set()
        assert "workers stopped" in w.tick()[0]

    text, took = _run_and_stop(ip, c, idle_window_over, ready=read_busy)
    _assert_stopped_cell(text, took, c, r"idle for 31m\d\ds \(no cell running, utilisation under 5%\)")
