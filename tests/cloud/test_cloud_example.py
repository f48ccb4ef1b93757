"""examples/cloud_cluster.ipynb runs end to end in a real kernel: it only does dry runs (nothing launched)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "cloud_cluster.ipynb"


def _outputs(cell):
    text = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            text.append(out.get("text", ""))
        elif "data" in out:
            text.append(out["data"].get("text/plain", ""))
    return "".join(text)


@pytest.mark.timeout(240)
def test_cloud_example_notebook_dry_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path / "cfg"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # guard: the notebook must never launch anything in CI
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert (
                ".launch(" not in cell.source
                and "--dry-run" in cell.source
                or "%gpu_cluster" not in cell.source
            )
    nbclient.NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert not any(o.get("output_type") == "error" for c in code for o in c.get("outputs", []))
    text = "\n".join(_outputs(c) for c in code)
    assert "dry run: nothing launched" in text
    assert "MarketType: spot" in text and "cache_stopped_nodes: false" in text
    assert "'provisioningModel': 'SPOT'" in text and "\nSpot\n" in text
    assert "kind: RayCluster" in text
    assert "aws    us-east-1    p4d.24xlarge" in text
    assert "regions with 8x A100" in text  # the unmeetable request named alternatives
    assert not (tmp_path / "cfg" / "clusters").exists() or not any((tmp_path / "cfg" / "clusters").iterdir())
