"""``%gpu_monitor`` in a real IPython shell (this machine: host metrics; GPUs where NVML exists)."""

from __future__ import annotations

import urllib.request

import pytest
from IPython.core.error import UsageError
from IPython.utils.capture import capture_output

from gpu_notebook.magics._monitor import MonitorMagics

pytest.importorskip("plotly")


@pytest.fixture(scope="module", autouse=True)
def _local_monitor_stopped_after(ip):
    """The ``ip`` shell of conftest (``%load_ext gpu_notebook``); this module's monitor is stopped after it."""
    yield
    ip.run_line_magic("gpu_monitor", "stop --local")


def test_help_is_generated_from_magic_arguments(ip) -> None:
    doc = ip.find_line_magic("gpu_monitor").__doc__
    assert "%gpu_monitor" in doc and "--interval" in doc and "{show,stop,status" in doc


def test_bad_arguments_print_usage_not_a_traceback(ip) -> None:
    with capture_output() as cap:
        result = ip.run_cell("%gpu_monitor explode --local")
    assert isinstance(result.error_in_exec, UsageError)  # the cell fails
    assert (
        "COMMAND is one of show, stop, status" in cap.stderr
        and "%gpu_monitor" in cap.stderr
        and "invalid choice" in cap.stderr
        and "Traceback" not in cap.stderr + cap.stdout
    )


def test_show_status_exports_and_stop(ip) -> None:
    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "show --local --interval 0.2 --refresh 0.2")
    bundles = [o.data for o in cap.outputs]
    assert any(
        "application/vnd.jupyter.widget-view+json" in b and "<table>" in b.get("text/html", "")
        for b in bundles
    )

    from gpu_notebook.monitor import monitor_for

    mon = monitor_for(local=True)
    assert mon.started and mon.interval == pytest.approx(0.2)
    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "status --local")
    assert cap.stdout.startswith("Monitor(local, 1 nodes")

    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "prometheus --local")
    url = cap.stdout.strip().rsplit(" ", 1)[-1]
    assert url.startswith("http://127.0.0.1:")
    mon.pull()
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert b"gpu_notebook_node_up" in resp.read()

    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "csv --local")
    head = "timestamp, name, utilization.gpu [%]" if mon.gpu_count else "timestamp, node, cpu [%]"
    assert cap.stdout.startswith(head)  # no GPU on this machine: its host metrics

    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "advice --local --advice-window 60")
    assert cap.stderr == ""
    if mon.gpu_count == 0:  # host metrics only (this machine without NVML): no GPU can be under-used
        assert cap.stdout == "No under-used GPU (or not enough history yet for the advice window).\n"
    else:  # each line the advice of one GPU, or the one line saying there is none
        lines = cap.stdout.splitlines()
        assert lines == ["No under-used GPU (or not enough history yet for the advice window)."] or all(
            line.startswith("GPU ") and " on node " in line and "for the last 60 s" in line for line in lines
        ), lines

    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "snapshot --local")
    assert "GPU monitor" in cap.outputs[0].data["text/html"]

    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "stop --local")
    assert "stopped" in cap.stdout
    # the live dashboard was replaced by its static snapshot
    assert any(
        "gpu-notebook-monitor-snapshot" in o.data.get("text/html", "")
        and "application/vnd.jupyter.widget-view+json" not in o.data
        for o in cap.outputs
    )
    assert not mon.started
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_defaults_are_configurable_traitlets(ip) -> None:
    from traitlets.config import Config

    magics = MonitorMagics(ip, config=Config({"MonitorMagics": {"interval": 0.25, "threshold": 50.0}}))
    assert magics.interval == 0.25 and magics.threshold == 50.0 and magics.refresh == 1.0
    assert MonitorMagics.class_traits()["window"].metadata.get("config") is True
