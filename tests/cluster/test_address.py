"""Address mode: a Ray head started with `ray start --head` on 127.0.0.1, reached by host:port and ray://."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

pytestmark = pytest.mark.timeout(300)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_head():
    """A separate Ray cluster (its own head process on 127.0.0.1), killed at the end without `ray stop`."""
    port, client_port = _free_port(), _free_port()
    temp = tempfile.mkdtemp(prefix="gnbh", dir="/tmp")
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    env = dict(
        os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled"
    )  # test-only cluster on loopback
    proc = subprocess.Popen(
        [
            ray_bin,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            f"--ray-client-server-port={client_port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", client_port)) == 0:
                break
        if proc.poll() is not None:
            raise RuntimeError(proc.stdout.read())
        time.sleep(0.5)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError("ray head did not start")
    yield {"gcs": f"127.0.0.1:{port}", "client": f"ray://127.0.0.1:{client_port}"}
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from IPython.testing.globalipapp import start_ipython
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpu_notebook")
    from gpu_notebook import get_manager
    address = sys.argv[1]
    ip.run_line_magic("gpu_cluster", f"start --name remote --address {address} --workers 2 --cpus-per-worker 0.5")
    c = get_manager().get("remote")
    ip.run_cell("%%distributed -o r\\nimport os, torch, torch.distributed as dist\\n"
                "t = torch.ones(1); dist.all_reduce(t); print('hello from', rank)\\n(t.item(), os.getpid())\\n")
    r = ip.user_ns["r"]
    msg = c.stop()
    print("RESULT " + json.dumps({"values": [v[0] for v in r], "pids": [v[1] for v in r], "kind": c.kind,
                                  "started_ray": c.started_ray, "stop": msg}))
    """
)


def _run(address: str) -> tuple[dict, str]:
    env = dict(
        os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled"
    )  # test-only cluster on loopback
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, address], capture_output=True, text=True, env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :]), proc.stdout


def test_connect_by_gcs_address_runs_cells_and_leaves_the_cluster_running(ray_head):
    result, out = _run(ray_head["gcs"])
    assert result["values"] == [2.0, 2.0] and result["kind"] == "address"
    assert result["started_ray"] is False
    assert "left running" in result["stop"]
    assert "[rank 1] hello from 1" in out
    # the head is still there: connecting again works
    again, _ = _run(ray_head["gcs"])
    assert again["values"] == [2.0, 2.0]


def test_connect_through_ray_client(ray_head):
    result, out = _run(ray_head["client"])
    assert result["values"] == [2.0, 2.0]
    assert "[rank 0] hello from 0" in out


def test_ray_client_start_up_failures_are_retried_but_wrong_addresses_are_not() -> None:
    from gpu_notebook.cluster._connect import _transient_client_error

    assert _transient_client_error(
        ConnectionAbortedError("Initialization failure from server:\nTraceback ...")
    )
    assert not _transient_client_error(ConnectionError("ray client connection timeout"))
    assert not _transient_client_error(ValueError("bad address"))
