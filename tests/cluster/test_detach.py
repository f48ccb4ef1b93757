"""Detached clusters, the way a user meets them: real Jupyter kernels through jupyter_client, a real Ray daemon.

The journey: kernel A starts ``%gpu_cluster start --detach``, sets a variable on the workers and starts a long
``%%distributed --noblock -o`` cell; A is killed (SIGKILL, no cleanup: a laptop lid, an OOM). Kernel B attaches:
``%gpu_result`` shows the lines printed while no kernel was attached and each rank's value, fills the ``-o``
variable, and the workers still hold the variable. A third kernel's attach is refused naming B, and ``--take``
takes the workers over. ``%gpu_cluster stop`` ends the workers, the keeper and the Ray daemon.

The guards: a detached cluster whose kernel is gone is stopped by its budget (its Checkpointer saves first; the test
reads the checkpoint back) and by its idle stop, with no kernel attached.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._poll import wait_for

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.timeout(420)


def _run(kc: Any, code: str, ok: bool = True) -> str:
    """Execute ``code`` in the kernel; its output (the test fails on an error reply unless ``ok`` is False)."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] in ("execute_result", "display_data", "update_display_data"):
            out.append(str(msg["content"]["data"].get("text/plain", "")))

    reply = kc.execute_interactive(code, timeout=240, output_hook=hook)
    text = "".join(out)
    if ok:
        assert reply["content"]["status"] == "ok", text
    else:
        assert reply["content"]["status"] == "error", text
    return text


class Kernel:
    def __init__(self, env: dict[str, str], python: str = sys.executable, cwd: str | None = None) -> None:
        self.km = jupyter_client.KernelManager(kernel_name="python3")
        self.km.kernel_spec.argv[0] = python
        self.km.start_kernel(env=env, **({"cwd": cwd} if cwd else {}))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.pid = self.km.provisioner.process.pid

    def run(self, code: str, ok: bool = True) -> str:
        return _run(self.kc, code, ok)

    def kill(self) -> None:
        """SIGKILL, as the OOM killer does: no exit hook runs."""
        self.kc.stop_channels()
        os.kill(self.pid, signal.SIGKILL)
        self.km.provisioner.process.wait()

    def close(self) -> None:
        self.kc.stop_channels()
        if self.km.is_alive():
            self.km.shutdown_kernel(now=True)


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The kernels' environment: a config folder of this test's own (the daemons' records), no RAY_ADDRESS."""
    e = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    e["GPU_NOTEBOOK_CONFIG_DIR"] = str(tmp_path / "config")
    yield e
    # whatever a failed test left: the daemons it started
    for rec in (tmp_path / "config" / "detached").glob("*.json"):
        pid = json.loads(rec.read_text()).get("daemon_pid")
        if pid and psutil.pid_exists(pid):
            from gpu_notebook.cluster._keeper import kill_tree

            kill_tree(int(pid))


def _daemon(env: dict[str, str], name: str) -> Any:
    rec = Path(env["GPU_NOTEBOOK_CONFIG_DIR"]) / "detached" / f"{name}.json"
    return psutil.Process(json.loads(rec.read_text())["daemon_pid"])


def _tree_gone(proc: Any) -> bool:
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return True
    return not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


LONG_CELL = """%%distributed --noblock -o vals
import time
for i in range(14):
    print("tick", i, flush=True)
    time.sleep(1)
x + 1"""


def test_a_killed_kernel_s_cell_goes_on_and_another_kernel_attaches(
    env: dict[str, str], tmp_path: Path
) -> None:
    uploads = tmp_path / "uploaded-logs"
    a = Kernel(env)
    try:
        a.run("%load_ext gpu_notebook")
        started = a.run(
            f"%gpu_cluster start --detach --name run1 --workers 2 --cpus-per-worker 0.25 --log-to {uploads}"
        )
        assert "detached:" in started and "%gpu_cluster attach run1" in started, started
        daemon = _daemon(env, "run1")
        assert daemon.pid not in [p.pid for p in psutil.Process(a.pid).children(recursive=True)]
        a.run("%%distributed\nx = 41")
        a.run(LONG_CELL)
        wait_for(lambda: "tick 2" in a.run("%gpu_cluster logs"), timeout=60, what="the cell's first lines")
        a.kill()
    except BaseException:
        a.close()
        raise
    assert daemon.is_running(), "the Ray daemon died with the kernel"

    b = Kernel(env)
    try:
        b.run("%load_ext gpu_notebook")
        listing = b.run("%gpu_cluster attach")
        assert "run1" in listing and f"was held by kernel pid {a.pid}" in listing, listing
        attached = b.run("%gpu_cluster attach run1")
        assert "attached to cluster 'run1'" in attached and "%gpu_result" in attached, attached
        result = b.run("%gpu_result")
        # lines printed while no kernel was attached, then the value of each rank
        assert "[rank 0] tick 13" in result and "[rank 1] tick 13" in result, result
        assert "42" in result, result
        assert b.run("print(vals)").strip() == "[42, 42]"  # -o vals, as if the cell had started here
        assert "41" in b.run("%%distributed --ranks 0\nx")  # the workers kept their state
        status = b.run("%gpu_cluster status")
        assert "Detached: held by this kernel" in status and "its Ray daemon pid" in status, status
        # the ranks' log files on the node: also what they printed while A was attached
        logs = b.run("%gpu_cluster logs --rank 1 --tail 100")
        assert "[rank 1] tick 0" in logs and "[rank 1] tick 13" in logs, logs

        c = Kernel(env)
        try:
            c.run("%load_ext gpu_notebook")
            refused = c.run("%gpu_cluster attach run1", ok=False)
            assert f"held by kernel pid {b.pid}" in refused and "--take" in refused, refused
            assert "attached" in c.run("%gpu_cluster attach run1 --take")
            assert "41" in c.run("%%distributed --ranks 1\nx")
            wait_for(
                lambda: "not attached in this kernel" in b.run("%gpu_cluster list"),
                timeout=30,
                what="B lets go",
            )
            stopped = c.run("%gpu_cluster stop")
            assert "its Ray daemon shut down" in stopped, stopped
        finally:
            c.close()
        wait_for(lambda: _tree_gone(daemon), timeout=60, what="no Ray process left")
    finally:
        b.close()
    # --log-to: the log files' batches, uploaded by the node's first rank, outlive the cluster
    records = [json.loads(line) for f in sorted(uploads.rglob("*.jsonl.gz")) for line in gzip.open(f)]
    assert {(r["rank"], r["line"]) for r in records} >= {(0, "tick 13"), (1, "tick 13")}, records[-5:]
    assert {"time", "rank", "node", "cluster", "stream", "line"} <= set(records[0]), records[0]


GUARDED = """
import os, signal, sys
from gpu_notebook.cluster import Cluster

c = Cluster("{name}", detach=True, workers=2, cpus_per_worker=0.25, {policy}).start(progress=print)
c.run('''{cell}''', block=False, name="train")
print("started", flush=True)
import time; time.sleep(3)  # the cell runs; now the kernel dies without a word
os.kill(os.getpid(), signal.SIGKILL)
"""

TRAIN = """
import time, torch
from gpu_notebook import checkpoint
ck = checkpoint.Checkpointer({folder!r}, every_steps=10**9)
w = torch.zeros(4)
for step in range(10**6):
    w += 1
    ck.maybe_save({{"w": w, "step": step}}, step)
    if ck.preempted:
        print("saved at step", step, flush=True)
        break
    time.sleep(0.05)
"""


def _guarded(env: dict[str, str], name: str, policy: str, cell: str) -> subprocess.CompletedProcess[str]:
    code = GUARDED.format(name=name, policy=policy, cell=cell)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=240
    )


def test_the_budget_stops_a_cluster_whose_kernel_is_gone_saving_a_checkpoint_first(
    env: dict[str, str], tmp_path: Path
) -> None:
    folder = str(tmp_path / "ckpt")
    # $36/h on the one local node: the $0.10 budget is spent about 10 s after the start, with no kernel left
    policy = "budget=0.1, node_pricing=lambda node: 36.0"
    done = _guarded(env, "spend", policy, TRAIN.format(folder=folder))
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    daemon = _daemon(env, "spend")
    wait_for(lambda: _tree_gone(daemon), timeout=180, what="the budget guard ends the cluster")
    from gpu_notebook import checkpoint

    state = checkpoint.Checkpointer(folder).restore()
    assert state["step"] > 0 and float(state["w"][0]) == state["step"] + 1, state


def test_the_idle_stop_ends_a_cluster_whose_kernel_is_gone(env: dict[str, str]) -> None:
    done = _guarded(env, "idle", "idle_stop=0.1", "x = 1")  # 6 s without a cell, then stopped
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr
    daemon = _daemon(env, "idle")
    wait_for(lambda: _tree_gone(daemon), timeout=120, what="the idle guard ends the cluster")


def test_an_address_cluster_detached_and_attached_from_a_fresh_kernel(
    env: dict[str, str], tmp_path: Path
) -> None:
    """A Ray the user started (``ray start --head``): kernel A detaches its workers there and dies; kernel B, with
    no connection before, attaches by address; the stop ends the workers and the keeper, and leaves that Ray up.

    Kernel B runs in a second virtualenv, the user's other environment with gpu_notebook installed
    (``node_venv(..., with_gpu_notebook=True)``: this environment's packages and this checkout's gpu_notebook,
    made in well under a second), started outside this checkout so that its folder is not on B's path."""
    from gpu_notebook.cluster._keeper import kill_tree
    from gpu_notebook.testing.venv import node_venv

    port = _free_port()
    head_env = {**env, "RAY_AUTH_MODE": "token"}
    log = open(tmp_path / "head.log", "wb")  # noqa: SIM115 - the head's output, closed with it
    head = subprocess.Popen(
        [str(Path(sys.executable).with_name("ray")), "start", "--head", "--block", f"--port={port}",
         "--disable-usage-stats", "--include-dashboard=false", f"--ray-client-server-port={_free_port()}",
         f"--dashboard-agent-listen-port={_free_port()}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=head_env,
    )  # fmt: skip
    try:
        wait_for(
            lambda: b"Ray runtime started" in (tmp_path / "head.log").read_bytes(),
            timeout=120,
            what="the head",
        )
        from ray.util import get_node_ip_address

        address = f"{get_node_ip_address()}:{port}"
        kenv = {
            **env,
            "RAY_AUTH_MODE": "token",
        }  # what the connect error says to set for a token-auth cluster
        a = Kernel(kenv)
        try:
            a.run("%load_ext gpu_notebook")
            a.run(
                f"%gpu_cluster start --detach --name far --address {address} --workers 2 --cpus-per-worker 0.25"
            )
            a.run("%%distributed\nx = 41")
            a.run(LONG_CELL.replace("range(14)", "range(6)"))
            wait_for(
                lambda: "tick 1" in a.run("%gpu_cluster logs"), timeout=60, what="the cell's first lines"
            )
            a.kill()
        except BaseException:
            a.close()
            raise
        other = tmp_path / "other-venv"
        python_b = node_venv(other, with_gpu_notebook=True)
        benv = {k: v for k, v in kenv.items() if k != "PYTHONPATH"}
        benv.update(VIRTUAL_ENV=str(other), PATH=f"{python_b.parent}{os.pathsep}{kenv.get('PATH', '')}")
        (tmp_path / "b-cwd").mkdir()
        b = Kernel(benv, python=str(python_b), cwd=str(tmp_path / "b-cwd"))
        try:
            where = b.run("import sys, gpu_notebook; print(sys.prefix); print(sys.executable)").split()
            assert where == [str(other), str(python_b)], where
            b.run("%load_ext gpu_notebook")
            assert "far" in b.run(f"%gpu_cluster attach --address {address}")
            assert "attached to cluster 'far'" in b.run(f"%gpu_cluster attach far --address {address}")
            result = b.run("%gpu_result")
            assert "[rank 1] tick 5" in result and "42" in result, result
            assert "41" in b.run("%%distributed --ranks 1\nx")
            stopped = b.run("%gpu_cluster stop")
            assert "left running" in stopped, stopped
        finally:
            b.close()
        count = (
            f"import ray; ray.init(address={address!r}, log_to_driver=False); "
            "print(len([a for a in ray.util.list_named_actors(all_namespaces=True) "
            "if a['namespace'].startswith('gpu_notebook-cluster-')]))"
        )

        def actors_left() -> bool:
            out = subprocess.run(
                [sys.executable, "-c", count], env=kenv, capture_output=True, text=True, timeout=60
            )
            return out.stdout.strip().splitlines()[-1:] == ["0"]

        wait_for(actors_left, timeout=60, what="the workers and the keeper gone from the user's Ray")
        assert head.poll() is None, "the user's Ray was stopped"
    finally:
        kill_tree(head.pid)
        log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
