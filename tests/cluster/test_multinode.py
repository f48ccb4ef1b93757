"""Several raylets on this machine with logical GPUs (ray.cluster_utils.Cluster): rank placement by node,
per-rank GPU visibility, and recovery from a lost node. Runs in a subprocess: it needs its own Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(420)

SCRIPT = textwrap.dedent(
    """
    import json, sys, tempfile
    from ray.cluster_utils import Cluster as RayTestCluster
    from gpu_notebook import Cluster
    from gpu_notebook.distributed import GroupTimeouts, DistributedError

    rc = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0,
                        "include_dashboard": False, "temp_dir": tempfile.mkdtemp(prefix="gnbm", dir="/tmp")})
    workers = [rc.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]
    rc.wait_for_nodes()
    out = {}
    c = Cluster(address=rc.address, workers=2, cpus_per_worker=0.5, gpus_per_worker=1, backend="gloo",
                timeouts=GroupTimeouts(placement=15))
    c.start(progress=print)
    res = c.run("import os, ray\\n(rank, os.environ['LOCAL_RANK'], os.environ['NODE_RANK'], "
                "os.environ.get('CUDA_VISIBLE_DEVICES'), ray.get_runtime_context().get_node_id())", stream=False)
    out["layout"] = list(res.values)
    out["status_nodes"] = len({w.node_id for w in c.status().workers})
    # lose the node that holds rank 1
    lost = [n for n in workers if n.node_id == out["layout"][1][4]][0]
    rc.remove_node(lost)
    res = c.run("import time\\nprint('training', rank, flush=True)\\ntime.sleep(30)", stream=False)
    out["failures"] = [(f.rank, f.kind) for f in res.failures]
    out["note"] = res.note
    out["scale"] = c.scale(1)
    res = c.run("import torch.distributed as dist\\ndist.get_world_size()", stream=False)
    out["after"] = list(res.values)
    c.stop()
    rc.shutdown()
    print("RESULT " + json.dumps(out))
    """
)


def test_ranks_by_node_gpu_visibility_and_node_loss():
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=400
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    layout = out["layout"]
    assert [row[0] for row in layout] == [0, 1]
    assert [row[1] for row in layout] == ["0", "0"]  # one worker per node: local rank 0 on each
    assert sorted(row[2] for row in layout) == ["0", "1"]  # node ranks
    assert layout[0][4] != layout[1][4] and out["status_nodes"] == 2
    assert all(
        row[3] is not None and row[3].isdigit() for row in layout
    )  # each sees only its own (logical) GPU
    assert (1, "died") in [tuple(f) for f in out["failures"]]
    assert "Rebuilding the group failed" in out["note"] and "%gpu_cluster scale 2" in out["note"]
    assert "scaled" in out["scale"] and out["after"] == [1]
