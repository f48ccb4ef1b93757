"""The local Ray daemon of a detached cluster: ``ray start --head --block`` in a session of its own, so that it
outlives the kernel, and its record file (what ``%gpu_cluster attach`` finds on this machine)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook.cloud import config_dir
from gpu_notebook.cluster._errors import ClusterError
from gpu_notebook.cluster._keeper import kill_tree

__all__ = ["DAEMON_START_S", "record_path", "records", "records_dir", "start_daemon"]

#: seconds a local Ray daemon has to answer after ``ray start``
DAEMON_START_S = 90.0


def records_dir() -> Path:
    """Where the local Ray daemons of detached clusters started on this machine are recorded (user-only)."""
    path = config_dir() / "detached"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def records() -> list[dict[str, Any]]:
    """The detached local clusters of this machine whose Ray daemon still runs (stale records removed)."""
    import psutil

    out = []
    for f in sorted(records_dir().glob("*.json")):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("daemon_pid") and psutil.pid_exists(int(rec["daemon_pid"])):
            out.append(rec)
        else:
            f.unlink(missing_ok=True)
    return out


def record_path(name: str) -> Path:
    return records_dir() / f"{name}.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _node_ip() -> str:
    from ray.util import get_node_ip_address

    return str(get_node_ip_address())


def start_daemon(name: str, say: Progress, dashboard: bool = False) -> tuple[str, int]:
    """Start a Ray head of its own on this machine (``ray start --head --block``, a new session: not a child
    that dies with the kernel) and wait until it answers; returns its address and the daemon's pid."""
    port = _free_port()
    log = records_dir() / f"{name}.ray.log"
    ray_bin = Path(sys.executable).with_name("ray")
    cmd = [
        str(ray_bin) if ray_bin.exists() else "ray",
        "start", "--head", "--block", f"--port={port}",
        f"--num-cpus={os.cpu_count() or 1}", "--disable-usage-stats",
        f"--include-dashboard={'true' if dashboard else 'false'}",
        f"--ray-client-server-port={_free_port()}", f"--dashboard-agent-listen-port={_free_port()}",
        f"--dashboard-agent-grpc-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    say(f"starting a Ray daemon for detached cluster {name!r} (it outlives this kernel)")
    pid = _spawn_orphan(cmd, log, env)
    address = f"{_node_ip()}:{port}"  # the address Ray gives its head (its drivers look for a raylet there)
    deadline = time.monotonic() + DAEMON_START_S
    while time.monotonic() < deadline:
        if not _running(pid):
            tail = log.read_text(errors="replace")[-1500:]
            raise ClusterError(f"the Ray daemon for {name!r} exited at start:\n{tail}")
        # the GCS port answers before the raylet has registered: a driver must wait for the whole head
        if b"Ray runtime started" in log.read_bytes():
            break
        time.sleep(0.5)
    else:
        kill_tree(pid)
        raise ClusterError(
            f"the Ray daemon for {name!r} did not answer within {DAEMON_START_S:g} s (see {log})"
        )
    rec = {"name": name, "address": address, "daemon_pid": pid, "created": time.time(), "log": str(log)}
    record_path(name).write_text(json.dumps(rec))
    os.chmod(record_path(name), 0o600)
    return address, pid


#: what starts the daemon: a process that starts it in a session of its own and exits at once, so the daemon is
#: nobody's child (a kernel's shutdown signals its children; a child's death is its parent's to reap)
_LAUNCHER = """
import subprocess, sys
with open(sys.argv[1], "wb") as log:
    p = subprocess.Popen(sys.argv[2:], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True)
print(p.pid)
"""


def _spawn_orphan(cmd: list[str], log: Path, env: dict[str, str]) -> int:
    out = subprocess.run(  # noqa: S603 - our interpreter, Ray's command
        [sys.executable, "-c", _LAUNCHER, str(log), *cmd], env=env, capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        raise ClusterError(f"could not start a Ray daemon: {out.stderr.strip()[-800:]}")
    return int(out.stdout.strip())


def _running(pid: int) -> bool:
    import psutil

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
