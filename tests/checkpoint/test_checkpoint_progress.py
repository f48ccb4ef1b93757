"""Progress display (bytes, speed) of saves and restores in a real Jupyter kernel (nbclient)."""

from __future__ import annotations

import pathlib

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

_CELL = """
import torch
from gpu_notebook import checkpoint
ck = checkpoint.Checkpointer({path!r}, progress=True)
ck.save({{"w": torch.randn(2_000_000), "step": 1}}, block=True)
state = ck.restore()
print("restored", state["step"])
"""


def test_progress_line_in_a_kernel(tmp_path: pathlib.Path) -> None:
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(_CELL.format(path=str(tmp_path / "store")))]
    )
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outs = nb.cells[0].outputs
    assert not [o for o in outs if o.output_type == "error"], outs
    shown = [o for o in outs if o.output_type in ("display_data", "update_display_data")]
    html = [o["data"]["text/html"] for o in shown]
    plain = [o["data"]["text/plain"] for o in shown]
    assert any("<progress" in h for h in html)
    assert any(
        p.startswith("checkpoint c0000000000") and "8.0 MB / 8.0 MB (100%)" in p and "MB/s" in p
        for p in plain
    )
    assert any(p.startswith("restore c0000000000") and "(100%)" in p for p in plain)
    assert "restored 1" in "".join(o.get("text", "") for o in outs if o.output_type == "stream")


_START = """
import time, torch
from gpu_notebook import checkpoint
class Slow(checkpoint.LocalStore):
    def put(self, key, data, create_only=True):
        time.sleep(0.3)
        return super().put(key, data, create_only)
ck = checkpoint.Checkpointer(Slow({path!r}), progress=True, pack_kb=64, chunk_mb=1, threads=2)
h = ck.save({{"w": torch.randn(2_000_000), "step": 1}})  # returns at once; uploads in the background
"""
_LATER = """
print("other work")
h.result(60)
"""


def test_a_background_save_shows_its_progress_in_the_cell_that_started_it(tmp_path: pathlib.Path) -> None:
    # the save runs on while the next cell executes: its progress line must stay under the save's cell, not
    # appear under whatever cell happens to run when the background thread first reports
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(_START.format(path=str(tmp_path / "store"))),
            nbformat.v4.new_code_cell(_LATER),
        ]
    )
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    first, later = (c.outputs for c in nb.cells)
    assert not [o for o in first + later if o.output_type == "error"], (first, later)
    lines = [
        o for o in first if o.output_type == "display_data" and "checkpoint c0000000000" in str(o["data"])
    ]
    assert lines, first
    assert "(100%)" in lines[-1]["data"]["text/plain"]  # updated in place to the end
    assert not [o for o in later if o.output_type == "display_data"], later
