"""The journey of a kernel restart and shutdown with the default cluster running, in a real Jupyter kernel.

Before the kernel stopped its clusters on the shutdown request, ipykernel spent that request signalling the local
Ray's processes, its own children, which outlived it. jupyter_client then sent the kernel SIGTERM at 2.5 s and
SIGKILL at 5 s, and Ray printed its crash report. The kernel died killed, before any exit hook ran. Every restart
of a workshop's kernel went that way. Now the clusters stop first, and the kernel exits by itself, with status 0.

It must do so on a busy machine too (a 2-core laptop, or the suite's second phase running two files at once): the
restart and the shutdown here happen while every core runs a busy loop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

jupyter_client = pytest.importorskip("jupyter_client")
pytest.importorskip("ipykernel")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.timeout(300)


def _run(kc: Any, code: str) -> str:
    """Execute ``code`` in the kernel; its printed output (the test fails on an error reply)."""
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=180, output_hook=hook)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)


def _children(pid: int) -> list[Any]:
    return [c for c in psutil.Process(pid).children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]


def _gone(procs: list[Any], within: float = 20.0) -> list[Any]:
    """Of ``procs``, those still running (not exited, not a zombie) after up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        alive = []
        for p in procs:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@contextlib.contextmanager
def _every_core_busy() -> Iterator[None]:
    """A busy loop on each core while the block runs: the kernel's shutdown competes for the CPU."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        yield
    finally:
        for p in loops:
            p.kill()
            p.wait()


def _start(km: Any) -> Any:
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return kc


def test_restart_and_shutdown_with_the_default_cluster_running_end_the_kernel_by_itself() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the default: a local Ray of its own
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.kernel_spec.argv[0] = sys.executable  # this interpreter, the one with gpu_notebook
    km.start_kernel(env=env)
    kc = _start(km)
    try:
        _run(kc, "%load_ext gpu_notebook")
        _run(kc, "%gpu_cluster start")
        _run(kc, "%gpu_monitor")  # the monitor's samplers are Ray actors too
        assert "[rank 1] 2" in _run(
            kc, "%%distributed\nimport torch.distributed as dist\nprint(dist.get_world_size())"
        )
        first = km.provisioner.process
        ray_procs = _children(first.pid)
        assert any("raylet" in p.name() for p in ray_procs), [p.name() for p in ray_procs]

        kc.stop_channels()
        with _every_core_busy():
            km.restart_kernel(now=False)  # what Kernel > Restart does
        assert first.returncode == 0, f"the kernel was killed at the restart (status {first.returncode})"
        assert not _gone(ray_procs), "the old kernel's Ray processes outlived it"

        # the restarted kernel starts the default cluster again, on a Ray the user started first (not ours to stop,
        # but the kernel's children all the same), and shuts down as cleanly
        kc = _start(km)
        _run(kc, 'import ray\nray.init(address="local", num_cpus=2, include_dashboard=False)')
        _run(kc, "%load_ext gpu_notebook")
        assert "using the Ray this kernel is already connected to" in _run(kc, "%gpu_cluster start")
        assert "[rank 0] ok" in _run(kc, "%%distributed\nprint('ok')")
        second = km.provisioner.process
        ray_procs = _children(second.pid)
        kc.stop_channels()
        with _every_core_busy():
            km.shutdown_kernel(now=False)  # what closing the notebook (or Shut Down Kernel) does
        assert second.returncode == 0, f"the kernel was killed at shutdown (status {second.returncode})"
        assert not _gone(ray_procs), "the kernel's Ray processes outlived it"
    finally:
        if km.is_alive():
            km.shutdown_kernel(now=True)
