"""The doctor and the benchmarks through the lead's Cluster on the session's real local Ray (CPU, gloo)."""

from __future__ import annotations

import pytest

from gpu_notebook.doctor import bench_allreduce, bench_scaling, diagnose


@pytest.mark.slow
def test_doctor_on_ray_cluster_reports_no_gpu_cleanly(shared) -> None:
    report = diagnose(shared)
    assert report.errors == [], report.text()
    assert len(report.facts) == shared.world_size == 2
    assert sorted(f["rank"] for f in report.facts) == [0, 1]
    for check in ("cuda-driver", "gpu-arch", "gpu-health"):
        found = report.by_check(check)
        assert found and all(f.level == "OK" and "no GPU" in f.message for f in found), check
    assert [f.level for f in report.by_check("gpu-assignment")] == ["OK", "OK"]
    assert {f.rank for f in report.by_check("master-port") if f.level == "OK"} == {0, 1}
    assert report.by_check("peer-ports") and all(f.level == "OK" for f in report.by_check("peer-ports"))
    versions = report.by_check("versions")
    assert versions and all(f.level == "OK" for f in versions)
    assert all(f["probe_errors"] == {} for f in report.facts)
    assert "no GPU" in report._repr_html_()


@pytest.mark.slow
def test_allreduce_bench_on_ray_cluster(shared) -> None:
    res = bench_allreduce(shared, max_bytes=4096, iters=2, warmup=1, link_bytes=4096)
    assert res.world_size == 2 and res.backend == "gloo"
    assert [r["bytes"] for r in res.rows] == [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    assert res.wrong == 0
    assert all(r["busbw"] == pytest.approx(r["algbw"]) for r in res.rows)  # n=2: factor 2(n-1)/n = 1
    assert [p["ranks"] for p in res.pairs] == [[0, 1]] and res.pairs[0]["bytes"] == 4096


@pytest.mark.slow
def test_scaling_on_ray_cluster(shared) -> None:
    res = bench_scaling(shared, steps=2, warmup_steps=1)
    assert [r["workers"] for r in res.rows] == [1, 2]
    assert res.rows[1]["efficiency"] == pytest.approx(res.rows[1]["speedup"] / 2)
