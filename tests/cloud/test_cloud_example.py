"""examples/cloud_cluster.ipynb runs end to end in a real kernel: it only does dry runs (nothing launched)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "cloud_cluster.ipynb"


#: Python-API calls that create cloud resources: CloudLauncher.launch(...), and Cluster(cloud=...) started.
_PY_LAUNCH = re.compile(r"\.launch\(|\bCluster\((?:[^()]|\([^()]*\))*\bcloud\s*=")


def launches(source: str) -> bool:
    """Whether a code cell could create cloud resources: a Python-API launch, or ``%gpu_cluster start``
    without ``--dry-run`` (on any of its lines)."""
    if _PY_LAUNCH.search(source):
        return True
    for line in source.splitlines():
        words = line.split()
        if words[:1] == ["%gpu_cluster"] and "start" in words[1:2] and "--dry-run" not in words:
            return True
    return False


def test_the_guard_catches_every_way_a_cell_could_launch():
    assert launches("state = launcher.launch(spec)")  # the Python API, no magic in the cell
    assert launches("from gpu_notebook import Cluster\nc = Cluster(cloud='aws', gpu='T4:1').start()")
    assert launches("%gpu_cluster start --cloud aws --gpu T4:1")
    assert launches("print('x')\n%gpu_cluster start --cloud gcp --dry-run\n%gpu_cluster start --cloud gcp")
    assert not launches("plan = launcher.plan(spec)\nprint(plan.yaml)")
    assert not launches("%gpu_cluster start --cloud aws --gpu A100:8 --spot --dry-run")
    assert not launches("%gpu_cluster list")
    # the guard this replaces, `A and B or C`, let the first of these through
    source = "state = launcher.launch(spec)"
    assert ".launch(" not in source and "--dry-run" in source or "%gpu_cluster" not in source


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
    # guard: the notebook must never launch anything in CI, whichever API a cell uses
    launching = [c.source for c in nb.cells if c.cell_type == "code" and launches(c.source)]
    assert not launching, f"cells that would launch cloud resources: {launching}"
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
