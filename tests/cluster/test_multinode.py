"""Several raylets on this machine with logical GPUs (``ray.cluster_utils.Cluster``: a head and two "GPU nodes"),
shared by two journeys in one subprocess (it needs its own Ray, whose start is the slow part):

* the lead's ``Cluster(cloud="aws")`` end to end, offline: launch against moto with recorded SSH, the worker group
  on the local multi-node Ray standing in for the cloud head, then ``stop`` ending in a verified teardown;
* a cloud cluster whose budget runs out: priced from the catalog, stopped, torn down (no second teardown);
* then rank placement by node, per-rank GPU visibility, and recovery from a lost node (last: it removes a node).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("moto")
pytestmark = pytest.mark.timeout(420)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile, time
    from ray.cluster_utils import Cluster as RayTestCluster
    from gpu_notebook import Cluster
    from gpu_notebook.cloud import CloudLauncher, list_states
    from gpu_notebook.cloud import _ray_compat as rc
    from gpu_notebook.distributed import GroupTimeouts
    from gpu_notebook.testing.cloud import MotoEC2, RecordingProcessRunner
    from gpu_notebook.cloud._verify import aws_leftovers

    fake = RayTestCluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "include_dashboard": False,
        "temp_dir": tempfile.mkdtemp(prefix="gnbc", dir="/tmp")})
    gpu_nodes = [fake.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]  # one logical GPU each
    fake.wait_for_nodes()

    # 1) the cloud journey
    real_launch = CloudLauncher.launch

    def launch(self, spec, progress=None, **kw):
        spec.connect = "direct"  # no ssh tunnel to a fake head
        state = real_launch(self, spec, progress=progress, wait_for_workers_s=0)
        # the head that moto "created" cannot run Ray: connect to the local multi-node cluster instead
        state.client_address, state.address = None, fake.address
        return state

    CloudLauncher.launch = launch
    rec = RecordingProcessRunner()
    cloud = {}
    with MotoEC2("us-east-1"), rc.fast_launcher(), rc.substitute_process_runner(rec):
        c = Cluster(cloud="aws", region="us-east-1", gpu="T4:1", workers=2, cpus_per_worker=0.5,
                    gpus_per_worker=1, backend="gloo")
        c.start(progress=lambda m: print("PROGRESS", m, flush=True))
        cloud["name"] = c.name
        cloud["running"] = [x["kind"] for x in aws_leftovers(c.name, "us-east-1")]
        res = c.run("import os, ray\\n(rank, os.environ.get('CUDA_VISIBLE_DEVICES'), "
                    "ray.get_runtime_context().get_node_id())", stream=False)
        cloud["layout"] = [list(v) for v in res.values]
        cloud["head_cmds"] = len(rec.matching("ray start --head"))
        cloud["saved"] = [s.name for s in list_states()]
        reaper = c._reaper
        cloud["reaper_alive"] = reaper is not None and reaper.alive
        cloud["stop"] = c.stop()
        from gpu_notebook.cloud._reaper import lease_path, log_path
        cloud["reaper_after"] = [reaper.alive, lease_path(c.name).exists(), log_path(c.name).read_text()]
        cloud["after"] = aws_leftovers(c.name, "us-east-1")
        cloud["saved_after"] = [s.name for s in list_states()]

        # 1b) a budget that runs out on a cloud cluster: priced from the catalog, stopped, torn down, verified
        from gpu_notebook.cost import cost_meter_for, watcher_for

        c = Cluster(name="gnb-budget", cloud="aws", region="us-east-1", gpu="T4:1", workers=1,
                    cpus_per_worker=0.5, gpus_per_worker=1, backend="gloo", budget=0.0001)
        c.start(progress=lambda m: None)
        meter = cost_meter_for(c)
        snap = meter.snapshot()
        budget = {"rate": snap.usd_per_hour, "labels": sorted(n["label"] for n in snap.nodes)}
        deadline = time.monotonic() + 20
        while meter.spent() <= 0.0001 and time.monotonic() < deadline:
            time.sleep(0.2)
        budget["spent"] = meter.spent()
        w = watcher_for(c)
        budget["tick"] = w.tick()  # what the watcher thread does every 10 s (it may have done it already)
        budget["policy"] = [p.message for p in w.policies]
        budget["spent_after"] = meter.spent()
        budget["state"] = c.state
        budget["left"] = [x["kind"] for x in aws_leftovers(c.name, "us-east-1")]
        budget["saved"] = [s.name for s in list_states()]
        time.sleep(0.5)
        budget["lease"] = lease_path(c.name).exists()
        budget["reaper_log"] = log_path(c.name).read_text() if log_path(c.name).exists() else ""
        if c.state == "running":  # the budget did not stop it: clean up, then report
            c.stop()

    # 2) placement by node and the loss of a node, on the same raylets
    multi = {}
    c = Cluster(address=fake.address, workers=2, cpus_per_worker=0.5, gpus_per_worker=1, backend="gloo",
                timeouts=GroupTimeouts(placement=15))
    c.start(progress=print)
    res = c.run("import os, ray\\n(rank, os.environ['LOCAL_RANK'], os.environ['NODE_RANK'], "
                "os.environ.get('CUDA_VISIBLE_DEVICES'), ray.get_runtime_context().get_node_id())", stream=False)
    multi["layout"] = list(res.values)
    multi["status_nodes"] = len({w.node_id for w in c.status().workers})
    lost = [n for n in gpu_nodes if n.node_id == multi["layout"][1][4]][0]  # the node that holds rank 1
    fake.remove_node(lost)
    res = c.run("import time\\nprint('training', rank, flush=True)\\ntime.sleep(30)", stream=False)
    multi["failures"] = [(f.rank, f.kind) for f in res.failures]
    multi["note"] = res.note
    multi["scale"] = c.scale(1)
    res = c.run("import torch.distributed as dist\\ndist.get_world_size()", stream=False)
    multi["after"] = list(res.values)
    c.stop()
    fake.shutdown()
    print("RESULT " + json.dumps({"cloud": cloud, "budget": budget, "multinode": multi}), flush=True)
    """
)


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[str]]:
    tmp_path: Path = tmp_path_factory.mktemp("multinode")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rsync = bin_dir / "rsync"  # the launcher checks that rsync exists; the recorder runs it
    rsync.write_text("#!/bin/sh\nexit 0\n")
    rsync.chmod(0o755)
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "GPU_NOTEBOOK_CONFIG_DIR": str(tmp_path / "cfg"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # set by the session's own Ray (ray_session): the test cluster's GCS then never starts
    env.pop("RAY_AUTH_MODE", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    progress = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROGRESS")]
    return json.loads(lines[-1][len("RESULT ") :]), progress


def test_cloud_cluster_start_run_stop(result: tuple[dict[str, Any], list[str]]) -> None:
    out, progress = result[0]["cloud"], result[1]
    assert any("launching head" in p for p in progress) and any("starting Ray" in p for p in progress)
    assert out["running"].count("instance") == 1  # the head the launcher created in (fake) EC2
    assert out["head_cmds"] == 1
    assert out["saved"] == [out["name"]]
    ranks = sorted(r[0] for r in out["layout"])
    assert ranks == [0, 1]
    assert len({r[2] for r in out["layout"]}) == 2  # one rank per GPU node
    assert all(r[1] == "0" for r in out["layout"])  # each rank sees its node's one GPU
    assert "nothing tagged" in out["stop"] and "left" in out["stop"]
    assert out["after"] == [] and out["saved_after"] == []
    # the reaper watched while the cluster ran; a normal stop released it and it ended without a second teardown
    assert out["reaper_alive"] is True
    alive, lease, log = out["reaper_after"]
    assert alive is False and lease is False and "released" in log and "tearing it down" not in log


def test_ranks_by_node_gpu_visibility_and_node_loss(result: tuple[dict[str, Any], list[str]]) -> None:
    out = result[0]["multinode"]
    layout = out["layout"]
    assert [row[0] for row in layout] == [0, 1]
    assert [row[1] for row in layout] == ["0", "0"]  # one worker per node: local rank 0 on each
    assert sorted(row[2] for row in layout) == ["0", "1"]  # node ranks
    assert layout[0][4] != layout[1][4] and out["status_nodes"] == 2
    assert all(row[3] is not None and row[3].isdigit() for row in layout)  # each sees only its own GPU
    assert (1, "died") in [tuple(f) for f in out["failures"]]
    assert "Rebuilding the group failed" in out["note"] and "%gpu_cluster scale 2" in out["note"]
    assert "scaled" in out["scale"] and out["after"] == [1]


def test_budget_on_a_cloud_cluster_prices_its_instances_and_stops_it(
    result: tuple[dict[str, Any], list[str]],
) -> None:
    out = result[0]["budget"]
    # head m5.xlarge (0.192 USD/h) + the cluster's two GPU nodes as g4dn.xlarge on demand, from the catalog
    g4dn, m5 = "aws g4dn.xlarge us-east-1 on-demand", "aws m5.xlarge us-east-1 on-demand"
    assert out["labels"] == [g4dn, g4dn, m5]
    assert out["rate"] == pytest.approx(0.192 + 2 * 0.526, rel=0.01)
    assert out["spent"] > 0.0001
    assert out["state"] == "stopped"  # the budget stop ran ...
    assert any(
        m.startswith("budget of $0.00 reached") and m.endswith("workers stopped")
        for m in out["tick"] + out["policy"]
    ), out
    assert out["spent_after"] > 0.0001  # ... and the cost shown is not $0
    assert out["left"] == [] and out["saved"] == []  # ... ending in a verified teardown
    assert out["lease"] is False and "released" in out["reaper_log"]
    assert "tearing it down" not in out["reaper_log"]  # the reaper did not tear down a second time
