"""``benchmarks/checkpoint.py`` (the evidence for the checkpoint targets) still runs end to end: a quick run,
without S3, checks every restore bit for bit against the live state and prints all of its tables."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint.py"
MARGIN = 1.10  # a size may grow by 10 % of its measured value before the test fails

# What the quick run measured (2026-12-02, 2 torch threads): bytes written / torch.save's, full and delta (chains of
# one: the measured delta is the second after its base). The run trains with seeded generators, so it writes the
# same bytes every time; a codec regression fails here. (The full run's figures are in docs/benchmarks.md.)
MEASURED = {
    "(a) fp32, every 10 steps": (0.809, 0.744),
    "(a) bf16, every 10 steps": (0.626, 0.467),
    "(b) frozen (2.0% trainable), every 10 steps": (0.815, 0.044),
    "(c) fp32 at lr 1e-5, AdamW continued, every 10 steps": (0.808, 0.680),
}
# all bytes written over the quick run's runs of checkpoints (bases included) per checkpoint after the first
MEASURED_RUNS = {
    ("fp32", "chains of one (default)"): 0.736, ("fp32", "chains (delta_against='previous')"): 0.722,
    ("bf16", "chains of one (default)"): 0.466, ("bf16", "chains (delta_against='previous')"): 0.437,
    ("frozen (2% trainable)", "chains of one (default)"): 0.046,
    ("frozen (2% trainable)", "chains (delta_against='previous')"): 0.044,
}  # fmt: skip


def test_quick_run_prints_every_table(tmp_path: pathlib.Path) -> None:
    out_json = tmp_path / "rows.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--no-s3", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| workload | torch.save+zstd |" in proc.stdout
    assert "| state, a checkpoint every 10 steps | deltas |" in proc.stdout
    assert "| 10,000 tensors of 1 KB |" in proc.stdout and "| host memory of the saves" in proc.stdout
    doc = json.loads(out_json.read_text())
    rows = {(r["workload"], r["method"]): r for r in doc["rows"]}
    assert {w for w, _ in rows} == set(MEASURED)  # (a) fp32 and bf16, (b), (c) continued
    for (w, m), r in rows.items():
        if m == "ours, delta":
            full = rows[(w, "ours, full")]
            assert 0 < r["ratio"] < full["ratio"] <= 1.0, (w, r["ratio"], full["ratio"])
            assert r["restore_s"] > 0 and r["save_s"] > 0
            assert all(c > 0 for c in r["cpu_s"])  # the CPU time of every save, from the manifest
            measured_full, measured_delta = MEASURED[w]
            assert full["ratio"] <= measured_full * MARGIN, (w, full["ratio"], measured_full)
            assert r["ratio"] <= measured_delta * MARGIN, (w, r["ratio"], measured_delta)
        if m == "ours through DCP, delta":  # dcp.save through our DCPWriter: a delta, under plain DCP's bytes
            plain = rows[(w, "torch.distributed.checkpoint")]
            assert 0 < r["ratio"] < plain["ratio"], (w, r["ratio"], plain["ratio"])
            assert r["restore_s"] > 0
    assert {m for _, m in rows} >= {"ours through DCP, delta", "torch.distributed.checkpoint"}
    runs = {(s["state"], s["policy"]): s for s in doc["sweep"]}
    assert set(runs) == set(MEASURED_RUNS)
    for key, row in runs.items():
        assert row["bytes"] <= MEASURED_RUNS[key] * MARGIN, (key, row["bytes"])
        assert row["restore_median"] > 0
    assert doc["memory"] and all(m["peak"] > 0 and m["steady"] for m in doc["memory"])
    assert all(m["stall_s"] and m["host_copy_s"] for m in doc["memory"])  # the stall next to a host copy
    # reuse_buffers=True keeps the snapshot's buffers between saves: about one more copy of the state
    default, reused = (next(m for m in doc["memory"] if m["reuse"] is r) for r in (False, True))
    assert min(reused["steady"]) > max(default["steady"]) + 0.5, (default["steady"], reused["steady"])
    small = doc["small"]
    assert (
        small["manifest_kb"]["n"] <= small["manifest_kb"]["1"] * 1.01
    )  # no growth with the saves since the base
    assert "| torch.save / torch.load |" in proc.stdout  # the baseline of the small tensors, in the same run
    assert len(small["torch_load_s"]) == len(small["restore_s"]) and min(small["torch_save_mb_s"]) > 0


def test_the_spread_benchmark_compares_rank_0_alone_with_spread_saves(tmp_path: pathlib.Path) -> None:
    """``benchmarks/checkpoint_spread.py --quick``: 2 gloo ranks; its table and, per save, each rank's share."""
    out_json = tmp_path / "spread.json"
    script = SCRIPT.with_name("checkpoint_spread.py")
    proc = subprocess.run(
        [sys.executable, str(script), "--quick", "--json", str(out_json)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for row in (
        "training stall per save",
        "CPU time of rank 0's save",
        "one host copy",
        "bytes written per delta",
    ):
        assert f"| {row}" in proc.stdout, proc.stdout
    doc = json.loads(out_json.read_text())
    alone, spread = doc["rank 0 alone"], doc["spread"]
    assert len(alone) == len(spread) >= 4
    for a, s in zip(alone, spread, strict=True):
        assert (
            a["new"] == s["new"] and a["raw_bytes"] == s["raw_bytes"]
        )  # the same checkpoint, written otherwise
        ra = {r["rank"]: r["raw_bytes"] for r in a["ranks"]}
        rs = {r["rank"]: r["raw_bytes"] for r in s["ranks"]}
        assert ra[1] < 0.01 * a["raw_bytes"]  # alone: rank 1 saves its RNG states only
        assert (
            0.3 < rs[1] / s["raw_bytes"] < 0.7
        )  # spread: about half of the state is rank 1's to copy and encode


def test_the_fp32_bytes_analysis_splits_the_state_and_bounds_a_predictive_codec(
    tmp_path: pathlib.Path,
) -> None:
    """``benchmarks/checkpoint_fp32_bytes.py --quick``: each third of an AdamW fp32 state saved on its own by the real
    Checkpointer (restored bit for bit), and the least-squares bound on what an Adam-aware codec could save."""
    out_json = tmp_path / "fp32.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT.with_name("checkpoint_fp32_bytes.py")),
            "--quick",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-2000:]
    assert "restore bit-exact: yes" in proc.stdout
    doc = json.loads(out_json.read_text())
    rows = doc["rows"]
    assert set(rows) == {"parameters", "exp_avg", "exp_avg_sq"}
    for kind, r in rows.items():
        assert r["exact"] == 1.0 and 0.5 < r["full"] < 1.0 and 0.0 < r["delta"] < 1.0, (kind, r)
    # the parameters and the second moment gain from their base; the first moment, renewed by 10 steps of
    # gradients (beta1 ** 10 = 0.35), does not
    assert rows["parameters"]["delta"] < 0.9 * rows["parameters"]["full"]
    assert rows["exp_avg"]["delta"] > 0.97 * rows["exp_avg"]["full"]
    for p in doc["predict"].values():
        assert 0.0 <= p["r2"] <= 1.0 and p["bits_saved"] >= 0.0
    assert doc["best_delta"] <= doc["delta_all"]
