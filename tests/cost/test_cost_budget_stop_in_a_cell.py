"""A budget stop made by the policy watcher's own thread, on its real clock, while a ``%%distributed`` cell trains.

The cell's error says "Cluster stopped: budget ..." with the figures (not the stop's own KeyboardInterrupt), and
once the cell has ended every view agrees with it: the cluster is stopped and out of ``%gpu_cluster list``, and
the cost meter (what ``%gpu_cost status`` prints for it), the watcher's message and the cell name one figure.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from gpu_notebook import get_manager
from gpu_notebook.cost import BudgetPolicy, PolicyWatcher, attach_policies, cost_meter_for
from gpu_notebook.distributed import DistributedError

pytestmark = pytest.mark.timeout(120)

#: USD per hour: $1000 a second, so even a millisecond between two readings of the meter shows in the cents
PRICE = 3_600_000.0
LOOP_CELL = "import time\nprint('training', flush=True)\nfor _ in range(6000):\n    time.sleep(0.02)\n"
FIGURE = r"\$([\d,]+\.\d\d)"


def _wait(cond: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


class _Stub:
    """What the cost meter and the budget read and call of a cluster."""

    def __init__(self) -> None:
        self.state, self.options, self.hooks = "running", {}, []
        self.started_at = None

    def ray_nodes(self) -> list[dict]:
        return [{"NodeID": "node-a", "Alive": True}]

    def add_stop_hook(self, fn: Any) -> None:
        self.hooks.append(fn)

    def stop(self, reason: str = "") -> str:
        for hook in self.hooks:
            hook(reason)
        self.state = "stopped"
        return "stopped"


def test_the_figure_a_budget_stop_names_is_the_one_the_meter_keeps() -> None:
    """Every reading of the clock is a millisecond later ($1 at this price): the stop's reason, its message
    and the meter afterwards all say the same figure, and it no longer grows."""
    now = [1_000_000.0]

    def clock() -> float:
        now[0] += 0.001
        return now[0]

    stub = _Stub()
    meter = cost_meter_for(stub, node_pricing={"node-a": PRICE}, clock=clock)
    reasons: list[str] = []
    stub.add_stop_hook(reasons.append)
    pol = BudgetPolicy(50.0, meter, stub, notify=lambda m: None)
    meter.policies, meter.budget_usd = [pol], 50.0  # as attach_policies does: the snapshot shows the policy
    w = PolicyWatcher(meter, [pol], clock=clock)
    now[0] += 60  # $60 000 spent
    (message,) = w.tick()
    assert stub.state == "stopped"
    spent = re.findall(rf"reached: {FIGURE} spent", reasons[0])
    assert spent and re.findall(rf"reached: {FIGURE} spent", message) == spent
    for _ in range(2):  # the figure every view shows from now on
        snap = meter.snapshot()
        assert f"so far ${spent[0]}" in str(snap) and re.findall(rf"{FIGURE} spent", str(snap)) == spent


def test_a_budget_stop_from_the_watcher_thread_ends_the_cell_with_its_figures(
    ip, ray_session, capsys
) -> None:
    res = ip.run_cell("%gpu_cluster start --name budget-cell --workers 1 --cpus-per-worker 0.25")
    assert res.error_in_exec is None
    c = get_manager().get("budget-cell")
    try:
        # the node has run for seconds at $1000/s: over budget at the watcher's first check, once it is started
        w = attach_policies(
            c, budget_usd=1.0, node_pricing=lambda node_id: PRICE, interval_s=0.1, start=False
        )
        started: list[BaseException] = []

        def start_watcher_once_training() -> None:
            try:
                _wait(lambda: c.busy and "training" in c.logs(rank=0, tail=5)[0])
                w.start()
            except BaseException as exc:  # noqa: BLE001 - handed to the test's thread below
                started.append(exc)

        t = threading.Thread(target=start_watcher_once_training)
        t.start()
        capsys.readouterr()
        res = ip.run_cell(f"%%distributed --cluster budget-cell\n{LOOP_CELL}")
        t.join(30)
        assert started == []
        err = res.error_in_exec
        assert isinstance(err, DistributedError), res
        text = "\n".join(err._render_traceback_())
        # the error's one line is the stop's reason, with its figures
        head = re.fullmatch(
            rf"Cluster stopped: budget of \$1\.00 reached: {FIGURE} spent \(estimate\)", text.splitlines()[0]
        )
        assert head, text
        spent = head.group(1)
        assert "KeyboardInterrupt" not in text and "Interrupted" not in text
        assert "| training" in text and "nothing was restarted" in text
        assert text.count("budget of $1.00 reached") == 1  # said once, not again in the note

        # every view agrees as soon as the cell has ended
        assert c.state == "stopped"
        ip.run_line_magic("gpu_cluster", "list")
        seen = capsys.readouterr()
        assert "budget-cell" not in seen.out
        snapshot = str(cost_meter_for(c).snapshot())  # what %gpu_cost status prints for this cluster
        assert f"so far ${spent}" in snapshot and "cost now  $0.00/h on 0 node(s)" in snapshot, snapshot
        assert re.findall(rf"{FIGURE} spent", snapshot) == [spent], snapshot
        _wait(lambda: not w.running)
        notice = seen.err + capsys.readouterr().err  # the watcher's own message, printed once it stopped it
        assert re.findall(rf"reached: {FIGURE} spent", notice) == [spent], notice
        # not a wait for a condition: that the figure stays put is checked after 0.2 s of the meter's real clock,
        # $200 at this price if it still counted
        time.sleep(0.2)
        assert f"so far ${spent}" in str(cost_meter_for(c).snapshot())  # it no longer grows
    finally:
        if c.state == "running":
            c.stop()


def test_gpu_cost_status_after_a_budget_stop_shows_the_stopped_clusters_final_figure(
    ip, monkeypatch, capsys
) -> None:
    """The stopped cluster has left the kernel's clusters: ``status`` says so and shows what it cost."""
    import gpu_notebook.magics._cost as cost_magic
    from gpu_notebook._registry import ClusterManager

    now = [2_000_000.0]
    stub = _Stub()
    stub.name = "spent"
    w = attach_policies(
        stub,
        budget_usd=50.0,
        node_pricing={"node-a": PRICE},
        clock=lambda: now[0],
        start=False,
        notify=lambda m: None,
    )
    now[0] += 60
    (message,) = w.tick()
    spent = re.findall(rf"reached: {FIGURE} spent", message)
    now[0] += 600  # long after the stop
    monkeypatch.setattr(cost_magic, "get_manager", ClusterManager)  # a kernel whose only cluster stopped
    capsys.readouterr()
    ip.run_line_magic("gpu_cost", "status")
    out = capsys.readouterr().out
    assert out.startswith(
        f"cluster 'spent' stopped (budget of $50.00 reached: ${spent[0]} spent (estimate)); no cluster is "
        "running. Its cost:"
    ), out
    assert f"so far ${spent[0]}" in out and re.findall(rf"{FIGURE} spent", out) == spent * 2, out
