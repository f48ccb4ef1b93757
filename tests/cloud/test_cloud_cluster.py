"""The lead's Cluster with ``cloud="aws"`` end to end, offline: launch against moto with recorded SSH, then the
worker group on a local multi-node Ray with logical GPUs standing in for the cloud head, then ``stop`` ending in
a verified teardown. Runs in a subprocess: it needs its own Ray."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("moto")
pytestmark = pytest.mark.timeout(300)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, tempfile
    from ray.cluster_utils import Cluster as RayTestCluster
    from gpu_notebook.cloud import CloudLauncher, list_states
    from gpu_notebook.cloud import _ray_compat as rc
    from gpu_notebook.testing.cloud import MotoEC2, RecordingProcessRunner
    from gpu_notebook.cloud._verify import aws_leftovers

    fake = RayTestCluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "include_dashboard": False,
        "temp_dir": tempfile.mkdtemp(prefix="gnbc", dir="/tmp")})
    for _ in range(2):
        fake.add_node(num_cpus=1, num_gpus=1)   # two "GPU nodes" with one logical GPU each
    fake.wait_for_nodes()

    real_launch = CloudLauncher.launch

    def launch(self, spec, progress=None, **kw):
        spec.connect = "direct"  # no ssh tunnel to a fake head
        state = real_launch(self, spec, progress=progress, wait_for_workers_s=0)
        # the head that moto "created" cannot run Ray: connect to the local multi-node cluster instead
        state.client_address, state.address = None, fake.address
        return state

    CloudLauncher.launch = launch
    rec = RecordingProcessRunner()
    out = {}
    with MotoEC2("us-east-1"), rc.fast_launcher(), rc.substitute_process_runner(rec):
        from gpu_notebook import Cluster

        c = Cluster(cloud="aws", region="us-east-1", gpu="T4:1", workers=2, cpus_per_worker=0.5,
                    gpus_per_worker=1, backend="gloo")
        c.start(progress=lambda m: print("PROGRESS", m, flush=True))
        out["name"] = c.name
        out["running"] = [x["kind"] for x in aws_leftovers(c.name, "us-east-1")]
        res = c.run("import os, ray\\n(rank, os.environ.get('CUDA_VISIBLE_DEVICES'), "
                    "ray.get_runtime_context().get_node_id())", stream=False)
        out["layout"] = [list(v) for v in res.values]
        out["head_cmds"] = len(rec.matching("ray start --head"))
        out["saved"] = [s.name for s in list_states()]
        reaper = c._reaper
        out["reaper_alive"] = reaper is not None and reaper.alive
        out["stop"] = c.stop()
        from gpu_notebook.cloud._reaper import lease_path, log_path
        out["reaper_after"] = [reaper.alive, lease_path(c.name).exists(), log_path(c.name).read_text()]
        out["after"] = aws_leftovers(c.name, "us-east-1")
        out["saved_after"] = [s.name for s in list_states()]
    fake.shutdown()
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_cloud_cluster_start_run_stop(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rsync = bin_dir / "rsync"  # the launcher checks that rsync exists; the recorder runs it
    rsync.write_text("#!/bin/sh\nexit 0\n")
    rsync.chmod(0o755)
    import os

    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "GPU_NOTEBOOK_CONFIG_DIR": str(tmp_path / "cfg"),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop(
        "RAY_AUTH_MODE", None
    )  # set by the session's own Ray (ray_session): the test cluster's GCS then never starts
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    progress = [ln for ln in proc.stdout.splitlines() if ln.startswith("PROGRESS")]
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
