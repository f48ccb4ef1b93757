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
        p.startswith("checkpoint 000000000001-") and "8.0 MB / 8.0 MB (100%)" in p and "MB/s" in p
        for p in plain
    )
    assert any(p.startswith("restore 000000000001-") and "(100%)" in p for p in plain)
    assert "restored 1" in "".join(o.get("text", "") for o in outs if o.output_type == "stream")
