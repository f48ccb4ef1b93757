"""The keeper of a detached cluster: one small detached Ray actor that outlives every kernel.

A cluster started with ``--detach`` (``Cluster(detach=True)``) leaves its workers running when its kernel goes
(a laptop lid, a kernel restart, a crash). Something must then still know them, say who holds them, and stop
them when nobody will: that is the keeper. It lives on the cluster itself, in the cluster's Ray namespace
(:func:`namespace_of`), named :data:`KEEPER_NAME`, with ``num_cpus=0`` so it fits beside the workers on a
1-CPU laptop. It keeps:

- **the group's record** (actor names, pickled rank plans, backend: what :meth:`WorkerGroup.adopt` needs), so
  any kernel that reaches the cluster can take the workers over with their state (:meth:`Keeper.hold`);
- **the holder**: the kernel (Ray job) that drives the workers now, seen alive by its heartbeat. A second
  kernel's ``attach`` is refused, naming the holder, unless it takes the group over (``--take``); a holder
  whose Ray job ended, or that has been silent for :data:`SILENT_S`, counts as gone;
- **the cell** the workers run (its name, label and start), so an attaching kernel can follow it;
- **the guards**: the idle stop and the budget cap keep working with no kernel attached. A thread charges the
  cluster its hourly rate every tick and stops it when it is idle (no cell running) for the idle stop or its
  spending reaches the budget. A stop with a cell running first tells the ranks (a Checkpointer there saves
  at its next ``maybe_save``, as on a spot notice) and waits for the cell to end, at most the checkpoint
  timeout; then the workers end, then (a local cluster) the Ray daemon the cluster started, or (a cloud cluster,
  whose keeper lives on the head node) the whole cluster is torn down from the head's own launcher config.

The keeper speaks in plain dicts (it is shipped to the cluster with our package and needs no torch).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["KEEPER_NAME", "NAMESPACE_PREFIX", "SILENT_S", "Keeper", "dead_jobs", "kill_tree", "namespace_of"]

#: the keeper's actor name in its cluster's namespace
KEEPER_NAME = "keeper"
#: the Ray namespace of every detached cluster starts so (the cluster's name follows)
NAMESPACE_PREFIX = "gpu_notebook-cluster-"
#: seconds without a heartbeat after which the holding kernel counts as gone
SILENT_S = 30.0
#: seconds a budget stop waits for a running cell to save its checkpoint and end, by default
CHECKPOINT_TIMEOUT_S = 120.0


def namespace_of(name: str) -> str:
    """The Ray namespace of a detached cluster's keeper and workers.

    >>> namespace_of("run1")
    'gpu_notebook-cluster-run1'
    """
    return f"{NAMESPACE_PREFIX}{name}"


def dead_jobs() -> set[str]:
    """The Ray jobs (drivers, i.e. kernels) of the connected cluster that have ended; empty when Ray cannot
    tell (then silence alone tells a gone kernel)."""
    try:
        from ray._private import state

        return {j["JobID"] for j in state.jobs() if j.get("IsDead")}
    except Exception:  # noqa: BLE001 - a private API: without it, silence alone tells a gone kernel
        return set()


def kill_tree(pid: int, grace_s: float = 5.0) -> int:
    """End process ``pid`` and every process under it (SIGTERM, then SIGKILL after ``grace_s``); returns how
    many were signalled. What ends a local Ray daemon: ``ray start --block`` and the GCS, raylet and workers it
    started."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [p for p in (root, *root.children(recursive=True)) if p.pid != os.getpid()]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return len(procs)


#: what ends a local cluster's Ray daemon from inside it: SIGKILL to ``ray start`` first, then to what it started,
#: in that order (a SIGTERM makes the raylet end its workers, this actor and so this process with them, and leaves
#: ``ray start`` draining for 30 s); only psutil imported, so it acts within a second
_KILLER = """
import os, sys, time, psutil
time.sleep(1.0)
try:
    root = psutil.Process(int(sys.argv[1]))
    procs = [root, *root.children(recursive=True)]
except psutil.NoSuchProcess:
    procs = []
for p in procs:
    if p.pid != os.getpid():
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
"""


def _kill_later(pid: int) -> None:
    """End the Ray daemon ``pid`` from a process of its own (this actor is one of the daemon's processes)."""
    subprocess.Popen(  # noqa: S603 - our own interpreter and code
        [sys.executable, "-c", _KILLER, str(int(pid))],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _tear_down_later(name: str, config: str) -> str:
    """Tear the cloud cluster down from its head (``ray down`` with the head's bootstrap config) in a process of
    its own that outlives this actor (the teardown ends the head, and this process with it); returns its log."""
    import tempfile

    log = os.path.join(tempfile.gettempdir(), f"gpu_notebook-{name}-down.log")
    with open(log, "ab") as out:
        subprocess.Popen(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "gpu_notebook.cloud._idle_watch", "--down", "--config", config],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return log


class Keeper:
    """The keeper actor's class (see the module docstring); made a Ray actor by the detached cluster's start.

    ``info``: the cluster's ``name``, ``kind``, ``address``, ``idle_stop_minutes``, ``budget_usd``,
    ``usd_per_hour``, ``checkpoint_timeout_s``, ``daemon_pid`` (a local cluster's Ray daemon), ``cloud`` (a cloud
    cluster's ``{"cloud", "head_config"}``, torn down when the guards stop it) and ``tick_s``.
    """

    def __init__(
        self, info: dict[str, Any], clock: Callable[[], float] = time.time, start: bool = True
    ) -> None:
        self.clock = clock
        self.info = dict(info)
        self.info.setdefault("created", clock())
        self.group: dict[str, Any] | None = None
        self.holder: dict[str, Any] | None = None
        self.cell: dict[str, Any] | None = None
        self.spent = 0.0
        self.busy = False
        self.last_activity = clock()
        self.state = "running"  # running | stopping | stopped
        self.why = ""
        self._last_tick = clock()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        if start:
            threading.Thread(target=self._loop, daemon=True, name="gpu_notebook-keeper").start()

    # ---- kernels ---------------------------------------------------------------------------------------------
    def hold(self, job_id: str, who: dict[str, Any], take: bool = False) -> dict[str, Any]:
        """Kernel ``job_id`` (described by ``who``: host, pid, notebook, and ``tears_down``: it can tear a cloud
        cluster down itself) asks to drive the workers. Returns
        ``{"ok": True, "group": ..., "cell": ..., "info": ...}``, or ``{"held_by": holder}`` while another live
        kernel holds them and ``take`` is false, or ``{"error": why}`` once the cluster is stopping."""
        with self._lock:
            if self.state != "running":
                return {"error": f"the cluster is {self.state} ({self.why})"}
            h = self.holder
            if h is not None and h["job_id"] != job_id and self._alive(h) and not take:
                return {"held_by": dict(h)}
            now = self.clock()
            self.holder = {"job_id": job_id, **who, "since": now, "last_seen": now, "taken_from": None}
            if h is not None and h["job_id"] != job_id and take:
                self.holder["taken_from"] = dict(h)
            return {"ok": True, "group": self.group, "cell": self.cell, "info": self.describe()}

    def _alive(self, holder: dict[str, Any]) -> bool:
        return holder["job_id"] not in dead_jobs() and self.clock() - holder["last_seen"] <= SILENT_S

    def set_group(self, job_id: str, group: dict[str, Any]) -> None:
        """The holder started (or rebuilt, or rescaled) the workers: the record a later kernel adopts."""
        with self._lock:
            if self.holder is None or self.holder["job_id"] == job_id:
                self.group = dict(group)

    def heartbeat(
        self, job_id: str, busy: bool, last_activity: float, usd_per_hour: float | None = None
    ) -> dict[str, Any]:
        """The holder reports in. Returns ``{"taken": holder}`` when another kernel took the workers over (this one
        must let go without ending them), ``{"stop": why}`` when the guards stop the cluster, else ``{}``."""
        with self._lock:
            h = self.holder
            if h is None or h["job_id"] != job_id:
                return {"taken": dict(h) if h else {}}
            now = self.clock()
            h["last_seen"] = now
            self.busy = bool(busy)
            self.last_activity = max(self.last_activity, float(last_activity), now if busy else 0.0)
            if usd_per_hour is not None:
                self.info["usd_per_hour"] = float(usd_per_hour)
            return {"stop": self.why} if self.state != "running" else {}

    def cell_started(self, job_id: str, cell: dict[str, Any]) -> None:
        """The holder started a cell (``name``, ``label``, ``output`` names...): what an attaching kernel follows."""
        with self._lock:
            if self.holder is not None and self.holder["job_id"] == job_id:
                self.cell = {**cell, "started": self.clock(), "ended": None}
                self.busy, self.last_activity = True, self.clock()

    def cell_note(self, job_id: str, name: str, meta: dict[str, Any]) -> None:
        """More about cell ``name`` from its kernel (``out``: the notebook variable its values go to)."""
        with self._lock:
            if self.cell is not None and self.cell.get("name") == name and self._holds(job_id):
                self.cell.update(meta)

    def _holds(self, job_id: str) -> bool:
        return self.holder is not None and self.holder["job_id"] == job_id

    def cell_ended(self, job_id: str) -> None:
        with self._lock:
            if self.cell is not None and self.holder is not None and self.holder["job_id"] == job_id:
                self.cell["ended"] = self.clock()
                self.busy, self.last_activity = False, self.clock()

    def release(self, job_id: str, why: str = "its kernel exited") -> None:
        """The holder lets go (its kernel exits): the workers keep running for the next kernel, under the guards."""
        with self._lock:
            if self.holder is not None and self.holder["job_id"] == job_id:
                self.holder = {**self.holder, "last_seen": float("-inf"), "gone": why}

    def describe(self) -> dict[str, Any]:
        """What ``%gpu_cluster attach`` lists: the cluster, its holder (alive or gone), its cell, the money."""
        with self._lock:
            now = self.clock()
            h = self.holder
            idle_min = self.info.get("idle_stop_minutes")
            idle_in = None
            if idle_min and not self.busy:
                idle_in = max(0.0, float(idle_min) * 60 - (now - self.last_activity))
            return {
                **{k: v for k, v in self.info.items()},
                "state": self.state,
                "why": self.why,
                "holder": None if h is None else {**h, "alive": self._alive(h)},
                "cell": self.cell,
                "busy": self.busy,
                "spent_usd": self.spent,
                "size": (self.group or {}).get("size"),
                "idle_stop_in_s": idle_in,
                "now": now,
            }

    # ---- the guards ------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(float(self.info.get("tick_s", 2.0))):
            try:
                why = self.tick()
                if why:
                    self.stop(why, down=not self.kernel_tears_down())
            except Exception:  # noqa: BLE001 - one bad tick (Ray's state API busy) must not end the guards
                pass

    def kernel_tears_down(self) -> bool:
        """Whether a live kernel holds the cluster that tears a cloud cluster down itself (it has the saved state,
        and hears the guards' stop at its next heartbeat); else the keeper does, from the head."""
        with self._lock:
            h = self.holder
            return h is not None and bool(h.get("tears_down")) and self._alive(h)

    def tick(self, now: float | None = None) -> str | None:
        """Charge the time since the last tick; the reason the guards stop the cluster now, or None."""
        with self._lock:
            now = self.clock() if now is None else now
            dt, self._last_tick = max(0.0, now - self._last_tick), now
            self.spent += float(self.info.get("usd_per_hour") or 0.0) * dt / 3600.0
            if self.state != "running":
                return None
            held = self.holder is not None and self._alive(self.holder)
        if not held:  # nobody reports whether a cell runs: the workers say
            self.busy = self._cell_running()
            if self.busy:
                self.last_activity = now
        budget, idle_min = self.info.get("budget_usd"), self.info.get("idle_stop_minutes")
        if budget and self.spent >= float(budget):
            return f"its budget of ${float(budget):g} is spent (${self.spent:.2f})"
        if idle_min and not self.busy and now - self.last_activity > float(idle_min) * 60:
            return f"idle for {float(idle_min):g} min"
        return None

    def _workers(self) -> list[Any]:
        import ray

        out = []
        for name in (self.group or {}).get("actor_names", ()):
            try:
                out.append(ray.get_actor(name, namespace=(self.group or {}).get("namespace")))
            except ValueError:  # gone already
                pass
        return out

    def _cell_running(self) -> bool:
        import ray

        refs = [w.cell_state.remote() for w in self._workers()]
        try:
            states = ray.get(refs, timeout=10)
        except Exception:  # noqa: BLE001 - a worker that does not answer runs nothing we could wait for
            return False
        return any(s is not None and s.get("ended") is None for s in states)

    def stop(self, why: str, down: bool = True) -> str:
        """End it all: tell a running cell (its Checkpointer saves), wait for it at most the checkpoint timeout,
        end the workers, then the keeper itself and (a local cluster) the Ray daemon, or (a cloud cluster, unless
        ``down`` is false: the kernel that asks tears it down itself) the cloud nodes. Returns a summary."""
        import ray

        with self._lock:
            if self.state != "running":
                return f"cluster {self.info.get('name')!r} is already {self.state}"
            self.state, self.why = "stopping", why
        workers = self._workers()
        if self._cell_running():
            wait_s = float(self.info.get("checkpoint_timeout_s") or CHECKPOINT_TIMEOUT_S)
            try:
                ray.get([w.guard_notice.remote(why, wait_s) for w in workers], timeout=10)
            except Exception:  # noqa: BLE001 - a worker that cannot hear it ends below all the same
                pass
            deadline = self.clock() + wait_s
            while self.clock() < deadline and self._cell_running():
                time.sleep(0.5)
        for w in workers:
            try:
                ray.get(w.interrupt.remote(), timeout=5)
            except Exception:  # noqa: BLE001 - ended below all the same
                pass
        try:  # each leaves the process group, and its last log lines are written and uploaded
            ray.get([w.shutdown.remote() for w in workers], timeout=30)
        except Exception:  # noqa: BLE001 - dead or stuck workers are killed below
            pass
        for w in workers:
            try:
                ray.kill(w, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
        with self._lock:
            self.state = "stopped"
        self._stop.set()
        pid, on_cloud = self.info.get("daemon_pid"), self.info.get("cloud")
        said = f"cluster {self.info.get('name')!r} stopped ({why}): {len(workers)} worker(s) ended"
        if pid:
            _kill_later(int(pid))
            return said
        if on_cloud and down:
            log = _tear_down_later(str(self.info.get("name")), str(on_cloud.get("head_config")))
            said += f"; the cloud cluster is being torn down from its head (log: {log})"
        # a cluster reached by address: its Ray stays; the keeper goes, once this reply is sent
        threading.Timer(1.0, os._exit, (0,)).start()
        return said

    def ping(self) -> str:
        return self.state
