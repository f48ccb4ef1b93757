"""A detached cloud cluster, offline: launched with Ray's real launcher against moto's EC2 on loopback (SSH
recorded), its Ray a ``ray start --head`` this test runs in the cloud head's place (the head moto "creates" cannot
run Ray). The kernel that started it is killed: its reaper hands the cluster over to the guards and leaves the
instances running; a second kernel attaches by name, finds the workers' variable and exits; then the budget guard fires in the keeper on the head, which tears the cluster down with
``ray down`` from the head's own config (``~/ray_bootstrap_config.yaml``, as Ray's launcher leaves it), and the
cloud API then lists nothing. A detached cloud start without a guard, and one on Kubernetes, are refused before
anything is launched."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests._poll import wait_for

pytest.importorskip("moto")
pytest.importorskip("boto3")
yaml = pytest.importorskip("yaml")

from gpu_notebook.cloud import list_states, load_state  # noqa: E402
from gpu_notebook.cloud._verify import aws_leftovers  # noqa: E402
from gpu_notebook.testing.cloud import MotoEC2  # noqa: E402

pytestmark = pytest.mark.timeout(300)
REGION = "us-east-1"

KERNEL = textwrap.dedent(
    """
    import sys, time
    from gpu_notebook.cloud import CloudLauncher
    from gpu_notebook.cloud import _ray_compat as rc
    from gpu_notebook.testing.cloud import RecordingProcessRunner

    name, head = sys.argv[1], sys.argv[2]
    real_launch = CloudLauncher.launch

    def launch(self, spec, progress=None, **kw):
        spec.connect = "direct"  # no ssh tunnel to a fake head
        state = real_launch(self, spec, progress=progress, wait_for_workers_s=0)
        state.client_address, state.address = None, head  # the test's Ray stands in for the head's
        state.save()
        return state

    CloudLauncher.launch = launch
    with rc.fast_launcher(), rc.substitute_process_runner(RecordingProcessRunner()):
        from gpu_notebook import Cluster

        # $72/h: the $1 budget is spent about 50 s after the start (time for the second kernel on a busy machine)
        c = Cluster(name, cloud="aws", region="us-east-1", gpu="T4:1", workers=1, cpus_per_worker=0.5,
                    gpus_per_worker=1, backend="gloo", detach=True, budget=1.0, node_pricing=lambda n: 72.0)
        c.start(progress=lambda m: print("PROGRESS", m, flush=True))
        c.run("x = 41")
        print("STARTED", c._reaper.pid, flush=True)
        time.sleep(600)
    """
)


#: a second kernel: attaches by name (the saved state on this machine), finds the variable, and exits (letting go)
ATTACH = textwrap.dedent(
    """
    import json, sys
    from gpu_notebook import Cluster

    c = Cluster.attach(sys.argv[1], progress=lambda m: print("PROGRESS", m, flush=True))
    c.node_pricing = lambda n: 72.0  # the catalog's price for the node standing in for the head would be $0
    print("ATTACHED", c.kind, json.dumps(list(c.run("x").values)), flush=True)
    """
)


@pytest.fixture(scope="module")
def moto_ec2():
    with MotoEC2(REGION) as server:
        yield server


@pytest.fixture
def env(moto_ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A private HOME (Ray's ssh key and token, the head's config) and config folder; ssh/rsync stand-ins."""
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
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return {"home": home, "cfg": cfg / "clusters", "ssh_log": ssh_log, "tmp": tmp_path}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_killed_kernel_leaves_a_detached_cloud_cluster_to_its_budget_which_tears_it_down(
    env: dict[str, Any],
) -> None:
    from gpu_notebook.cloud._reaper import lease_path, log_path
    from gpu_notebook.cluster._keeper import kill_tree

    name = "gnb-detached"
    down = Path(tempfile.gettempdir()) / f"gpu_notebook-{name}-down.log"  # the keeper's teardown writes it
    down.unlink(missing_ok=True)
    port = _free_port()
    run_env = {**os.environ, "RAY_AUTH_MODE": "token"}  # what ray start turns on, and the kernel must send
    ray_bin = str(Path(sys.executable).with_name("ray"))
    subprocess.run([ray_bin, "get-auth-token", "--generate"], env=run_env, capture_output=True, check=True)
    head_log = env["tmp"] / "head.log"
    with open(head_log, "wb") as log:
        head = subprocess.Popen(
            [ray_bin, "start", "--head", "--block", f"--port={port}",
             "--num-cpus=2", "--num-gpus=1", "--disable-usage-stats", "--include-dashboard=false",
             f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=run_env, cwd=env["tmp"],
        )  # fmt: skip
    kernel = None
    try:
        wait_for(lambda: b"Ray runtime started" in head_log.read_bytes() or head.poll(), timeout=120)
        assert head.poll() is None, _text(head_log)[-3000:]
        from ray.util import get_node_ip_address

        kernel = subprocess.Popen(
            [sys.executable, "-c", KERNEL, name, f"{get_node_ip_address()}:{port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=env["tmp"], env=run_env,
        )  # fmt: skip
        assert kernel.stdout is not None
        seen: list[str] = []
        for line in kernel.stdout:
            seen.append(line)
            if line.startswith("STARTED"):
                break
        else:
            raise AssertionError("".join(seen)[-4000:])
        said = "".join(seen)
        assert "detached: its aws nodes ($72.00/h)" in said and "budget" in said, said[-3000:]
        # what Ray's launcher leaves on a real head: the cluster's config, which its keeper tears it down with
        (env["home"] / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(load_state(name).config))
        assert json.loads(lease_path(name).read_text())["detached"] == "budget $1"

        kernel.send_signal(signal.SIGKILL)  # no exit hook runs: a laptop lid, an OOM
        kernel.wait(10)
        wait_for(lambda: "is detached" in _text(log_path(name)), timeout=30, what="the reaper's hand-over")
        log = log_path(name).read_text()
        assert "left running under its guards (budget $1)" in log and "tearing it down" not in log, log
        assert not lease_path(name).exists()
        assert "instance" in [x["kind"] for x in aws_leftovers(name, REGION)], "torn down with its kernel"
        assert [s.name for s in list_states()] == [name]  # kept for %gpu_cluster attach NAME

        b = subprocess.run(
            [sys.executable, "-c", ATTACH, name], capture_output=True, text=True, timeout=120, env=run_env
        )
        assert b.returncode == 0 and "ATTACHED cloud:aws [41]" in b.stdout, (
            b.stdout[-3000:] + b.stderr[-3000:]
        )
        assert "instance" in [x["kind"] for x in aws_leftovers(name, REGION)], "torn down when B exited"

        # the budget guard on the head: the workers end, then ray down from the head's config
        wait_for(lambda: not aws_leftovers(name, REGION), timeout=150, what="the budget guard's teardown")
        wait_for(lambda: "teardown done" in _text(down), timeout=60, what="ray down's end on the head")
        assert "ray stop" in env["ssh_log"].read_text()  # Ray's teardown_cluster ran (ray down)
    finally:
        if kernel is not None and kernel.poll() is None:
            kernel.kill()
        kill_tree(head.pid)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ("--cloud aws --region us-east-1 --gpu T4:1", ["--budget", "--idle-stop", "Nothing was launched"]),
        ("--cloud kubernetes --gpu T4:1 --budget 5", ["not available on Kubernetes"]),
    ],
)
def test_a_detached_cloud_start_without_a_guard_is_refused_before_any_launch(
    env: dict[str, Any], ip: Any, options: str, says: list[str]
) -> None:
    name = "gnb-unguarded"
    with pytest.raises(Exception) as err:  # noqa: PT011 - the magic's error, whichever class shows it
        ip.run_line_magic("gpu_cluster", f"start --detach --name {name} {options}")
    for words in says:
        assert words in str(err.value), str(err.value)
    assert aws_leftovers(name, REGION) == [] and list_states() == []
