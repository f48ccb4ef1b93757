"""Pure rank-layout functions: node ordering, local ranks, GPU visibility, rank selections."""

import pytest

from gpu_notebook.distributed import choose_backend, format_ranks, parse_ranks, plan_ranks


def meta(node, ip, gpus=()):
    return {"node_id": node, "ip": ip, "gpu_ids": list(gpus)}


def test_ranks_are_grouped_by_node_with_the_driver_node_first():
    metas = [meta("b", "10.0.0.2"), meta("a", "10.0.0.1"), meta("b", "10.0.0.2"), meta("a", "10.0.0.1")]
    plans = plan_ranks(metas, driver_ip="10.0.0.2")
    assert [p.node_id for p in plans] == ["b", "b", "a", "a"]
    assert [p.rank for p in plans] == [0, 1, 2, 3]
    assert [p.local_rank for p in plans] == [0, 1, 0, 1]
    assert [p.node_rank for p in plans] == [0, 0, 1, 1]
    assert all(p.local_world_size == 2 for p in plans)
    assert sorted(p.actor_index for p in plans) == [0, 1, 2, 3]


def test_within_a_node_ranks_follow_gpu_ids_numerically():
    metas = [meta("n", "1.1.1.1", ["10"]), meta("n", "1.1.1.1", ["2"]), meta("n", "1.1.1.1", ["0"])]
    plans = plan_ranks(metas, driver_ip="1.1.1.1", gpu_visibility="own")
    assert [p.gpu_ids for p in plans] == [("0",), ("2",), ("10",)]
    # own: each rank sees only its GPU, as device 0
    assert [p.cuda_visible_devices for p in plans] == ["0", "2", "10"]
    assert {p.device_index for p in plans} == {0}


def test_node_visibility_is_the_default():
    metas = [meta("n", "1.1.1.1", ["10"]), meta("n", "1.1.1.1", ["2"]), meta("n", "1.1.1.1", ["0"])]
    plans = plan_ranks(metas, driver_ip="1.1.1.1")
    assert [p.cuda_visible_devices for p in plans] == ["0,2,10"] * 3
    assert [p.device_index for p in plans] == [0, 1, 2]


def test_node_visibility_gives_the_node_union_and_the_matching_device_index():
    metas = [meta("n", "1.1.1.1", ["3"]), meta("n", "1.1.1.1", ["1"]), meta("m", "1.1.1.2", ["0"])]
    plans = plan_ranks(metas, driver_ip="1.1.1.1", gpu_visibility="node")
    assert [p.cuda_visible_devices for p in plans] == ["1,3", "1,3", "0"]
    assert [p.device_index for p in plans] == [0, 1, 0]
    assert [p.local_rank for p in plans] == [0, 1, 0]


def test_cpu_workers_leave_cuda_visible_devices_alone_and_use_gloo():
    plans = plan_ranks([meta("n", "x"), meta("n", "x")])
    assert all(p.cuda_visible_devices is None for p in plans)
    assert choose_backend(plans, cuda_available=True) == "gloo"
    gpu_plans = plan_ranks([meta("n", "x", ["0"]), meta("n", "x", ["1"])])
    assert choose_backend(gpu_plans, cuda_available=True) == "nccl"
    assert choose_backend(gpu_plans, cuda_available=False) == "gloo"


def test_bad_gpu_visibility_is_refused():
    with pytest.raises(ValueError, match="gpu_visibility"):
        plan_ranks([meta("n", "x")], gpu_visibility="all")


@pytest.mark.parametrize(
    "spec,expected",
    [
        ("all", [0, 1, 2, 3]),
        (None, [0, 1, 2, 3]),
        ("0,2", [0, 2]),
        ("0-2", [0, 1, 2]),
        ("3,0-1", [0, 1, 3]),
        ([2, 1], [1, 2]),
    ],
)
def test_parse_ranks(spec, expected):
    assert parse_ranks(spec, 4) == expected


@pytest.mark.parametrize(
    "spec,msg", [("4", "out of range"), ("x", "bad rank selection"), ("3-1", "bad rank"), ("-1", "bad rank")]
)
def test_parse_ranks_errors_say_what_is_valid(spec, msg):
    with pytest.raises(ValueError, match=msg):
        parse_ranks(spec, 4)


def test_format_ranks_compacts_runs():
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert format_ranks([3]) == "3"
