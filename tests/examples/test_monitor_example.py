"""Run examples/monitoring_and_cost.ipynb top to bottom in a real kernel (nbclient)."""

from __future__ import annotations

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "monitoring_and_cost.ipynb"


def test_monitoring_example_runs(tmp_path: pathlib.Path) -> None:
    nb = nbformat.read(EXAMPLE, as_version=4)
    # the notebook as a user has it: its own `%load_ext gpu_notebook` cell is what provides %gpu_monitor
    assert any("%load_ext gpu_notebook" in c.source for c in nb.cells if c.cell_type == "code")
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()

    def outputs(marker: str) -> list[dict]:
        cell = next(c for c in nb.cells if c.cell_type == "code" and marker in c.source)
        return cell.outputs

    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    # `%gpu_monitor stop` at the end replaced the live dashboard by its static snapshot (update_display_data)
    live = outputs("%gpu_monitor --interval")
    assert len(live) == 1 and "application/vnd.jupyter.widget-view+json" not in live[0]["data"]
    assert "gpu-notebook-monitor-snapshot" in live[0]["data"]["text/html"]
    # a dashboard shown as a cell result keeps the widget view plus the static HTML table for saved notebooks
    (shown,) = outputs("dashboard = sim.widget")
    assert "application/vnd.jupyter.widget-view+json" in shown["data"]
    assert "<td>95</td>" in shown["data"]["text/html"] or "<td>40</td>" in shown["data"]["text/html"]
    advice = "".join(o.get("text", "") for o in outputs("sim.advice()"))
    for gpu in (4, 5, 6, 7):
        assert f"GPU {gpu} (NVIDIA H100 80GB HBM3)" in advice
    assert "GPU 0 (" not in advice and "mixed precision" in advice
    prom = "".join(o.get("text", "") for o in outputs("serve_prometheus"))
    assert prom.count("gpu_notebook_gpu_utilization_percent{") == 8
    csv = "".join(o.get("text", "") for o in outputs("to_csv"))
    assert csv.startswith("timestamp, name, utilization.gpu [%], memory.used [MiB]")
