"""All-reduce and scaling benchmarks on a real local 2-rank gloo group (spawned processes, no Ray)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_notebook.doctor import (
    BenchResult,
    LocalGroup,
    algbw_gbps,
    allreduce_bench,
    bench_allreduce,
    bench_scaling,
    busbw_gbps,
    diagnose,
    message_sizes,
    parse_size,
)
from gpu_notebook.doctor._bench import choose_pairs, combine, find_slow_links
from gpu_notebook.doctor._scaling import scaling_rows, scaling_sizes


@pytest.fixture(scope="module")
def group():
    with LocalGroup(2, "gloo") as g:
        yield g


def _sabotaged_bench(**kwargs: Any) -> dict[str, Any]:
    """allreduce_bench with rank 1's all_reduce corrupting one element: the check must see it."""
    import torch.distributed as dist

    real = dist.all_reduce

    def bad(tensor: Any, *a: Any, **kw: Any) -> Any:
        out = real(tensor, *a, **kw)
        if dist.get_rank() == 1:
            tensor[0] += 1
        return out

    dist.all_reduce = bad
    try:
        return allreduce_bench(**kwargs)
    finally:
        dist.all_reduce = real


def _fail_on_rank1() -> int:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("boom on rank 1")
    return dist.get_rank()


def test_message_sizes_like_all_reduce_perf() -> None:
    sizes = message_sizes(8, 128 * 2**20, 2, 4)
    assert sizes[0] == (8, 2) and sizes[-1] == (128 * 2**20, 32 * 2**20)
    assert len(sizes) == 25  # 8 B .. 128 MiB, doubling
    assert message_sizes(1, 8, 2, 4) == [(4, 1), (8, 2)]
    assert message_sizes(8, 64, 4, 2) == [(8, 4), (32, 16)]
    with pytest.raises(ValueError):
        message_sizes(8, 64, 1)


def test_busbw_known_value() -> None:
    # 128 MiB in 1 ms: algbw 134.217728 GB/s; on 8 ranks busbw = algbw * 2*7/8 = 234.881024 GB/s
    alg = algbw_gbps(128 * 2**20, 1e-3)
    assert alg == pytest.approx(134.217728)
    assert busbw_gbps(alg, 8) == pytest.approx(234.881024)
    assert busbw_gbps(alg, 2) == pytest.approx(alg)
    assert busbw_gbps(alg, 1) == 0.0


def test_allreduce_bench_on_real_gloo_group(group: LocalGroup) -> None:
    res = bench_allreduce(group, min_bytes=8, max_bytes=64 * 2**10, iters=3, warmup=1)
    assert isinstance(res, BenchResult)
    assert (res.world_size, res.backend, res.dtype) == (2, "gloo", "float32")
    assert [r["bytes"] for r in res.rows] == [2**k for k in range(3, 17)]
    assert [r["count"] for r in res.rows] == [2**k // 4 for k in range(3, 17)]
    assert all(r["type"] == "float" and r["redop"] == "sum" for r in res.rows)
    assert res.wrong == 0
    for r in res.rows:
        assert r["time_us"] > 0 and len(r["time_us_per_rank"]) == 2
        assert r["algbw"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw"] == pytest.approx(r["algbw"] * 2 * (2 - 1) / 2)
    assert res.pair_mode == "rank" and [p["ranks"] for p in res.pairs] == [[0, 1]]
    assert res.pairs[0]["bytes"] == 4 * 2**20 and res.slow == []
    table = res.table()
    assert "# Avg bus bandwidth" in table and "Out of bounds values : 0 OK" in table
    assert table.count("\n  ") == len(res.rows)
    assert "<table" in res._repr_html_() and "busbw" in res._repr_html_()
    fig = res.figure()
    assert list(fig.data[0].x) == [r["bytes"] for r in res.rows]
    assert fig.layout.xaxis.type == "log"


def test_allreduce_bench_half_precision(group: LocalGroup) -> None:
    per_rank = group.call(allreduce_bench, min_bytes=2, max_bytes=1024, iters=1, warmup=0, dtype="float16")
    n, backend, dtype, rows = combine(per_rank)
    assert rows[0]["bytes"] == 2 and rows[0]["count"] == 1 and rows[0]["type"] == "half"
    assert sum(r["wrong"] for r in rows) == 0


def test_correctness_check_catches_wrong_results(group: LocalGroup) -> None:
    per_rank = group.call(_sabotaged_bench, min_bytes=8, max_bytes=64, iters=1, warmup=0)
    n, backend, dtype, rows = combine(per_rank)
    assert [r["wrong"] for r in rows] == [1, 1, 1, 1]  # rank 1's element 0, every size
    res = BenchResult(n, backend, dtype, rows)
    assert res.wrong == 4 and "wrong result elements" in res.flags()[0]
    assert "FAILED" in res.table()


def test_scaling_on_real_gloo_group(group: LocalGroup) -> None:
    res = bench_scaling(group, steps=3, warmup_steps=1)
    assert res.backend == "gloo" and [r["workers"] for r in res.rows] == [1, 2]
    assert res.rows[0]["speedup"] == pytest.approx(1.0) and res.rows[0]["efficiency"] == pytest.approx(1.0)
    two = res.rows[1]
    assert two["throughput"] > 0
    assert two["speedup"] == pytest.approx(two["throughput"] / res.rows[0]["throughput"])
    assert two["efficiency"] == pytest.approx(two["speedup"] / 2)
    assert "reference: 8 x A100 at 7.8x = 97.5% efficiency" in res.table()
    assert res.reference_efficiency == pytest.approx(0.975)
    assert "<table" in res._repr_html_()
    assert len(res.figure().data) == 3


def test_doctor_on_local_group_reports_no_gpu_cleanly(group: LocalGroup) -> None:
    report = diagnose(group)
    assert report.errors == []
    assert {f.rank for f in report.by_check("master-port")} == {0, 1}
    assert all(f.level == "OK" for f in report.by_check("peer-ports")) and report.by_check("peer-ports")
    for check in ("cuda-driver", "gpu-arch", "gpu-health"):
        assert report.by_check(check) and all("no GPU" in f.message for f in report.by_check(check))
    assert len(report.facts) == 2 and {f["rank"] for f in report.facts} == {0, 1}


def test_local_group_reports_rank_errors(group: LocalGroup) -> None:
    with pytest.raises(RuntimeError, match=r"failed on ranks \[1\]") as info:
        group.call(_fail_on_rank1)
    assert "boom on rank 1" in str(info.value)
    assert group.call(_rank) == [0, 1]  # the group still works after an error


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank()


def test_choose_pairs() -> None:
    assert choose_pairs({0: "a", 1: "a"}) == ("rank", [[0, 1]])
    mode, pairs = choose_pairs({0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"})
    assert mode == "node" and pairs == [[0, 2], [0, 4], [2, 4]]
    mode, pairs = choose_pairs({r: f"n{r}" for r in range(10)}, max_pairs=28)
    assert len(pairs) == 10 and pairs[-1] == [9, 0]  # 45 pairs > 28: a ring
    assert choose_pairs({0: "a"}) == ("rank", [])


def test_find_slow_links() -> None:
    names = ["n0", "n1", "n2", "n3"]
    bw = {(a, b): 20.0 for i, a in enumerate(names) for b in names[i + 1 :]}
    assert find_slow_links(bw) == []
    for pair in bw:
        if "n3" in pair:
            bw[pair] = 2.0
    assert find_slow_links(bw) == ["n3"]
    assert find_slow_links({("a", "b"): 1.0}) == []  # two ends: cannot tell which is slow


def test_scaling_helpers() -> None:
    assert scaling_sizes(4) == [1, 2, 3, 4]
    assert scaling_sizes(12) == [1, 2, 4, 8, 12]
    rows = scaling_rows(
        [
            [
                {"workers": 1, "elapsed": 1.0, "samples": 100, "steps": 10},
                {"workers": 2, "elapsed": 1.0, "samples": 100, "steps": 10},
            ],
            [{"workers": 2, "elapsed": 1.25, "samples": 100, "steps": 10}],
        ]
    )
    assert rows[0]["throughput"] == 100 and rows[1]["throughput"] == pytest.approx(160)
    assert rows[1]["speedup"] == pytest.approx(1.6) and rows[1]["efficiency"] == pytest.approx(0.8)


def test_parse_size() -> None:
    assert parse_size("128M") == 128 * 2**20
    assert parse_size("8") == 8 and parse_size(8) == 8
    assert parse_size("64k") == 65536 and parse_size("1G") == 2**30 and parse_size("4MB") == 4 * 2**20
    with pytest.raises(ValueError):
        parse_size("lots")
    with pytest.raises(ValueError):
        parse_size("0")
