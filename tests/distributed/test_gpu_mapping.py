"""Which GPU each rank sees and uses: torchrun's indexing by default (local rank k's GPU is ``cuda:k``).

Pure functions over :func:`plan_ranks` (several nodes, 1 and 2 GPUs per worker, fractional, mixed), then the
real thing on a local Ray with logical GPUs (a CPU-only torch: CUDA_VISIBLE_DEVICES and LOCAL_RANK per rank,
and the device each rank would use). That needs a Ray with GPUs, so it runs in a subprocess.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest

from gpu_notebook.distributed import WorkerGroup, plan_ranks


def meta(node, ip, gpus=()):
    return {"node_id": node, "ip": ip, "gpu_ids": list(gpus)}


def layout(plans):
    return [(p.node_rank, p.local_rank, p.cuda_visible_devices, p.device_indices) for p in plans]


def test_one_gpu_per_worker_on_several_nodes_local_rank_k_is_device_k():
    metas = [
        meta("b", "10.0.0.2", ["1"]),
        meta("a", "10.0.0.1", ["3"]),
        meta("b", "10.0.0.2", ["0"]),
        meta("a", "10.0.0.1", ["2"]),
        meta("a", "10.0.0.1", ["0"]),
    ]
    plans = plan_ranks(metas, driver_ip="10.0.0.1")
    assert layout(plans) == [
        (0, 0, "0,2,3", (0,)),
        (0, 1, "0,2,3", (1,)),
        (0, 2, "0,2,3", (2,)),
        (1, 0, "0,1", (0,)),
        (1, 1, "0,1", (1,)),
    ]
    assert all(p.device_index == p.local_rank for p in plans)  # cuda:LOCAL_RANK, as under torchrun


def test_local_rank_k_is_device_k_whatever_gpu_ids_ray_hands_out():
    for ids in itertools.permutations(["0", "1", "5", "7"]):
        plans = plan_ranks([meta("n", "x", [g]) for g in ids])
        assert [p.device_index for p in plans] == [p.local_rank for p in plans] == [0, 1, 2, 3]
        assert {p.cuda_visible_devices for p in plans} == {"0,1,5,7"}
        for p in plans:  # the device is the rank's own GPU
            assert p.cuda_visible_devices.split(",")[p.device_index] == p.gpu_ids[0]


def test_g_gpus_per_worker_are_devices_k_times_g_onwards():
    metas = [meta("n", "x", ["1", "3"]), meta("n", "x", ["2", "0"]), meta("m", "y", ["6", "7"])]
    plans = plan_ranks(metas, driver_ip="x")
    # Ray gave rank 0 GPUs 0 and 2 and rank 1 GPUs 1 and 3: still devices 0-1 and 2-3
    assert layout(plans) == [(0, 0, "0,2,1,3", (0, 1)), (0, 1, "0,2,1,3", (2, 3)), (1, 0, "6,7", (0, 1))]
    assert [p.device_index for p in plans] == [0, 2, 0]  # current device: k*G
    contiguous = plan_ranks([meta("n", "x", ["2", "3"]), meta("n", "x", ["0", "1"])])
    assert layout(contiguous) == [(0, 0, "0,1,2,3", (0, 1)), (0, 1, "0,1,2,3", (2, 3))]


def test_fractional_gpus_share_a_device_seen_once():
    # four workers at 0.5 GPU: two on GPU 0, two on GPU 1
    plans = plan_ranks([meta("n", "x", [g]) for g in ("1", "0", "1", "0")])
    assert [p.gpu_ids for p in plans] == [("0",), ("0",), ("1",), ("1",)]  # sharers are neighbours
    assert layout(plans) == [
        (0, 0, "0,1", (0,)),
        (0, 1, "0,1", (0,)),
        (0, 2, "0,1", (1,)),
        (0, 3, "0,1", (1,)),
    ]


def test_ranks_without_gpus_come_last_and_leave_visibility_alone():
    plans = plan_ranks([meta("n", "x"), meta("n", "x", ["4"]), meta("n", "x", ["2"])])
    assert layout(plans) == [(0, 0, "2,4", (0,)), (0, 1, "2,4", (1,)), (0, 2, None, ())]
    assert plans[2].device_index == 0  # no GPU: nothing to use, the field stays a valid int


def test_own_visibility_shows_each_rank_only_its_gpus_as_device_0_onwards():
    metas = [meta("n", "x", ["3", "1"]), meta("n", "x", ["0", "2"]), meta("n", "x", ["5"])]
    plans = plan_ranks(metas, gpu_visibility="own")
    assert layout(plans) == [(0, 0, "0,2", (0, 1)), (0, 1, "1,3", (0, 1)), (0, 2, "5", (0,))]


@pytest.mark.parametrize("value", ["all", "torchrun", ""])
def test_unknown_visibilities_are_refused_before_any_worker_starts(value):
    with pytest.raises(ValueError, match="'node', 'own'"):
        plan_ranks([meta("n", "x")], gpu_visibility=value)
    with pytest.raises(ValueError, match="gpu_visibility"):
        WorkerGroup(1, gpu_visibility=value)


def test_the_default_is_node_everywhere():
    import inspect

    from gpu_notebook import Cluster, Runtime

    for fn in (plan_ranks, WorkerGroup, Runtime):
        assert inspect.signature(fn).parameters["gpu_visibility"].default == "node", fn
    assert Cluster().settings.runtime.gpu_visibility == "node"  # Cluster's keywords map onto Runtime


# ---- on a local Ray with logical GPUs ----------------------------------------------------------------------------
SCRIPT = textwrap.dedent(
    """
    import json, socket, tempfile
    from ray.cluster_utils import Cluster as RayTestCluster
    from gpu_notebook import Cluster

    def free_port():
        with socket.socket() as s:
            s.bind(("", 0))
            return s.getsockname()[1]

    rc = RayTestCluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "num_gpus": 4, "include_dashboard": False, "dashboard_agent_listen_port": free_port(),
        "temp_dir": tempfile.mkdtemp(prefix="gnbg", dir="/tmp")})
    CELL = ("import os\\n(os.environ['LOCAL_RANK'], os.environ.get('CUDA_VISIBLE_DEVICES'), str(device), "
            "[str(d) for d in devices], os.environ.get('ACCELERATE_TORCH_DEVICE'))")
    out = {}
    for name, workers, gpus, visibility in [("one", 4, 1, "node"), ("two", 2, 2, "node"),
                                            ("half", 2, 0.5, "node"), ("own", 2, 1, "own")]:
        c = Cluster(address=rc.address, workers=workers, cpus_per_worker=0.25, gpus_per_worker=gpus,
                    gpu_visibility=visibility)
        c.start(progress=lambda msg: None)
        ranks = list(c.run(CELL, stream=False).values)
        plans = [[list(p.gpu_ids), list(p.device_indices)] for p in c.group.plans]
        out[name] = {"ranks": ranks, "plans": plans, "backend": c.group.backend}
        c.stop()
    rc.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


@pytest.mark.timeout(400)
def test_logical_gpus_on_a_local_ray():
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    env.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses logical GPUs when it is set
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=380
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])

    # one GPU per worker: every rank sees the node's four, and its own GPU is cuda:LOCAL_RANK
    one = out["one"]
    assert [r[0] for r in one["ranks"]] == ["0", "1", "2", "3"]
    assert {r[1] for r in one["ranks"]} == {"0,1,2,3"}
    assert [idx for _, idx in one["plans"]] == [[0], [1], [2], [3]]
    for (_, visible, *_rest), (own, idx) in zip(one["ranks"], one["plans"], strict=True):
        assert visible.split(",")[idx[0]] == own[0]
    # a CPU-only torch: the device is the CPU (CUDA cannot run), and gloo, as explain_backend says
    assert {(r[2], r[4]) for r in one["ranks"]} == {("cpu", None)} and one["backend"] == "gloo"

    two = out["two"]
    assert {r[1] for r in two["ranks"]} == {"0,1,2,3"}
    assert [idx for _, idx in two["plans"]] == [[0, 1], [2, 3]]

    half = out["half"]  # ranks sharing a GPU: their device is its place in the node's list
    assert [r[0] for r in half["ranks"]] == ["0", "1"]
    visible = half["ranks"][0][1].split(",")
    assert {r[1] for r in half["ranks"]} == {",".join(visible)} and len(visible) < 4
    for own, idx in half["plans"]:
        assert visible[idx[0]] == own[0]

    own = out["own"]  # each rank sees only its GPU, as cuda:0, while LOCAL_RANK stays 0..N-1
    assert [r[0] for r in own["ranks"]] == ["0", "1"]
    assert [r[1] for r in own["ranks"]] == [g[0] for g, _ in own["plans"]]
    assert [idx for _, idx in own["plans"]] == [[0], [0]]
