"""Tunnels to a cluster's Ray Client port: ``ssh -N -L`` to a VM head, ``kubectl port-forward`` on Kubernetes.

A tunnel is a background process of this kernel whose id is saved in the cluster's state (``tunnel_pid``), so
:func:`close_tunnel` ends it on ``stop`` and after a kernel restart. Each opener returns
``ray://127.0.0.1:<port>`` once the local port accepts connections.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

from ._render import RAY_CLIENT_PORT
from ._state import ClusterState

__all__ = [
    "close_tunnel",
    "free_local_port",
    "open_kube_port_forward",
    "open_ssh_tunnel",
    "ssh_tunnel_command",
]


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ssh_tunnel_command(
    state: ClusterState, local_port: int = RAY_CLIENT_PORT, key_path: str | None = None
) -> list[str]:
    """``ssh -N -L`` command that forwards the head's Ray Client port to ``127.0.0.1:local_port``."""
    auth = state.config.get("auth", {})
    key = key_path or state.ssh_key or auth.get("ssh_private_key")
    if key is None and state.cloud == "aws":
        key = f"~/.ssh/ray-autoscaler_{state.region}.pem"
    cmd = [
        "ssh",
        "-N",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "ExitOnForwardFailure=yes",
        "-o",
        "ServerAliveInterval=30",
        "-L",
        f"{local_port}:localhost:{RAY_CLIENT_PORT}",
    ]
    if key:
        cmd += ["-i", os.path.expanduser(key)]
    cmd.append(f"{auth.get('ssh_user', 'ubuntu')}@{state.head_ip}")
    return cmd


def open_ssh_tunnel(
    state: ClusterState, local_port: int | None = None, timeout_s: float = 30.0, ssh: str = "ssh"
) -> str:
    """Start ``ssh -N -L`` to the head in the background; return ``ray://127.0.0.1:<port>`` once it listens."""
    port = local_port or free_local_port()
    cmd = ssh_tunnel_command(state, port)
    cmd[0] = ssh
    return _start_forward(state, cmd, port, timeout_s, f"ssh tunnel to {state.head_ip}")


def open_kube_port_forward(
    state: ClusterState, local_port: int | None = None, timeout_s: float = 60.0, kubectl: str = "kubectl"
) -> str:
    """``kubectl port-forward`` to the RayCluster's head service; returns ``ray://127.0.0.1:<port>``."""
    port = local_port or free_local_port()
    ns = state.spec.get("namespace", "default")
    cmd = [kubectl, "port-forward", "-n", ns, f"svc/{state.name}-head-svc", f"{port}:{RAY_CLIENT_PORT}"]
    return _start_forward(state, cmd, port, timeout_s, f"kubectl port-forward to {ns}/{state.name}")


def close_tunnel(state: ClusterState) -> bool:
    """End the tunnel process recorded in ``state`` (by its saved process id); True if one was ended."""
    pid = state.tunnel_pid
    state.tunnel_pid = None
    if not pid:
        return False
    try:
        os.kill(pid, signal.SIGTERM)
        return True
    except ProcessLookupError:
        return False


def _start_forward(state: ClusterState, cmd: list[str], port: int, timeout_s: float, what: str) -> str:
    """Start a port-forwarding process, wait until 127.0.0.1:port accepts, record its pid in the state."""
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
            raise RuntimeError(f"{what} exited ({proc.returncode}): {err[-500:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if time.monotonic() >= deadline:
                proc.kill()
                raise TimeoutError(f"{what} not listening after {timeout_s:.0f} s") from None
            time.sleep(0.1)
    state.tunnel_pid = proc.pid
    state.client_address = f"ray://127.0.0.1:{port}"
    state.save()
    return state.client_address
