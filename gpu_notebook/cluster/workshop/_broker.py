"""The workshop broker: one detached Ray actor on the shared cluster that owns every student's placement.

The teacher starts it (:class:`gpu_notebook.cluster.workshop.Workshop`); it lives in the Ray namespace of its
workshop, named ``broker``, with ``num_cpus=0`` so it fits on the smallest machine and never takes a CPU from a
student. Everything our API does to get resources for a student goes through it:

- **placement**: :meth:`Broker.reserve` checks the request against the student's quota and budget and, in the
  same call (the broker's lock makes check and reservation one step for every student at once), creates the
  placement group the student's workers then start in. Ray keeps a worker inside its bundle, so a group can
  never hold more than the broker granted. One reservation per student: a new one (a scale, a rebuild)
  replaces the last.
- **records**: each student's group (its workers' actor names, rank plans, backend) is kept here, so a
  student whose kernel restarted finds it by ID (:meth:`Broker.join`).
- **policing**: a thread charges each group for what it holds, every ``tick_s``; it notices a kernel that is gone
  (its Ray job is dead, or it has not been heard from), and stops a group that is idle for the idle stop, over
  its budget, or stopped by the teacher. A live kernel is asked to stop its own cluster (its next heartbeat says
  so, and a running cell ends as "cluster stopped"); after a grace period, or at once when the kernel is gone,
  the broker removes the reservation itself, which ends the workers.

Ray itself has no isolation between users: a student who calls Ray directly (``ray.remote``,
``placement_group``) is not stopped by any of this (see ``docs/workshops.md``).

The broker speaks in plain dicts (its module is shipped to the cluster with our package; the rank plans are kept
as the student's pickled bytes), so nothing here needs torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from gpu_notebook.cluster._keeper import dead_jobs
from gpu_notebook.cluster.workshop._rules import (
    DEFAULT_IDLE_STOP_MIN,
    Prices,
    Quota,
    budget_state,
    charge,
    fmt_held,
    over_quota,
    rate_per_hour,
    requested,
)

__all__ = ["BROKER_NAME", "HOLDING", "Broker", "namespace_of"]

#: the broker's actor name in its workshop's namespace
BROKER_NAME = "broker"
#: the record states in which a student's group holds its reservation (and is charged)
HOLDING = ("running", "detached", "stopping")
#: seconds without a heartbeat after which a kernel counts as gone, in heartbeats
_SILENT_BEATS = 6


def namespace_of(workshop: str) -> str:
    """The Ray namespace of a workshop's broker and workers.

    >>> namespace_of("ml101")
    'gpu_notebook-workshop-ml101'
    """
    return f"gpu_notebook-workshop-{workshop}"


def _new_record(student: str) -> dict[str, Any]:
    return {
        "student": student,
        "state": "joined",  # joined | running | detached | stopping | stopped | reclaimed | refused
        "why": "",
        "job_id": None,  # the Ray job of the kernel that holds the group
        "kernel": "?",  # alive | gone | ?
        "held": {"CPU": 0.0, "GPU": 0.0},
        "size": 0,
        "bundle": {},
        "spent": 0.0,
        "busy_s": 0.0,
        "held_s": 0.0,
        "busy": False,
        "last_activity": time.time(),
        "last_seen": time.time(),
        "started_at": None,
        "stop_by": None,  # deadline of a "stopping" state
        "group": None,  # what a reconnecting kernel needs: actor names, pickled plans, backend, ...
        "warned": False,
    }


class Broker:
    """The broker actor's class (see the module docstring); made a Ray actor by the teacher's start."""

    def __init__(
        self, workshop: str, settings: dict[str, Any], clock: Callable[[], float] = time.time
    ) -> None:
        self.workshop = workshop
        self.namespace = namespace_of(workshop)
        self.clock = clock
        self._lock = threading.RLock()
        self._records: dict[str, dict[str, Any]] = {}
        self._pgs: dict[str, Any] = {}  # student -> the placement group reserved for them
        self._last_tick = clock()
        self.settings: dict[str, Any] = {}
        self.configure(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gpu_notebook-workshop-broker")
        self._thread.start()

    # ---- settings ----------------------------------------------------------------------------------------
    def configure(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Set (or change, for the students to come and the next tick) the workshop's rules; returns them."""
        s = {
            "quota_cpus": None,
            "quota_gpus": None,
            "budget_usd": None,
            "price_cpu_hour": 0.0,
            "price_gpu_hour": 0.0,
            "price_source": "set by the teacher",
            "idle_stop_minutes": DEFAULT_IDLE_STOP_MIN,
            "heartbeat_s": 5.0,
            "tick_s": 2.0,
        }
        s.update({k: v for k, v in settings.items() if v is not None})
        with self._lock:
            self.settings = s
        return dict(s)

    def get_settings(self) -> dict[str, Any]:
        return dict(self.settings)

    @property
    def quota(self) -> Quota:
        return Quota(self.settings["quota_cpus"], self.settings["quota_gpus"])

    @property
    def prices(self) -> Prices:
        s = self.settings
        return Prices(float(s["price_cpu_hour"]), float(s["price_gpu_hour"]), str(s["price_source"]))

    def _record(self, student: str) -> dict[str, Any]:
        rec = self._records.get(student)
        if rec is None:
            rec = self._records[student] = _new_record(student)
        return rec

    # ---- a student's kernel -------------------------------------------------------------------------------
    def join(self, student: str, job_id: str) -> dict[str, Any]:
        """A student's kernel arrives. Returns the settings and, when the student has a group this kernel may
        take over (its last kernel is gone or detached), the group's record and placement group to reconnect.

        ``{"busy": message}`` when another kernel that is still alive holds the group.
        """
        with self._lock:
            rec = self._record(student)
            out: dict[str, Any] = {"settings": dict(self.settings), "group": None}
            if rec["state"] in HOLDING and rec["group"] is not None:
                if rec["job_id"] not in (None, job_id) and rec["state"] == "running" and self._job_alive(rec):
                    out["busy"] = (
                        f"student {student!r} of workshop {self.workshop!r} is connected from another kernel that "
                        f"is still running: stop the cluster there (%gpu_cluster stop), or pick another --student"
                    )
                    return out
                if rec["state"] == "stopping":
                    out["busy"] = f"your group is being stopped ({rec['why']}); start again in a few seconds"
                    return out
                out["group"] = dict(rec["group"])
                out["pg"] = self._pgs.get(student)
            rec["last_seen"] = self.clock()
            return out

    def reserve(
        self, student: str, job_id: str, size: int, bundle: dict[str, float], strategy: str = "PACK"
    ) -> dict[str, Any]:
        """Check ``size`` workers of ``bundle`` against the quota and the budget; when they fit, reserve them.

        Returns ``{"pg": placement_group}``, or ``{"error": message, "kind": "quota"|"budget"|"busy"}``.
        """
        from ray.util.placement_group import placement_group

        with self._lock:
            rec = self._record(student)
            if rec["state"] == "stopping":
                return {"error": f"your group is being stopped ({rec['why']})", "kind": "busy"}
            why = over_quota(self.quota, size, bundle, f"student {student!r}", self.workshop)
            if why is not None:
                if rec["state"] not in HOLDING:
                    rec["state"], rec["why"] = "refused", why
                return {"error": why, "kind": "quota"}
            budget = self.settings["budget_usd"]
            if budget_state(rec["spent"], budget) == "spent":
                return {
                    "error": f"workshop {self.workshop!r}: the budget of ${budget:g} for student {student!r} is "
                    f"spent (${rec['spent']:.2f}); ask the teacher for more",
                    "kind": "budget",
                }
            self._remove_pg(student)
            pg = placement_group(
                [dict(bundle) for _ in range(size)],
                strategy=strategy,
                name=f"{self.namespace}-{student}",
                # scoped to the broker (a detached actor), not to the student's kernel: it outlives a kernel
                # restart, and a broker that dies takes every reservation, and so every worker, with it
            )
            self._pgs[student] = pg
            now = self.clock()
            rec.update(
                state="running",
                why="",
                job_id=job_id,
                kernel="alive",
                held=requested(size, bundle),
                size=size,
                bundle=dict(bundle),
                last_activity=now,
                last_seen=now,
                started_at=rec["started_at"] or now,
                group=None,
                stop_by=None,
            )
            return {"pg": pg}

    def check(self, student: str, size: int, bundle: dict[str, float]) -> str | None:
        """Why ``size`` workers of ``bundle`` would be refused (quota), or None: before a scale ends workers."""
        return over_quota(self.quota, size, bundle, f"student {student!r}", self.workshop)

    def started(self, student: str, job_id: str, group: dict[str, Any]) -> None:
        """The student's workers run: keep what a reconnecting kernel needs (actor names, plans, ...)."""
        with self._lock:
            rec = self._record(student)
            if rec["state"] in HOLDING:
                # seen now: a reconnect slower than the silence limit must not be taken for a gone kernel
                rec.update(
                    group=dict(group), job_id=job_id, state="running", kernel="alive", last_seen=self.clock()
                )

    def heartbeat(self, student: str, job_id: str, busy: bool, last_activity: float) -> dict[str, Any]:
        """A kernel reports in. Returns ``{"stop": why}`` when its cluster must stop (``"keep": True`` when
        another kernel took the group over: this one must not end the workers), ``{"warn": text}`` at 80% of
        the budget, else ``{}``."""
        with self._lock:
            rec = self._records.get(student)
            if rec is None:
                return {"stop": "the workshop has no record of this student (was the broker restarted?)"}
            if rec["job_id"] not in (None, job_id):
                return {"stop": "another kernel reconnected to this group", "keep": True}
            now = self.clock()
            rec["last_seen"], rec["kernel"] = now, "alive"
            rec["busy"] = bool(busy)
            rec["last_activity"] = max(rec["last_activity"], float(last_activity), now if busy else 0.0)
            if rec["state"] == "stopping":
                return {"stop": rec["why"]}
            if rec["state"] not in HOLDING:
                return {"stop": rec["why"] or "the group was stopped"}
            if rec["state"] == "detached":
                rec["state"] = "running"
            out: dict[str, Any] = {}
            budget = self.settings["budget_usd"]
            if budget_state(rec["spent"], budget) == "warn" and not rec["warned"]:
                rec["warned"] = True
                out["warn"] = f"80% of your workshop budget is spent (${rec['spent']:.2f} of ${budget:g})"
            return out

    def release(self, student: str, why: str) -> None:
        """The student stopped their cluster: free the reservation."""
        with self._lock:
            rec = self._records.get(student)
            if rec is not None:
                self._end(rec, "stopped", why)

    def detach(self, student: str, job_id: str, why: str) -> None:
        """The student's kernel exits and keeps the group for a reconnect (until the idle stop)."""
        with self._lock:
            rec = self._records.get(student)
            if rec is not None and rec["job_id"] == job_id and rec["state"] == "running":
                rec.update(state="detached", why=why, kernel="gone", busy=False)

    # ---- the teacher --------------------------------------------------------------------------------------
    def students(self) -> list[dict[str, Any]]:
        """Every student's record, with its derived numbers (rate, utilisation, idle-stop countdown)."""
        with self._lock:
            now = self.clock()
            idle_s = float(self.settings["idle_stop_minutes"]) * 60
            out = []
            for rec in self._records.values():
                r = {k: v for k, v in rec.items() if k != "group"}
                holding = rec["state"] in HOLDING
                r["usd_per_hour"] = rate_per_hour(rec["held"], self.prices) if holding else 0.0
                r["utilisation"] = rec["busy_s"] / rec["held_s"] if rec["held_s"] > 0 else None
                r["idle_s"] = 0.0 if rec["busy"] or not holding else now - rec["last_activity"]
                r["idle_stop_in_s"] = max(0.0, idle_s - r["idle_s"]) if holding else None
                r["held_text"] = fmt_held(rec["held"]) if holding else "-"
                r["budget_usd"] = self.settings["budget_usd"]
                out.append(r)
            return sorted(out, key=lambda r: r["student"])

    def stop_student(self, student: str, why: str = "stopped by the teacher") -> str:
        """Stop one student's group (their kernel is asked first; the workers end within the grace period)."""
        with self._lock:
            rec = self._records.get(student)
            if rec is None:
                known = ", ".join(sorted(self._records)) or "none yet"
                raise KeyError(f"no student {student!r} in workshop {self.workshop!r} (students: {known})")
            if rec["state"] not in HOLDING:
                return f"student {student!r} has no workers running ({rec['state']})"
            self._stopping(rec, why)
            return f"student {student!r}: workers stopping ({why})"

    def stop_all(self, why: str = "stopped by the teacher") -> list[str]:
        with self._lock:
            return [
                self.stop_student(s, why)
                for s in sorted(self._records)
                if self._records[s]["state"] in HOLDING
            ]

    def shutdown(self, why: str = "the workshop ended") -> int:
        """End every group now (the teacher's workshop stop); returns how many were ended."""
        self._stop.set()
        with self._lock:
            ended = 0
            for rec in self._records.values():
                if rec["state"] in HOLDING:
                    self._end(rec, "stopped", why)
                    ended += 1
            return ended

    # ---- policing -------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(float(self.settings["tick_s"])):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one bad tick (Ray's state API busy) must not end the broker
                pass

    def tick(self, now: float | None = None) -> None:
        """Charge, notice gone kernels, and stop what is idle, over budget or past its stopping grace."""
        with self._lock:
            now = self.clock() if now is None else now
            dt = max(0.0, now - self._last_tick)
            self._last_tick = now
            s = self.settings
            idle_s = float(s["idle_stop_minutes"]) * 60
            silent_s = _SILENT_BEATS * float(s["heartbeat_s"])
            dead = self._dead_jobs()
            for rec in self._records.values():
                if rec["state"] not in HOLDING:
                    continue
                rec["spent"] += charge(rec["held"], self.prices, dt)
                rec["held_s"] += dt
                if rec["busy"]:
                    rec["busy_s"] += dt
                gone = rec["job_id"] in dead or now - rec["last_seen"] > silent_s
                if gone and rec["kernel"] != "gone":
                    rec["kernel"], rec["busy"] = "gone", False
                    if rec["state"] == "running":
                        rec["state"] = "detached"
                        rec["why"] = "kernel gone (its Ray job ended or it stopped answering)"
                if rec["state"] == "stopping":
                    if rec["kernel"] == "gone" or now >= (rec["stop_by"] or now):
                        self._end(rec, "stopped", rec["why"])
                    continue
                if budget_state(rec["spent"], s["budget_usd"]) == "spent":
                    self._stopping(rec, f"the workshop budget of ${s['budget_usd']:g} is spent")
                elif not rec["busy"] and now - rec["last_activity"] > idle_s:
                    minutes = f"{s['idle_stop_minutes']:g} min"
                    if rec["kernel"] == "gone":
                        self._end(rec, "reclaimed", f"kernel gone, then idle for {minutes}")
                    else:
                        self._stopping(rec, f"idle for {minutes}")
                if rec["state"] == "stopping" and rec["kernel"] == "gone":
                    self._end(rec, "stopped", rec["why"])

    def _stopping(self, rec: dict[str, Any], why: str) -> None:
        grace = 3 * float(self.settings["heartbeat_s"]) + 2
        rec.update(state="stopping", why=why, stop_by=self.clock() + grace)

    def _end(self, rec: dict[str, Any], state: str, why: str) -> None:
        """Free a student's reservation: removing the placement group ends the workers in it."""
        import ray

        group = rec.get("group") or {}
        for name in group.get("actor_names", ()):
            try:
                ray.kill(ray.get_actor(name, namespace=self.namespace), no_restart=True)
            except Exception:  # noqa: BLE001 - already gone: the placement group's removal ends the rest
                pass
        self._remove_pg(rec["student"])
        rec.update(state=state, why=why, held={"CPU": 0.0, "GPU": 0.0}, busy=False, group=None, stop_by=None)

    def _remove_pg(self, student: str) -> None:
        from ray.util.placement_group import remove_placement_group

        pg = self._pgs.pop(student, None)
        if pg is not None:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001 - already removed (by the student's own stop): nothing to free
                pass

    def _job_alive(self, rec: dict[str, Any]) -> bool:
        return rec["job_id"] not in self._dead_jobs()

    def _dead_jobs(self) -> set[str]:
        """The Ray jobs (drivers, i.e. kernels) that have ended; empty when Ray cannot tell."""
        return dead_jobs()  # as a detached cluster's keeper tells a gone kernel

    def ping(self) -> dict[str, Any]:
        return {"workshop": self.workshop, "students": len(self._records), "quota": asdict(self.quota)}
