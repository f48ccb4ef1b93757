"""The cost widget through its traits and mime bundle, and ``%gpu_cost`` in a real IPython shell on a real cluster."""

from __future__ import annotations

import comm
import pytest

from gpu_notebook.catalog import Catalog
from gpu_notebook.cost import CostMeter, IdleStopPolicy
from gpu_notebook.widgets import CostWidget, cost_view

G5 = ("aws", "g5.xlarge", "us-east-1", "on_demand")


class Clock:
    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_widget_shows_numbers_history_and_markets() -> None:
    clock = Clock()
    meter = CostMeter(node_pricing={"a": G5, "b": G5}, clock=clock, catalog=Catalog.shipped())
    meter.sync_nodes(["a", "b"])
    w = CostWidget(meter, autostart=False)
    assert "$2.01/h" in w.header.value and "estimate from list prices" in w.header.value
    for _ in range(5):
        clock.t += 3600
        assert w.refresh(force=True)
    assert "$10.06" in w.header.value  # 2 x 1.006 USD/h x 5 h
    ys = list(w.fig.data[0].y)
    assert len(ys) == 6 and ys[-1] == pytest.approx(10.06) and ys == sorted(ys)
    bars = list(w.fig.data[1].y)
    assert bars[0] == pytest.approx(10.06) and bars[1] < bars[0] and bars[2] < bars[0]
    assert "$10.06 so far" in w.fig.layout.title.text
    assert w.refresh() is False  # nothing changed: nothing sent
    b = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in b
    assert "$10.06" in b["text/html"] and "same node-hours" in b["text/plain"]
    w.stop()


def test_widget_message_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    # comms that send: once a test in this process has imported ipykernel.ipkernel, a widget's comm is ipykernel's,
    # with no kernel, and ipywidgets sends (and we count) nothing through it
    monkeypatch.setattr(comm, "create_comm", lambda *a, **k: comm.DummyComm(*a, **k))
    clock = Clock()
    meter = CostMeter(node_pricing={"a": G5}, clock=clock, catalog=Catalog.shipped())
    meter.node_joined("a")
    w = CostWidget(meter, autostart=False, max_msgs_per_s=5)
    w.rate.clock = lambda: 1000.0  # the burst below stays within one second, however slow the machine
    before = w.messages_sent
    sent = 0
    for _ in range(50):  # a burst of changes within one second
        clock.t += 60
        sent += w.refresh()
    assert w.skipped > 0 and sent < 5
    assert w.messages_sent - before <= 10  # never more than the cap (+ one refresh) per second


def test_local_cluster_and_idle_countdown_banner() -> None:
    clock = Clock()
    meter = CostMeter(clock=clock)
    meter.sync_nodes(["n"])
    pol = IdleStopPolicy(6, None, utilisation=lambda w: 0.0, stop=lambda r: None, notify=lambda m: None)
    meter.policies = [pol]
    w = CostWidget(meter, autostart=False)
    assert "local cluster: $0" in w.header.value and w.fig.layout.title.text == "local cluster: $0"
    pol.check(clock())
    clock.t += 5.5 * 60
    pol.check(clock())
    w.refresh(force=True)
    assert "Idle stop in 0m30s" in w.header.value and "run any cell" in w.header.value
    clock.t += 60
    pol.check(clock())
    w.refresh(force=True)
    assert "Workers stopped" in w.header.value


def test_cost_view_falls_back_to_static_snapshot(monkeypatch) -> None:
    import builtins

    meter = CostMeter(clock=Clock())
    real_import = builtins.__import__

    def no_plotly(name, *a, **k):
        if name.startswith("plotly"):
            raise ImportError("no plotly here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_plotly)
    v = cost_view(meter)
    assert not isinstance(v, CostWidget) and "local cluster: $0" in v._repr_html_()


# -- %gpu_cost in a real shell ------------------------------------------------------------------------------------
@pytest.fixture
def shell(ip):
    active = ip.display_formatter.active_types
    ip.display_formatter.active_types = list(ip.display_formatter.format_types)  # like a notebook: HTML too
    yield ip
    ip.display_formatter.active_types = active


def _run(shell, line: str):
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        result = shell.run_cell(f"%gpu_cost {line}")  # as a cell: a failing magic fails it
    return result, cap


def test_magic_catalog_and_usage(shell) -> None:
    _, cap = _run(shell, "catalog --cloud aws --gpu A100 --region us-east-1")
    html = cap.outputs[0].data["text/html"]
    assert (
        "p4d.24xlarge" in html and "p4de.24xlarge" in html and "g5.xlarge" not in html and "estimates" in html
    )
    _, cap = _run(shell, "catalog --cloud azure --gpu L4")
    assert "No instance types match." in cap.stdout
    _, cap = _run(shell, "frobnicate")
    assert (
        "UsageError" in cap.stderr
        and "%gpu_cost" in cap.stderr
        and "COMMAND is one of show, status, policies" in cap.stderr
        and "Traceback" not in cap.stderr
    )
    _, cap = _run(shell, "catalog --cloud ibm")
    assert "unknown cloud 'ibm'" in cap.stdout + cap.stderr


@pytest.mark.timeout(120)
def test_magic_on_a_real_cluster(shell, ray_session) -> None:
    from gpu_notebook import Cluster, get_manager

    prev = get_manager().current
    c = Cluster(name="cost-magic", workers=1, cpus_per_worker=0.25).start()
    try:
        get_manager().use(c.name)
        _, cap = _run(shell, "status")
        assert "local cluster: $0" in cap.stdout and "so far $0.00" in cap.stdout
        _, cap = _run(shell, "policies --budget 25 --idle-stop 60")
        assert (
            "cluster 'cost-magic': budget $25.00 (warns at 80%, then checkpoint and stop); idle stop after 60 min "
            "without cells or 10% utilisation; local cluster: $0"
        ) in cap.stdout
        _, cap = _run(shell, "policies")
        assert "budget:" in cap.stdout and "idle stop:" in cap.stdout
        _, cap = _run(shell, "show --refresh 1")
        bundle = cap.outputs[0].data
        assert (
            "application/vnd.jupyter.widget-view+json" in bundle
            and "local cluster: $0" in bundle["text/html"]
        )
        _, cap = _run(shell, "stop")
        assert "1 cost view(s) stopped." in cap.stdout
    finally:
        c.stop()
        if prev is not None and prev.state == "running":
            get_manager().use(prev.name)
