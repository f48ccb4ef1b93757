"""A detached watcher that tears a cloud cluster down when the kernel that launched it dies without doing so.

A Jupyter kernel restart or shutdown gives the kernel a few seconds: jupyter_client sends SIGTERM (which skips
``atexit`` handlers) about 2.5 s after the shutdown request and SIGKILL at about 5 s, while ``ray down`` takes
minutes. So the kernel cannot be trusted to tear its cloud clusters down itself. Before a launch, the kernel
writes a *lease* file next to the cluster's saved state (``clusters/<name>.reaper``) and starts this module as a
process of its own, in a new session (a kernel restart signals the kernel's process group, not this one)::

    python -m gpu_notebook.cloud._reaper --name NAME --kernel-pid PID --lease PATH

The reaper polls every second:

- the lease file is gone: the kernel tore the cluster down (``%gpu_cluster stop``, a budget or idle stop, a
  failed start) and released it, so the reaper exits without doing anything;
- the kernel is gone (this process was re-parented, or the pid no longer exists) or marked the lease
  ``terminating`` (its SIGTERM handler, or a Jupyter shutdown or restart request), while the lease is still there: the reaper runs the same teardown as
  ``stop`` (:meth:`~gpu_notebook.cloud.CloudLauncher.teardown` of the saved state: ``ray down``, then the
  cloud-API check), logs the report to ``clusters/<name>.reaper.log``, removes the lease and exits.

- the kernel handed the cluster over (:func:`hand_over`: a detached cluster, ``%gpu_cluster start --detach``,
  whose budget and idle stop run on the cluster itself): on the kernel's end the reaper only says so, keeps the
  saved state (``%gpu_cluster attach``/``stop`` from another kernel use it) and exits; the cluster's guards tear
  it down when they fire.

A saved state older than the lease belongs to another kernel's cluster of the same name and is left alone.
The reaper uses the kernel's environment (the cloud's standard credential chain); it never logs credentials.

Importing this module imports no cloud SDK and no Ray (the launcher loads them only when it tears down).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_notebook._settings import CONFIG_DIR_VAR

from ._launcher import CloudLauncher
from ._state import clusters_dir, config_dir, load_state

LEASE_SUFFIX = ".reaper"
LOG_SUFFIX = ".reaper.log"

#: ``name -> lease path`` of the clusters this process launched and has not released (for the SIGTERM handler).
_LEASES: dict[str, Path] = {}
_LEASES_LOCK = threading.Lock()
_PREVIOUS_SIGTERM: Any = None
_SIGTERM_INSTALLED = False


def lease_path(name: str) -> Path:
    """The lease file of cluster ``name``."""
    return clusters_dir() / f"{name}{LEASE_SUFFIX}"


def log_path(name: str) -> Path:
    """Where the reaper of cluster ``name`` writes what it did."""
    return clusters_dir() / f"{name}{LOG_SUFFIX}"


def _write_lease(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_lease(path: Path) -> dict[str, Any] | None:
    """The lease's contents; None when it is gone. An unreadable lease (being replaced) reads as ``{}``."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {} if path.exists() else None
    return data if isinstance(data, dict) else {}


@dataclass
class Reaper:
    """The kernel's handle on the reaper of one cloud cluster (see the module docstring)."""

    name: str
    lease: Path
    process: subprocess.Popen[bytes] | None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def release(self, wait_s: float = 3.0) -> None:
        """The cluster is torn down (or was never launched): tell the reaper to exit without tearing down.

        Waits up to ``wait_s`` for it to exit, so it does not linger as a zombie of the kernel.
        """
        with _LEASES_LOCK:
            _LEASES.pop(self.name, None)
        self.lease.unlink(missing_ok=True)
        if self.process is not None:
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                pass  # it exits at its next poll; subprocess reaps it later

    def __repr__(self) -> str:
        return f"<Reaper {self.name!r} pid={self.pid} {'watching' if self.alive else 'ended'}>"


def start(name: str, poll_s: float = 1.0) -> Reaper:
    """Write the lease of cluster ``name`` and start its reaper; call before launching anything.

    The reaper watches this process. Call :meth:`Reaper.release` once the cluster is torn down.
    """
    lease = lease_path(name)
    _write_lease(
        lease, {"name": name, "kernel_pid": os.getpid(), "created_at": time.time(), "status": "watching"}
    )
    env = dict(os.environ)
    env[CONFIG_DIR_VAR] = str(config_dir())  # the same state folder, whatever the kernel's cwd or HOME does
    package_root = str(
        Path(__file__).resolve().parents[2]
    )  # so `-m gpu_notebook...` imports this gpu_notebook
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    log = log_path(name)
    try:
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gpu_notebook.cloud._reaper",
                    "--name",
                    name,
                    "--kernel-pid",
                    str(os.getpid()),
                    "--lease",
                    str(lease),
                    "--poll",
                    f"{poll_s:g}",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                close_fds=True,
                start_new_session=True,
            )
    except BaseException:
        lease.unlink(missing_ok=True)
        raise
    with _LEASES_LOCK:
        _LEASES[name] = lease
    _install_sigterm_handler()
    return Reaper(name, lease, proc)


def hand_over(name: str, guards: str | None) -> bool:
    """Hand cluster ``name`` over to the guards on the cluster (``guards`` says which): its reaper no longer tears
    it down when this kernel ends; ``guards`` None takes it back (the kernel tears it down now, and the reaper
    finishes that if the kernel dies first). False when there is no lease to mark (no reaper)."""
    lease = lease_path(name)
    data = _read_lease(lease)
    if data is None:
        return False
    data.pop("detached", None)
    _write_lease(lease, {**data, "detached": guards} if guards else data)
    return True


# ---- the kernel's SIGTERM -------------------------------------------------------------------------------------


def _install_sigterm_handler() -> None:
    """On SIGTERM (what a kernel restart sends before SIGKILL), tell the reapers to start tearing down at once.

    Installed once, from the main thread only (Python's rule for signal handlers). A handler someone else
    installed earlier is kept and called instead; the reapers then still notice when the process is gone.
    """
    global _PREVIOUS_SIGTERM, _SIGTERM_INSTALLED
    if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    try:
        _PREVIOUS_SIGTERM = signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):  # not the main interpreter, or no signals here
        return
    _SIGTERM_INSTALLED = True


def _on_sigterm(signum: int, frame: Any) -> None:
    previous = _PREVIOUS_SIGTERM
    if callable(previous):
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    # The default action: this process ends now, without atexit handlers. Hand the clusters to the reapers.
    mark_terminating()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def mark_terminating() -> None:
    """Mark every lease of this process ``terminating``: their reapers tear down without waiting for the exit."""
    with _LEASES_LOCK:
        leases = list(_LEASES.values())
    for lease in leases:
        data = _read_lease(lease)
        if data is None:
            continue
        try:
            _write_lease(lease, {**data, "status": "terminating"})
        except OSError:
            pass


# ---- the reaper process ---------------------------------------------------------------------------------------


def _kernel_gone(pid: int) -> bool:
    if os.getppid() != pid:  # re-parented: the kernel exited (works even while it is an unreaped zombie)
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _say(msg: str) -> None:
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {msg}", flush=True)


def watch(name: str, kernel_pid: int, lease: Path, poll_s: float = 1.0) -> int:
    """The reaper's loop: wait for a release or for the kernel's end (see the module docstring)."""
    _say(f"reaper {os.getpid()}: watching kernel {kernel_pid} for cloud cluster {name}")
    while True:
        data = _read_lease(lease)
        if data is None:
            _say("released: the kernel tore the cluster down (or never launched it); exiting")
            return 0
        if data.get("detached") and (data.get("status") == "terminating" or _kernel_gone(kernel_pid)):
            _say(
                f"the kernel (pid {kernel_pid}) is gone; cloud cluster {name} is detached: left running under "
                f"its guards ({data['detached']}); %gpu_cluster attach {name} brings it back, %gpu_cluster "
                f"stop {name} ends it"
            )
            lease.unlink(missing_ok=True)
            return 0
        if data.get("status") == "terminating":
            _say(f"the kernel (pid {kernel_pid}) is terminating (SIGTERM, or a shutdown or restart request)")
            break
        if _kernel_gone(kernel_pid):
            _say(f"the kernel (pid {kernel_pid}) is gone")
            break
        time.sleep(poll_s)
    return reap(name, lease)


def reap(name: str, lease: Path) -> int:
    """Tear cluster ``name`` down from its saved state unless the lease was released; returns an exit code."""
    data = _read_lease(lease)
    if data is None:
        _say("released just before the kernel ended; nothing to do")
        return 0
    try:
        state = load_state(name)
    except KeyError:
        _say(f"no saved state for {name}: nothing was launched, or it is already torn down")
        lease.unlink(missing_ok=True)
        return 0
    created = float(data.get("created_at") or 0.0)
    if state.created_at + 1.0 < created:
        _say(f"the saved state of {name} is older than this lease: another kernel's cluster; left alone")
        lease.unlink(missing_ok=True)
        return 0
    if state.status in ("stopped", "terminated"):
        _say(f"{name} is already {state.status}")
        lease.unlink(missing_ok=True)
        return 0
    _say(
        f"the kernel did not stop cloud cluster {name} ({state.cloud}, status {state.status}): tearing it down"
    )
    try:
        report = CloudLauncher(check_tools=False, verify_credentials=False).teardown(state, progress=_say)
    except Exception as exc:  # noqa: BLE001 - say so; the state file stays for `%gpu_cluster list` / `stop NAME`
        _say(f"teardown FAILED ({type(exc).__name__}: {exc}); run %gpu_cluster stop {name} in a notebook")
        lease.unlink(missing_ok=True)
        return 1
    _say(f"teardown done: {report.message()}")
    lease.unlink(missing_ok=True)
    return 0 if report.clean else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpu_notebook.cloud._reaper",
        description="Tear a cloud cluster down when the kernel that launched it dies.",
    )
    parser.add_argument("--name", required=True, help="the cloud cluster's name")
    parser.add_argument("--kernel-pid", type=int, required=True, help="the process that launched it")
    parser.add_argument("--lease", required=True, help="the lease file; its removal means 'released'")
    parser.add_argument("--poll", type=float, default=1.0, help="seconds between checks")
    parser.add_argument(
        "--now",
        action="store_true",
        help="tear down at once, without waiting for the kernel (the JupyterLab panel's 'tear down now')",
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the kernel's terminal is not for us
    lease = Path(args.lease)
    if args.now:
        if _read_lease(lease) is None:  # released after a failed teardown: the saved state says what is left
            _write_lease(lease, {"name": args.name, "kernel_pid": args.kernel_pid, "created_at": 0.0})
        _say(f"reaper {os.getpid()}: teardown of {args.name} asked for from the JupyterLab panel")
        return reap(args.name, lease)
    return watch(args.name, args.kernel_pid, lease, args.poll)


if __name__ == "__main__":
    sys.exit(main())
