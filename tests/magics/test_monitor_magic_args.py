"""``%gpu_monitor``: bad values fail the cell with the usage (no traceback); stop and status never start samplers."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook.monitor import _monitor as monitor_mod

pytest.importorskip("plotly")


@pytest.fixture
def started(ip, monkeypatch: pytest.MonkeyPatch):
    """Every Monitor started during the test (on conftest's ``ip`` shell, ``%load_ext gpu_notebook`` done)."""
    local = monitor_mod.running_monitor(local=True)
    if local is not None:
        local.stop()
    started: list[object] = []
    real_start = monitor_mod.Monitor.start

    def start(self):
        started.append(self)
        return real_start(self)

    monkeypatch.setattr(monitor_mod.Monitor, "start", start)
    yield started
    for m in started:
        m.stop()


def run(ip, line: str):
    """Run ``%gpu_monitor line`` as a cell: its result (IPython's ExecutionResult) and what it showed."""
    with capture_output() as cap:
        result = ip.run_cell(f"%gpu_monitor {line}")
    return result, cap


@pytest.mark.parametrize(
    "line",
    [
        "prometheus --local --port 70000",
        "prometheus --local --port -1",
        "show --local --window -5",
        "show --local --interval inf",
        "show --local --refresh 0",
        "advice --local --advice-window nan",
        "advice --local --threshold 150",
    ],
)
def test_out_of_range_values_print_usage_not_a_traceback(ip, started, line: str) -> None:
    result, cap = run(ip, line)
    assert isinstance(result.error_in_exec, UsageError)  # the cell fails: Run All stops here
    assert (
        "UsageError" in cap.stderr
        and "%gpu_monitor" in cap.stderr
        and "Traceback" not in cap.stderr + cap.stdout
    )
    assert started == []


def test_stop_and_status_do_not_start_a_monitor(ip, started) -> None:
    _, cap = run(ip, "stop --local")
    assert "No GPU monitor is running." in cap.stdout
    _, cap = run(ip, "status --local")
    assert "No GPU monitor is running" in cap.stdout
    assert started == []  # no samplers (actors on every node) started to be stopped
    run(ip, "snapshot --local")
    assert len(started) == 1
    _, cap = run(ip, "status --local")
    assert cap.stdout.startswith("Monitor(local, 1 nodes") and "running" in cap.stdout
    _, cap = run(ip, "stop --local")
    assert "GPU monitor stopped." in cap.stdout and not started[0].started
