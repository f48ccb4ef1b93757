"""``benchmarks/first_start.py`` (the evidence for the first start's figures) still runs end to end: a quick run
starts Ray alone, then our cluster through ``%load_ext`` and ``%gpu_cluster start`` in a fresh process each, and
prints every row of its table. No timings are checked: the machine's load decides them."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "first_start.py"


def test_quick_run_prints_every_row(tmp_path: pathlib.Path) -> None:
    out_json = tmp_path / "first_start.json"
    proc = subprocess.run(
        # no lock of its own: the suite's Ray tests are serialised by whoever runs them
        [sys.executable, str(SCRIPT), "--quick", "--lock", "", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert "1-minute load average before each measurement" in proc.stdout
    for row in (
        "| (a) ray.init(): import + init |",
        "| (b) gpu_notebook: %load_ext to ready |",
        "|     before Ray starts |",
        "|     Ray's start |",
        "|     reserve + worker processes |",
        "|     torch.distributed group |",
        "|     then the first %%distributed cell done |",
        "| (c) nbdistributed",
    ):
        assert row in proc.stdout, (row, proc.stdout)
    doc = json.loads(out_json.read_text())
    (ours,) = doc["runs"]["ours"]
    assert ours["world size"] == [2, 2]  # the group the start formed answers a cell on both ranks
    assert 0 < ours["load_ext"] < ours["ready"] <= ours["first cell"]
    assert len(doc["runs"]["ray"]) == 1
