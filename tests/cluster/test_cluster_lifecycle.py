"""Cluster lifecycle edge cases: %unload_ext, no Ray installed, bad or unreachable addresses, RAY_ADDRESS,
scale/restart under a running cell, stopping a cluster whose start failed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from gpu_notebook import Cluster, get_manager
from gpu_notebook.cluster import ClusterError

pytestmark = pytest.mark.timeout(120)


def test_unload_ext_removes_the_magics_and_load_ext_brings_them_back(ip, capsys):
    assert ip.find_line_magic("gpu_cluster") is not None
    ip.run_line_magic("load_ext", "gpu_notebook")  # a second load is harmless
    try:
        ip.run_line_magic("unload_ext", "gpu_notebook")
        assert ip.find_line_magic("gpu_cluster") is None
        assert ip.find_cell_magic("distributed") is None
        assert not any(
            type(m).__module__.startswith("gpu_notebook.") for m in ip.magics_manager.registry.values()
        )
    finally:
        ip.run_line_magic("load_ext", "gpu_notebook")
    assert ip.find_line_magic("gpu_cluster") is not None and ip.find_cell_magic("distributed") is not None
    capsys.readouterr()
    res = ip.run_cell("%gpu_cluster frobnicate")
    assert res.error_in_exec is not None and "invalid choice" in capsys.readouterr().err


def test_start_without_ray_installed_says_how_to_install_it(ip, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    res = ip.run_cell("%gpu_cluster start --name noray --workers 1")
    assert res.error_in_exec is not None
    captured = capsys.readouterr()
    shown = captured.err + captured.out
    assert "Ray is not installed" in shown and "pip install 'gpu_notebook[ray]'" in shown
    assert "Traceback" not in captured.err + captured.out
    assert get_manager().get("noray", None) is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SCRIPT_CONNECT = textwrap.dedent(
    """
    import json, os, sys, time
    from gpu_notebook.cluster import Cluster, ConnectError
    out = []
    for case in json.loads(sys.argv[1]):
        os.environ.pop("RAY_ADDRESS", None)
        if case.get("env"):
            os.environ["RAY_ADDRESS"] = case["env"]
        t0 = time.monotonic()
        try:
            c = Cluster(address=case.get("address"), workers=1)
            c.start()
            out.append({"error": None, "kind": c.kind})
            c.stop()
        except ConnectError as exc:
            out.append({"error": str(exc), "s": time.monotonic() - t0})
    import ray
    print("RESULT " + json.dumps({"cases": out, "ray_initialized": ray.is_initialized()}), flush=True)
    """
)


def test_unreachable_addresses_fail_fast_with_a_clear_message():
    """A wrong address used to keep ray.init retrying for many minutes (host:port) or 30 s (ray://)."""
    port = _free_port()  # nothing listens there
    cases = [
        {"address": f"127.0.0.1:{port}"},
        {"address": f"ray://127.0.0.1:{port}"},
        {"env": f"127.0.0.1:{port}", "address": "auto"},
        # RAY_ADDRESS is what ray.init() connects to: %gpu_cluster start follows it instead of starting a local Ray
        {"env": f"127.0.0.1:{port}"},
    ]
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT_CONNECT, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(
        [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT ") :]
    )
    gcs, client, auto_env, env_only = result["cases"]
    for case in result["cases"]:
        assert case["error"] is not None, case  # never a local Ray started instead
        assert case["s"] < 10, case
        assert f"127.0.0.1 port {port}" in case["error"] and "connection refused" in case["error"]
    assert (
        gcs["error"].startswith(f"could not connect to Ray at 127.0.0.1:{port}:")
        and "Ray head" in gcs["error"]
    )
    assert "Ray Client server" in client["error"]
    assert "(RAY_ADDRESS)" in auto_env["error"]
    assert f"at 127.0.0.1:{port}" in env_only["error"]
    assert result["ray_initialized"] is False


def test_address_local_is_a_local_cluster_and_bad_addresses_are_refused():
    assert Cluster(address="local").kind == "local"  # a local Ray we start and shut down, not someone else's
    assert Cluster(address="ray://10.0.0.5:10001").kind == "address"
    for bad in ("10.0.0.5", "ray://head", "head:port", ":6379"):
        with pytest.raises(RuntimeError, match="bad Ray address"):
            Cluster(address=bad)


def test_scale_and_restart_refuse_while_a_cell_runs(ip, shared, capsys):
    """Ending the workers under a running cell left it and the resize rebuilding the group at once."""
    result: dict = {}

    def cell() -> None:
        result["r"] = shared.run("import time\ntime.sleep(3)\nrank", stream=False)

    t = threading.Thread(target=cell)
    t.start()
    try:
        deadline = time.monotonic() + 20
        while not shared.busy and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shared.busy
        capsys.readouterr()
        res = ip.run_cell("%gpu_cluster scale 1")
        assert res.error_in_exec is not None
        captured = capsys.readouterr()
        err = captured.err + captured.out
        assert "a cell is running on cluster 'shared'" in err and "Traceback" not in err
        with pytest.raises(ClusterError, match="a cell is running"):
            shared.restart()
    finally:
        t.join(60)
    assert list(result["r"].values) == [0, 1]
    assert shared.world_size == 2 and all(w.alive for w in shared.status().workers)


SCRIPT_FAILED_THEN_SECOND = textwrap.dedent(
    """
    import json
    import ray
    from gpu_notebook import Cluster, get_manager
    from gpu_notebook.distributed import GroupTimeouts

    out = {}
    # cannot be placed: the start fails after it started a local Ray, and shuts that Ray down again
    failed = Cluster(name="failed-start", workers=1, cpus_per_worker=64, timeouts=GroupTimeouts(placement=3))
    try:
        failed.start()
    except Exception as exc:
        out["error"] = str(exc)[:200]
    out["failed_state"], out["ray_after_failure"] = failed.state, ray.is_initialized()
    second = Cluster(name="second", workers=1, cpus_per_worker=0.5).start()  # a local Ray of its own
    out["second_started_ray"] = second.started_ray
    out["failed_stop"] = failed.stop()  # (at kernel exit too) it shut the second cluster's Ray down
    out["ray_after_failed_stop"] = ray.is_initialized()
    out["second_runs"] = second.call(lambda: 40 + 2)
    out["clusters"] = [c.name for c in get_manager().list()]
    out["second_stop"] = second.stop()
    out["ray_at_end"] = ray.is_initialized()
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_stopping_a_cluster_whose_start_failed_leaves_the_live_ray_alone():
    """A failed start closes the Ray connection it opened; a later cluster may open another. Stopping the
    failed cluster afterwards (or at exit) shut that other cluster's Ray down."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TMPDIR="/tmp")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT_FAILED_THEN_SECOND],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(
        [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT ") :]
    )
    assert "1 worker x 64 CPU needs 64 CPU" in out["error"] and "cannot grow" in out["error"]
    assert out["failed_state"] == "failed" and out["ray_after_failure"] is False
    assert out["second_started_ray"] is True
    assert "local Ray shut down" not in out["failed_stop"] and "disconnected" not in out["failed_stop"]
    assert out["ray_after_failed_stop"] is True and out["second_runs"] == [42]
    assert out["clusters"] == ["second"]
    assert out["second_stop"].endswith("local Ray shut down") and out["ray_at_end"] is False


@pytest.mark.parametrize(
    "line,expect",
    [
        ("logs --rank 99", "has no rank 99: ranks 0-"),  # used to say "no output recorded yet"
        ("logs --rank -1", "--rank: expected a rank (0, 1, ... up to 1024), not '-1'"),
        ("logs --tail 0", "--tail: expected a whole number of lines, at least 1"),  # used to print nothing
        ("logs --tail -3", "--tail: expected a whole number of lines, at least 1"),
    ],
)
def test_logs_of_a_rank_that_does_not_exist_say_so(ip, shared, capsys, line, expect):
    capsys.readouterr()
    res = ip.run_cell(f"%gpu_cluster {line}")
    assert res.error_in_exec is not None
    captured = capsys.readouterr()
    assert expect in captured.err + captured.out and "no output recorded yet" not in captured.out
    assert "Traceback" not in captured.err + captured.out


def test_a_port_where_another_server_answers_is_not_taken_for_a_ray_head(ray_session):
    """host:22 (an SSH server) accepts the TCP connection: ray.init then waited a long time. A gRPC handshake
    tells a Ray head (GCS or Ray Client server) from any other server in moments."""
    import socket
    import threading
    import time

    from gpu_notebook.cluster import _connect

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    stop = threading.Event()

    def ssh_like() -> None:  # greets like sshd and ignores whatever the client says
        srv.settimeout(0.2)
        conns = []
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            conn.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n")
            conns.append(conn)
        for c in conns:
            c.close()

    t = threading.Thread(target=ssh_like, daemon=True)
    t.start()
    try:
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
            t0 = time.monotonic()
            with pytest.raises(_connect.ConnectError, match="does not speak gRPC") as err:
                _connect.probe(address, timeout=2.0)
            assert time.monotonic() - t0 < 8
            assert f"127.0.0.1 port {port}" in str(err.value)
    finally:
        stop.set()
        t.join(5)
        srv.close()
    # the session's real Ray head passes
    gcs = ray_session.get_runtime_context().gcs_address
    _connect.probe(gcs, timeout=5.0)
