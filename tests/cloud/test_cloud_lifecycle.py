"""A cloud cluster's life around the notebook, offline: launched with Ray's real launcher against moto's EC2 on
loopback (SSH recorded), then a kernel killed mid-start, a Ctrl-C while connecting, and a start refused because
this process already holds a Ray connection. (A budget that runs out on a cloud cluster is in
tests/cluster/test_multinode.py, on the multi-raylet Ray that stands in for the cloud head there.)

The "kernels" are subprocesses (each needs its own Ray connection, and one is SIGKILLed); they share this module's
moto server through the environment. The reaper they start runs Ray's real ``teardown_cluster`` with a stand-in
``ssh`` on PATH that records its command line (the nodes are moto's, there is nobody to ssh to)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("moto")
pytest.importorskip("boto3")

from gpu_notebook.cloud import CloudLauncher, list_states  # noqa: E402
from gpu_notebook.cloud import _ray_compat as rc  # noqa: E402
from gpu_notebook.cloud._verify import aws_leftovers  # noqa: E402
from gpu_notebook.testing.cloud import MotoEC2, RecordingProcessRunner  # noqa: E402

pytestmark = pytest.mark.timeout(150)
REGION = "us-east-1"

KERNEL = textwrap.dedent(
    """
    import json, sys, time
    from gpu_notebook.cloud import CloudLauncher
    from gpu_notebook.cloud import _ray_compat as rc
    from gpu_notebook.testing.cloud import RecordingProcessRunner
    from gpu_notebook.cluster import _connect

    scenario, name = sys.argv[1], sys.argv[2]
    real_launch = CloudLauncher.launch

    def launch(self, spec, progress=None, **kw):
        return real_launch(self, spec, progress=progress, wait_for_workers_s=0)

    CloudLauncher.launch = launch
    real_connect = _connect.connect

    def connect(address, **kw):
        reaper = getattr(c, "_reaper", None)
        print("CONNECTING", reaper.pid if reaper is not None else None, flush=True)
        if scenario == "hang":     # a slow ray:// connect, during which the kernel is restarted
            time.sleep(300)
        if scenario == "interrupt":
            raise KeyboardInterrupt  # Ctrl-C while connecting
        return real_connect(address, **kw)

    _connect.connect = connect
    out = {}
    with rc.fast_launcher(), rc.substitute_process_runner(RecordingProcessRunner()):
        from gpu_notebook import Cluster
        from gpu_notebook.cloud import list_states
        try:
            from gpu_notebook.cloud._reaper import lease_path, log_path
        except ImportError:  # a gpu_notebook without the reaper: report "no lease, no log"
            lease_path = log_path = lambda n: __import__("pathlib").Path("/nonexistent") / n
        from gpu_notebook.cloud._verify import aws_leftovers

        c = Cluster(name=name, cloud="aws", region="us-east-1", gpu="T4:1", workers=1, connect="direct",
                    cpus_per_worker=0.5, gpus_per_worker=1, backend="gloo")
        try:
            c.start(progress=lambda m: print("PROGRESS", m, flush=True))
        except KeyboardInterrupt:
            out["interrupted"] = True
        reaper = getattr(c, "_reaper", None)
        out["state"] = c.state
        out["tracked"] = c.cloud_state is not None
        out["lease"] = lease_path(name).exists()
        out["left"] = [x["kind"] for x in aws_leftovers(name, "us-east-1")]
        out["saved"] = [s.name for s in list_states()]
        time.sleep(0.5)
        out["reaper_log"] = log_path(name).read_text() if log_path(name).exists() else ""
        if c.state == "running":
            c.stop()
    print("RESULT " + json.dumps(out), flush=True)
    """
)


@pytest.fixture(scope="module")
def moto_ec2():
    with MotoEC2(REGION) as server:
        yield server


@pytest.fixture
def env(moto_ec2, tmp_path, monkeypatch):
    """A private HOME (Ray writes its ssh key there) and config folder, and PATH with stand-ins for ssh/rsync."""
    home, cfg, bin_dir = tmp_path / "home", tmp_path / "cfg", tmp_path / "bin"
    for d in (home, bin_dir):
        d.mkdir()
    ssh_log = tmp_path / "ssh.log"
    (bin_dir / "ssh").write_text(f'#!/bin/sh\necho "$@" >> {ssh_log}\nexit 0\n')
    (bin_dir / "rsync").write_text("#!/bin/sh\nexit 0\n")
    for tool in ("ssh", "rsync"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(cfg))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return {"cfg": cfg / "clusters", "ssh_log": ssh_log, "tmp": tmp_path}


def _kernel(env: dict, scenario: str, name: str) -> subprocess.Popen[str]:
    # RAY_AUTH_MODE is set by the session's own Ray (ray_session) when it runs: the kernel's test Ray must not get it
    kernel_env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    return subprocess.Popen(
        [sys.executable, "-c", KERNEL, scenario, name],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=env["tmp"],
        env=kernel_env,
    )


def _result(proc: subprocess.Popen[str], timeout: float = 120) -> dict:
    out, _ = proc.communicate(timeout=timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, out[-4000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_killed_kernel_leaves_no_instances_running(env):
    """SIGKILL (what a kernel restart ends with) while the kernel connects to its freshly launched cluster: the
    reaper runs ``ray down`` of the saved config and the cloud API then lists nothing."""
    name = "gnb-killed"
    proc = _kernel(env, "hang", name)
    reaper_pid = None
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("CONNECTING"):
                reaper_pid = None if line.split()[1] == "None" else int(line.split()[1])
                break
        else:
            raise AssertionError("".join(seen)[-4000:])
        assert [x["kind"] for x in aws_leftovers(name, REGION)].count("instance") == 1  # the head is up
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not aws_leftovers(name, REGION) and not list_states():
                break
            time.sleep(0.5)
        assert aws_leftovers(name, REGION) == [], "instances left running after the kernel died"
        assert list_states() == []  # a verified teardown removes the saved state
        assert reaper_pid is not None
        for _ in range(100):
            if _gone(reaper_pid):
                break
            time.sleep(0.1)
        assert _gone(reaper_pid)
        log = (env["cfg"] / f"{name}.reaper.log").read_text()
        assert "is gone" in log and f"did not stop cloud cluster {name}" in log and "teardown done" in log
        assert "ray stop" in env["ssh_log"].read_text()  # Ray's teardown_cluster ran (ray down)
        assert "testing" not in log  # the (fake) credentials are never logged
        assert not (env["cfg"] / f"{name}.reaper").exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if reaper_pid is not None and not _gone(reaper_pid):
            os.kill(reaper_pid, signal.SIGKILL)


def test_ctrl_c_while_connecting_tears_the_launched_cluster_down(env):
    out = _result(_kernel(env, "interrupt", "gnb-ctrlc"))
    assert out.get("interrupted") is True  # the KeyboardInterrupt still reaches the user
    assert out["left"] == [] and out["saved"] == []  # nothing running, nothing left to track
    assert out["state"] == "failed" and out["tracked"] is False
    assert out["lease"] is False  # the reaper was released ...
    assert (
        "released" in out["reaper_log"] and "tearing it down" not in out["reaper_log"]
    )  # ... and did nothing


def test_a_cloud_start_with_a_ray_connection_fails_before_launching(
    env, ray_session, moto_ec2, monkeypatch, ip, capsys
):
    from gpu_notebook import Cluster
    from gpu_notebook.cluster import ClusterError

    launched: list[str] = []
    real = CloudLauncher.launch

    def launch(self, spec, progress=None, **kw):
        launched.append(str(spec.name))
        return real(self, spec, progress=progress, wait_for_workers_s=0)

    monkeypatch.setattr(CloudLauncher, "launch", launch)
    with rc.fast_launcher(), rc.substitute_process_runner(RecordingProcessRunner()):
        c = Cluster(name="gnb-second", cloud="aws", region=REGION, gpu="T4:1", workers=1, connect="direct")
        t0 = time.monotonic()
        with pytest.raises(ClusterError, match=r"Stop the current cluster first \(%gpu_cluster stop") as err:
            c.start()
        assert time.monotonic() - t0 < 10
        assert "already connected to" in str(err.value) and "Nothing was launched" in str(err.value)
        res = ip.run_cell(
            "%gpu_cluster start --cloud aws --region us-east-1 --gpu T4:1 --no-tunnel --name gnb-third"
        )
        assert not res.success  # the cell fails, so "Run All" stops there
        out = capsys.readouterr()
        assert "Stop the current cluster first (%gpu_cluster stop" in out.out + out.err
    assert launched == []
    ec2 = moto_ec2.client()
    for name in ("gnb-second", "gnb-third"):
        resp = ec2.describe_instances(Filters=[{"Name": "tag:ray-cluster-name", "Values": [name]}])
        assert resp["Reservations"] == []  # not even a terminated one: none was paid for
    assert list_states() == [] and not list(Path(env["cfg"]).glob("*.reaper"))
