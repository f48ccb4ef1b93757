"""``%gpu_cost policies``: policies add up (``--budget 100`` after ``--idle-stop 60`` keeps the idle stop), and
replacing one says so (issue 17, item 5)."""

from __future__ import annotations

from IPython.utils.capture import capture_output

from gpu_notebook.cost import BudgetPolicy, IdleStopPolicy, watcher_for


def _policies(ip, line: str) -> str:
    with capture_output() as cap:
        res = ip.run_cell(f"%gpu_cost policies {line}")
    assert res.error_in_exec is None, cap.stdout + cap.stderr
    return cap.stdout


def test_a_new_policy_keeps_the_others_and_replacing_one_says_so(ip, shared) -> None:
    try:
        _policies(ip, "--idle-stop 60")
        out = _policies(ip, "--budget 100")
        assert "budget $100.00" in out and "idle stop after 60 min" in out, out
        kinds = sorted(type(p).__name__ for p in watcher_for(shared).policies)
        assert kinds == ["BudgetPolicy", "IdleStopPolicy"]
        out = _policies(ip, "--budget 50")
        assert "replaces the earlier budget $100.00" in out and "idle stop after 60 min" in out, out
        (b,) = [p for p in watcher_for(shared).policies if isinstance(p, BudgetPolicy)]
        (i,) = [p for p in watcher_for(shared).policies if isinstance(p, IdleStopPolicy)]
        assert b.usd == 50 and i.window_s == 3600
    finally:  # the session's cluster is shared: no policy outlives this test
        w = watcher_for(shared)
        if w is not None:
            w.stop()
            w.meter.policies = []
            w.meter.budget_usd = None
