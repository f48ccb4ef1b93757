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
MARGIN = 1.10  # a size may grow by 10 % of its measured value before the test fails

# What the quick run measured (2026-12-01, 2 torch threads): bytes written / torch.save's, full and delta. The run
# trains with seeded generators, so it writes the same bytes every time; a codec regression fails here. (The full
# run's figures, in README.md, are the targets: fp32 0.697, bf16 0.413, frozen fine-tuning 0.042.)
MEASURED = {
    "(a) fp32, every 10 steps": (0.809, 0.712),
    "(a) fp32, every 20 steps": (0.807, 0.728),
    "(a) bf16, every 10 steps": (0.629, 0.417),
    "(a) bf16, every 20 steps": (0.627, 0.432),
    "(b) frozen (2.0% trainable), every 10 steps": (0.816, 0.042),
    "(c) fp32 at lr 1e-5, fresh AdamW, every 10 steps": (0.807, 0.679),
    "(c) fp32 at lr 1e-5, AdamW continued, every 10 steps": (0.806, 0.664),
}
# bytes per checkpoint of the max_restore_ratio sweep, by (dtype, max_restore_ratio)
MEASURED_SWEEP = {
    ("fp32", 1.2): 0.790, ("fp32", 2.0): 0.765, ("fp32", 3.0): 0.741,
    ("bf16", 1.2): 0.581, ("bf16", 2.0): 0.473, ("bf16", 3.0): 0.420,
}  # fmt: skip


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
    assert {w for w, _ in rows} == set(MEASURED)  # (a) x4, (b), (c) x2
    for (w, m), r in rows.items():
        if m == "ours, delta":
            full = rows[(w, "ours, full")]
            assert 0 < r["ratio"] < full["ratio"] <= 1.0, (w, r["ratio"], full["ratio"])
            assert r["restore_s"] > 0 and r["save_s"] > 0
            measured_full, measured_delta = MEASURED[w]
            assert full["ratio"] <= measured_full * MARGIN, (w, full["ratio"], measured_full)
            assert r["ratio"] <= measured_delta * MARGIN, (w, r["ratio"], measured_delta)
    sweep = doc["sweep"]
    assert {(s["dtype"], s["max_restore_ratio"]) for s in sweep} == {
        (d, r) for d in ("fp32", "bf16") for r in (1.2, 2.0, 3.0)
    }
    for d in ("fp32", "bf16"):
        by = {s["max_restore_ratio"]: s for s in sweep if s["dtype"] == d}
        # a lower bound on what a restore may read writes more full bases and more bytes
        assert by[1.2]["bases"] >= by[2.0]["bases"] >= by[3.0]["bases"]
        assert by[1.2]["bytes"] >= by[2.0]["bytes"] >= by[3.0]["bytes"]
        for r, row in by.items():
            assert row["bytes"] <= MEASURED_SWEEP[(d, r)] * MARGIN, (d, r, row["bytes"])
