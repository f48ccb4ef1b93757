"""The reaper process on its own (no cloud): a release ends it quietly, a SIGTERM hands over at once, and a
cluster it did not launch is left alone. ``tests/cloud/test_cloud_lifecycle.py`` has the real teardown after SIGKILL.

Each "kernel" is a subprocess, so the SIGTERM handler and the reaper's parent are its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _poll import wait_for

pytestmark = pytest.mark.timeout(60)

KERNEL = textwrap.dedent(
    """
    import sys, time
    from gpu_notebook.cloud import _reaper
    r = _reaper.start(sys.argv[1], poll_s=0.2)
    print("REAPER", r.pid, flush=True)
    if sys.argv[2] == "detach":  # a detached cluster: its guards on the head take over
        print("HANDED", _reaper.hand_over(sys.argv[1], "budget $5"), flush=True)
    if sys.argv[2] == "release":
        r.release(wait_s=10)
        print("RELEASED", r.alive, flush=True)
    time.sleep(120)
    """
)


def _kernel(tmp_path: Path, name: str, mode: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "GPU_NOTEBOOK_CONFIG_DIR": str(tmp_path / "cfg")}
    proc = subprocess.Popen(
        [sys.executable, "-c", KERNEL, name, mode], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("REAPER "), line
    return proc, int(line.split()[1])


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def _end(proc: subprocess.Popen[str], reaper_pid: int) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    if not _wait_gone(reaper_pid, 5):
        os.kill(reaper_pid, signal.SIGKILL)


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg" / "clusters"


def test_a_released_reaper_exits_without_tearing_down(tmp_path, cfg):
    from gpu_notebook.cloud import ClusterState, load_state

    ClusterState("gnb-rel", "aws", "us-east-1", status="running").save()
    proc, reaper = _kernel(tmp_path, "gnb-rel", "release")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "RELEASED False"  # it exited while the kernel lives on
        assert not (cfg / "gnb-rel.reaper").exists()
        proc.kill()  # the kernel dies later: nothing happens
        proc.wait(10)
        log = (cfg / "gnb-rel.reaper.log").read_text()
        assert "released" in log and "tearing it down" not in log
        assert load_state("gnb-rel").status == "running"  # untouched
    finally:
        _end(proc, reaper)


def test_sigterm_hands_over_at_once_and_another_kernels_cluster_is_left_alone(tmp_path, cfg):
    from gpu_notebook.cloud import ClusterState, load_state

    ClusterState("gnb-old", "aws", "us-east-1", status="running", created_at=time.time() - 3600).save()
    proc, reaper = _kernel(tmp_path, "gnb-old", "stay")
    try:
        said = cfg / "gnb-old.reaper.log"
        wait_for(lambda: said.exists() and "watching kernel" in said.read_text(), what="the reaper to watch")
        assert (cfg / "gnb-old.reaper").exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == -signal.SIGTERM  # still ends the way SIGTERM ends a process
        assert _wait_gone(reaper), "the reaper did not exit"
        log = (cfg / "gnb-old.reaper.log").read_text()
        assert "is terminating (SIGTERM" in log  # the handler marked the lease
        assert "older than this lease: another kernel's cluster; left alone" in log
        assert load_state("gnb-old").status == "running"  # a same-named cluster from before: not ours
        assert not (cfg / "gnb-old.reaper").exists()
    finally:
        _end(proc, reaper)


def test_a_detached_cluster_s_reaper_leaves_it_to_its_guards_when_the_kernel_restarts(tmp_path, cfg):
    from gpu_notebook.cloud import ClusterState, load_state

    ClusterState("gnb-det", "aws", "us-east-1", status="running").save()
    proc, reaper = _kernel(tmp_path, "gnb-det", "detach")
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "HANDED True"
        proc.send_signal(signal.SIGTERM)  # a kernel restart: the reaper would start the teardown at once
        proc.wait(10)
        assert _wait_gone(reaper), "the reaper did not exit"
        log = (cfg / "gnb-det.reaper.log").read_text()
        assert (
            "is detached: left running under its guards (budget $5)" in log and "tearing it down" not in log
        )
        assert load_state("gnb-det").status == "running"  # kept for the next kernel's attach
        assert not (cfg / "gnb-det.reaper").exists()
    finally:
        _end(proc, reaper)


def test_a_kernel_that_died_before_launching_leaves_nothing_to_do(tmp_path, cfg):
    proc, reaper = _kernel(tmp_path, "gnb-none", "stay")
    try:
        proc.kill()
        proc.wait(10)
        assert _wait_gone(reaper), "the reaper did not exit"
        log = (cfg / "gnb-none.reaper.log").read_text()
        assert "is gone" in log and "nothing was launched" in log
    finally:
        _end(proc, reaper)


def test_a_kernel_shutdown_request_hands_a_launched_cloud_cluster_to_its_reaper_at_once(cfg):
    """A Jupyter shutdown or restart request gives the kernel 2.5 s and ``ray down`` takes minutes: the cloud
    provider marks the lease ``terminating`` (the reaper tears down now) and leaves the cluster to it."""
    from gpu_notebook.cloud import ClusterState, _reaper
    from gpu_notebook.cluster.providers.cloud import CloudProvider

    provider = CloudProvider("aws")
    assert (
        provider.stops_at_kernel_shutdown(None) is True
    )  # nothing launched: the stop has nothing to wait for
    # a saved state older than the lease: the reaper leaves it alone (this test launches nothing to tear down)
    state = ClusterState("gnb-shut", "aws", "us-east-1", status="running", created_at=time.time() - 3600)
    state.save()
    provider.state = state
    assert (
        provider.stops_at_kernel_shutdown(None) is True
    )  # launched without a reaper: the kernel tries itself
    reaper = provider.reaper = _reaper.start("gnb-shut", poll_s=0.2)
    pid = reaper.pid
    try:
        assert provider.stops_at_kernel_shutdown(None) is False
        assert reaper.process.wait(20) == 0  # it took the cluster over and ended (this test's own child)
        log = (cfg / "gnb-shut.reaper.log").read_text()
        assert "is terminating (SIGTERM, or a shutdown or restart request)" in log
        assert not (cfg / "gnb-shut.reaper").exists()
    finally:
        if reaper.process.poll() is None and pid is not None:
            os.kill(pid, signal.SIGKILL)


def test_a_cloud_cluster_handed_to_its_reaper_is_not_torn_down_again_at_the_kernel_s_exit(
    monkeypatch, fresh_manager
):
    """After the handover the kernel exits at once (its local children gone), so its exit hook runs: it must not
    start a second teardown (racing the reaper's ``ray down``) nor release the reaper's lease."""
    from gpu_notebook.cloud import _reaper
    from gpu_notebook.cluster import Cluster
    from gpu_notebook.cluster.providers.cloud import CloudProvider

    manager = fresh_manager
    marked, torn = [], []
    monkeypatch.setattr(_reaper, "mark_terminating", lambda: marked.append(True))
    monkeypatch.setattr(CloudProvider, "teardown", lambda self, c, say, reason: torn.append(reason) or "")
    c = Cluster(name="gnb-handed", cloud="aws", gpu="T4:1")
    assert isinstance(c.provider, CloudProvider)
    c.provider.state, c.provider.reaper = object(), object()  # launched, with a reaper watching
    manager.add(c)
    assert manager.kernel_shutdown() == ["cluster 'gnb-handed': its teardown is left to the reaper process"]
    assert marked == [True] and manager.list() == []
    assert manager.stop_all("kernel exit") == [] and torn == []  # the exit hook finds nothing to tear down
