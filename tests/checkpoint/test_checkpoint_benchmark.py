"""``benchmarks/checkpoint.py`` (the evidence for the checkpoint targets) still runs end to end: a quick run,
without S3, checks every restore bit for bit against the live state and prints both of its tables."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint.py"


def test_quick_run_prints_both_tables(tmp_path: pathlib.Path) -> None:
    out_json = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--no-s3", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| workload | torch.save+zstd |" in proc.stdout
    assert "| state | max_restore_ratio |" in proc.stdout
    doc = json.loads(out_json.read_text())
    rows = {(r["workload"], r["method"]): r for r in doc["rows"]}
    assert len({w for w, _ in rows}) == 7  # (a) x4, (b), (c) x2
    for (w, m), r in rows.items():
        if m == "ours, delta":
            full = rows[(w, "ours, full")]
            assert 0 < r["ratio"] < full["ratio"] <= 1.0, (w, r["ratio"], full["ratio"])
            assert r["restore_s"] > 0 and r["save_s"] > 0
    sweep = doc["sweep"]
    assert {(s["dtype"], s["max_restore_ratio"]) for s in sweep} == {
        (d, r) for d in ("fp32", "bf16") for r in (1.2, 2.0, 3.0)
    }
    for d in ("fp32", "bf16"):
        by = {s["max_restore_ratio"]: s for s in sweep if s["dtype"] == d}
        # a lower bound on what a restore may read writes more full bases and more bytes
        assert by[1.2]["bases"] >= by[2.0]["bases"] >= by[3.0]["bases"]
        assert by[1.2]["bytes"] >= by[2.0]["bytes"] >= by[3.0]["bytes"]
