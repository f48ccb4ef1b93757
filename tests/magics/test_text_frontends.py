"""Text-only front ends (a terminal, a plain-text log) see what a notebook sees (issue 17 item 17).

Every rich result of a magic carries a ``text/plain`` that says the same as its ``text/html``, never
``<IPython.core.display.HTML object>``.
"""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output

from gpu_notebook.catalog import get_catalog

OBJECT_REPR = "<IPython.core.display"


def _rich(cap) -> list[dict]:
    return [o.data for o in cap.outputs if "text/html" in o.data]


def test_catalog_has_the_table_as_plain_text(ip) -> None:
    with capture_output() as cap:
        ip.run_line_magic("gpu_cost", "catalog --cloud aws")
    (data,) = _rich(cap)
    text = data["text/plain"]
    assert OBJECT_REPR not in text
    rows = get_catalog().table(cloud="aws")
    assert text.startswith("USD per hour, estimates")
    assert "instance_type" in text.splitlines()[1] and "on_demand" in text.splitlines()[1]
    first = rows[0]
    # every row, with its price as the HTML shows it
    assert len(text.splitlines()) == 2 + len(rows)
    assert first["instance_type"] in text and f"{first['on_demand']:.3f}" in data["text/html"]
    assert f"{first['on_demand']:.3f}" in text


def test_monitor_snapshot_has_the_reading_as_plain_text(ip) -> None:
    try:
        with capture_output() as cap:
            ip.run_line_magic("gpu_monitor", "snapshot --local --interval 0.2")
        (data,) = _rich(cap)
        text = data["text/plain"]
        assert OBJECT_REPR not in text
        assert text.startswith("GPU monitor snapshot") and "node(s)" in text
        # the host row of this machine, or "waiting for the first sample": the same as the HTML says
        if "CPU only" in data["text/html"] or "GPU node" in data["text/html"]:
            assert "CPU %" in text and ("CPU only" in text or "GPU node" in text)
        else:
            assert (
                "waiting for the first sample" in text and "waiting for the first sample" in data["text/html"]
            )
    finally:
        ip.run_line_magic("gpu_monitor", "stop --local")


def test_cluster_monitor_snapshot_is_plain_text_too(ip, shared) -> None:
    try:
        with capture_output() as cap:
            ip.run_line_magic("gpu_monitor", "snapshot --interval 0.2")
        (data,) = _rich(cap)
        assert OBJECT_REPR not in data["text/plain"]
        assert data["text/plain"].startswith("GPU monitor snapshot")
    finally:
        ip.run_line_magic("gpu_monitor", "stop")


def test_the_snapshot_left_by_stop_is_plain_text_too(ip) -> None:
    pytest.importorskip("plotly")
    pytest.importorskip("ipywidgets")
    ip.run_line_magic("gpu_monitor", "show --local --interval 0.2 --refresh 0.2")
    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "stop --local")
    left = [d for d in _rich(cap) if "gpu-notebook-monitor-snapshot" in d["text/html"]]
    assert left, cap.outputs
    for d in left:
        assert OBJECT_REPR not in d["text/plain"]
        assert d["text/plain"].startswith("GPU monitor snapshot")


def test_csv_without_gpus_writes_the_host_metrics(ip, shared) -> None:
    from gpu_notebook.monitor import monitor_for

    try:
        mon = monitor_for(interval=0.2)
        if mon.gpu_count:
            pytest.skip("this cluster has GPUs: the nvidia-smi CSV has rows")
        mon.pull()
        with capture_output() as cap:
            ip.run_line_magic("gpu_monitor", "csv --interval 0.2")
        lines = cap.stdout.splitlines()
        assert lines[0] == (
            "timestamp, node, cpu [%], memory.used [MiB], memory.total [MiB], net.rx [kB/s], net.tx [kB/s]"
        )
        assert len(lines) > 1, cap.stdout  # one row per node per sample, not a bare header
        assert all(len(line.split(", ")) == 7 for line in lines[1:])
        assert {line.split(", ")[1] for line in lines[1:]} <= set(mon.nodes)
    finally:
        ip.run_line_magic("gpu_monitor", "stop")
