"""Live cost views after ``%reload_ext gpu_notebook`` (issue 17, item 15): the reload stops the views the unloaded
magics started, and ``%gpu_cost stop`` stops every live cost view, also one no magics instance knows of (it said
"No live cost view." while the earlier view's refresh thread kept running, after the cluster had stopped too)."""

from __future__ import annotations

from IPython.utils.capture import capture_output

from gpu_notebook.catalog import Catalog
from gpu_notebook.cost import CostMeter
from gpu_notebook.widgets import CostWidget, cost_view, live_views, stop_live_views

G5 = ("aws", "g5.xlarge", "us-east-1", "on_demand")


def _cell(ip, line: str) -> str:
    with capture_output() as cap:
        res = ip.run_cell(line)
    assert res.error_in_exec is None, cap.stdout + cap.stderr
    return cap.stdout


def test_reload_ext_stops_the_cost_views_of_the_magics_it_unloads(ip, shared) -> None:
    before = set(live_views(CostWidget))
    try:
        _cell(ip, "%gpu_cost show --refresh 0.2")
        (view,) = [v for v in live_views(CostWidget) if v not in before]
        thread = view._thread
        assert thread is not None and thread.is_alive()
        _cell(ip, "%reload_ext gpu_notebook")
        assert not thread.is_alive() and not view.live and view not in live_views()
        assert "No live cost view." in _cell(ip, "%gpu_cost stop")  # nothing left to stop, and it says so
        assert ip.find_line_magic("gpu_cost") is not None  # the reloaded magics work
    finally:
        stop_live_views(CostWidget)


def test_gpu_cost_stop_stops_a_view_no_magics_instance_knows_of(ip) -> None:
    meter = CostMeter(node_pricing={"a": G5}, catalog=Catalog.shipped())
    meter.sync_nodes(["a"])
    view = cost_view(meter, interval=0.2)  # as a view made by magics since replaced: in nobody's list
    try:
        thread = view._thread
        assert thread is not None and thread.is_alive()
        out = _cell(ip, "%gpu_cost stop")
        assert "1 cost view(s) stopped." in out, out
        assert not thread.is_alive() and not view.live and view not in live_views()
    finally:
        view.stop()
