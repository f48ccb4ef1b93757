"""The example notebooks run end to end in a real kernel (nbclient), as a new user would run them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(420)
def test_quickstart_notebook_runs_and_trains(tmp_path):
    import nbformat

    src = ROOT / "examples" / "quickstart.ipynb"
    work = tmp_path / "quickstart.ipynb"
    work.write_bytes(src.read_bytes())
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(work), "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "12/12 code cells executed" in proc.stdout
    assert "SUMMARY: 2 workers trained a DDP model" in proc.stdout
    nb = nbformat.read(tmp_path / "quickstart.executed.ipynb", as_version=4)
    text = "\n".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )
    assert "[rank 0] rank 0 of 2" in text and "[rank 1] rank 1 of 2" in text
    assert "[rank 0] step   0" in text
    assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))
    # monitoring and cost: the saved views (what a notebook without widgets shows) have a reading and a price
    shown = {
        c.source.strip(): "".join(
            str(o.get("data", {}).get("text/html", "")) for o in c.get("outputs", []) if "data" in o
        )
        for c in nb.cells
        if c.cell_type == "code" and c.source.strip() in ("%gpu_monitor", "%gpu_cost")
    }
    assert "GPU monitor" in shown["%gpu_monitor"] and "CPU %" in shown["%gpu_monitor"], shown["%gpu_monitor"]
    assert "did not start" not in shown["%gpu_monitor"]
    assert "$0" in shown["%gpu_cost"] or "0.00" in shown["%gpu_cost"], shown["%gpu_cost"]
