"""How the kernel's local Ray ends when Jupyter shuts the kernel down or restarts it: every process at once.

jupyter_client sends the kernel SIGTERM 2.5 s after a shutdown or restart request (SIGKILL at 5 s). Ray's own
``ray.shutdown()`` ends its processes one after the other, waiting up to a second for each, which on a busy 2-core
machine took the kernel past that SIGTERM (and so past every ``atexit`` hook). :func:`end_ray_processes_together`
is registered in :data:`gpu_notebook._registry.before_kernel_shutdown` when this module is imported, so it runs
first thing in the shutdown request. It only changes how Ray's next shutdown ends the processes this process
started, so a Ray the user started with ``ray.init()`` in the kernel ends the same way.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

from gpu_notebook._registry import before_kernel_shutdown

__all__ = ["end_ray_processes_together"]


def end_ray_processes_together(grace_s: float = 0.25) -> None:
    """Make this process's next ``ray.shutdown()`` end the local Ray it started (GCS, raylet, monitors) all at
    once, without waiting for them in the kernel.

    Ray's own shutdown sends each of its processes SIGTERM and waits up to 1 s for it, one after the other: about
    1.2 s of the shutdown request's 2.5 s on an idle 2-core machine. Instead, once the driver has disconnected,
    every process gets its SIGTERM at once (the raylet passes it on to its agents and workers, which end within
    tens of ms) and a thread reaps them, with SIGKILL for what is left after ``grace_s``: given their SIGTERM
    together, the GCS and the raylet outlived a whole second on a 2-core machine. ipykernel's end of the kernel's
    children, which follows, then finds none left. A local Ray keeps nothing that a SIGKILL would lose.
    """
    worker = sys.modules.get("ray._private.worker")
    node = getattr(worker, "_global_node", None)  # None: no Ray, or one this process did not start
    if node is None or not hasattr(node, "all_processes"):
        return

    def kill_all_processes(
        check_alive: bool = True, allow_graceful: bool = False, wait: bool = False
    ) -> None:
        procs = [info.process for infos in list(node.all_processes.values()) for info in infos]
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.terminate()
                except OSError:  # it has just ended
                    pass
        node.all_processes.clear()
        threading.Thread(
            target=_reap, args=(procs, grace_s), daemon=True, name="gpu_notebook-ray-reaper"
        ).start()

    node.kill_all_processes = kill_all_processes


def _reap(procs: list[Any], grace_s: float) -> None:
    """Wait for ``procs`` (``subprocess.Popen``) so that none stays a zombie; SIGKILL what outlives ``grace_s``."""
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


before_kernel_shutdown.add(end_ray_processes_together)
