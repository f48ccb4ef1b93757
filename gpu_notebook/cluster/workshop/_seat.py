"""A student's seat in a workshop: the kernel's side of the broker, and the worker group it places.

:class:`Seat` finds the workshop's broker by name and speaks to it; :class:`StudentGroup` is the ordinary
:class:`~gpu_notebook.distributed.WorkerGroup` except for where its resources come from: the broker reserves
them (after checking the quota and the budget), and its workers are detached, named actors in the workshop's
namespace, so they outlive a kernel restart and the next kernel reconnects to them by the student's ID.
:class:`Heartbeat` tells the broker every few seconds that the kernel is alive and whether a cell runs, and
stops the cluster when the broker says so (the teacher, the budget, the idle stop).
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook.cluster._errors import ClusterError
from gpu_notebook.cluster.workshop._broker import BROKER_NAME, namespace_of
from gpu_notebook.distributed import WorkerGroup, _placement
from gpu_notebook.distributed._group import GroupError
from gpu_notebook.distributed._worker import Worker, remote_worker_class

__all__ = [
    "BudgetSpentError",
    "Heartbeat",
    "QuotaError",
    "Seat",
    "StudentGroup",
    "WorkshopError",
    "find_broker",
]

#: seconds a kernel waits for the group's last kernel to be seen gone (a restart: the old process is exiting)
_TAKEOVER_WAIT_S = 15.0


class WorkshopError(ClusterError):
    """A workshop operation could not be done (no such workshop, the broker is gone, ...)."""


class QuotaError(WorkshopError, ValueError):
    """A student asked for more than their quota: the message names the quota and what was asked."""


class BudgetSpentError(WorkshopError):
    """A student's workshop budget is spent."""


def _ray() -> Any:
    import ray

    return ray


def find_broker(workshop: str) -> Any:
    """The broker actor of ``workshop`` on the connected Ray cluster; a :class:`WorkshopError` naming the
    workshops that do run there when there is none."""
    ray = _ray()
    try:
        return ray.get_actor(BROKER_NAME, namespace=namespace_of(workshop))
    except ValueError:
        pass
    prefix = namespace_of("")
    try:
        running = sorted(
            a["namespace"][len(prefix) :]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a.get("name") == BROKER_NAME and str(a.get("namespace", "")).startswith(prefix)
        )
    except Exception:  # noqa: BLE001 - only a hint in the message
        running = []
    there = f"workshops running there: {', '.join(running)}" if running else "no workshop runs there"
    raise WorkshopError(
        f"no workshop named {workshop!r} on this Ray cluster ({there}). Check the name and the address the "
        f"teacher gave; the teacher starts it with %gpu_cluster workshop start {workshop}"
    )


class Seat:
    """One student's link to the broker of one workshop (made by :meth:`join`, once connected to Ray)."""

    def __init__(self, workshop: str, student: str, broker: Any, job_id: str) -> None:
        self.workshop = workshop
        self.student = student
        self.namespace = namespace_of(workshop)
        self.broker = broker
        self.job_id = job_id
        self.settings: dict[str, Any] = {}
        self.group: dict[str, Any] | None = None  # the group to reconnect to, from join
        self.pg: Any = None

    @classmethod
    def join(cls, workshop: str, student: str, say: Progress) -> Seat:
        """Find the broker and join; waits a few seconds for a group's last kernel to be seen gone."""
        ray = _ray()
        seat = cls(workshop, student, find_broker(workshop), ray.get_runtime_context().get_job_id())
        deadline = time.monotonic() + _TAKEOVER_WAIT_S
        while True:
            reply = seat._call("join", student, seat.job_id)
            if "busy" not in reply:
                break
            if time.monotonic() > deadline:
                raise WorkshopError(f"workshop {workshop!r}: {reply['busy']}")
            time.sleep(1.0)
        seat.settings = reply["settings"]
        seat.group, seat.pg = reply.get("group"), reply.get("pg")
        say(f"workshop {workshop!r}: student {student!r}, {seat.rules_text()}")
        return seat

    def _call(self, method: str, *args: Any, timeout: float = 30.0) -> Any:
        ray = _ray()
        try:
            return ray.get(getattr(self.broker, method).remote(*args), timeout=timeout)
        except ray.exceptions.RayActorError:
            raise WorkshopError(
                f"the broker of workshop {self.workshop!r} is gone (the teacher ended the workshop?)"
            ) from None

    def rules_text(self) -> str:
        s = self.settings
        quota = [
            f"{s[k]:g} {u}" for k, u in (("quota_cpus", "CPU"), ("quota_gpus", "GPU")) if s.get(k) is not None
        ]
        parts = [f"quota {', '.join(quota) if quota else 'none'}"]
        if s.get("budget_usd") is not None:
            parts.append(f"budget ${s['budget_usd']:g}")
        parts.append(f"idle stop {s.get('idle_stop_minutes', 15):g} min")
        return ", ".join(parts)

    def default_size(self, cluster_cpus: float, cluster_gpus: float) -> tuple[int, float, float]:
        """Two workers that share the quota (at most 1 CPU and 1 GPU each): the start without options."""
        workers = 2
        q_cpu, q_gpu = self.settings.get("quota_cpus"), self.settings.get("quota_gpus")
        cpus = min(1.0, max(0.1, int((q_cpu if q_cpu is not None else cluster_cpus) / workers * 10) / 10))
        gpus = 0.0
        if cluster_gpus and (q_gpu is None or q_gpu > 0):
            gpus = 1.0 if q_gpu is None else min(1.0, int(q_gpu / workers * 10) / 10) or 0.0
        return workers, cpus, gpus

    def reserve(self, size: int, bundle: dict[str, float], strategy: str) -> Any:
        reply = self._call("reserve", self.student, self.job_id, size, bundle, strategy)
        if "error" in reply:
            cls = {"quota": QuotaError, "budget": BudgetSpentError}.get(reply.get("kind"), WorkshopError)
            raise cls(reply["error"])
        return reply["pg"]

    def check(self, size: int, bundle: dict[str, float]) -> None:
        why = self._call("check", self.student, size, bundle)
        if why:
            raise QuotaError(why)

    def started(self, group: WorkerGroup) -> None:
        self._call("started", self.student, self.job_id, record_of(group, self.namespace))

    def release(self, why: str) -> None:
        self._call("release", self.student, why, timeout=10.0)

    def detach(self, why: str) -> None:
        self._call("detach", self.student, self.job_id, why, timeout=10.0)


def actor_name(student: str, generation: int, index: int) -> str:
    """The name of a student's worker actor in the workshop's namespace.

    >>> actor_name("alice", 2, 0)
    'alice:2:0'
    """
    return f"{student}:{generation}:{index}"


def record_of(group: WorkerGroup, namespace: str) -> dict[str, Any]:
    """What the broker keeps so that a new kernel can take the group over (plans pickled: opaque to it)."""
    return {
        "namespace": namespace,
        "actor_names": list(getattr(group, "actor_names", [])),
        "plans": pickle.dumps([(w.plan, w.meta) for w in group.workers]),
        "group_id": group.group_id,
        "generation": group.generation,
        "backend": group.backend,
        "backend_note": group.backend_note,
        "master": group.master,
        "cpus_per_worker": group.cpus_per_worker,
        "gpus_per_worker": group.gpus_per_worker,
        "size": group.size,
        "started_at": group.started_at,
    }


class StudentGroup(WorkerGroup):
    """A worker group placed by the workshop's broker, of detached workers named by the student's ID.

    ``start`` reconnects to the group the broker has for this student when there is one (its workers keep their
    state); otherwise it asks the broker for a reservation (quota and budget are checked there) and starts fresh
    workers in it. A scale is checked against the quota before any worker ends.
    """

    def __init__(self, seat: Seat, size: int, **kwargs: Any) -> None:
        super().__init__(size, **kwargs)
        self.seat = seat
        self.actor_names: list[str] = []
        self.reconnected = False
        self._reserved = False  # the broker made a reservation for this group

    def start(self, progress: Progress | None = None) -> StudentGroup:
        say = progress or (lambda msg: None)
        if self.seat.group is not None and self._reconnect(self.seat.group, say):
            return self
        try:
            super().start(progress)
        except BaseException:
            if self._reserved:  # the workers did not start: the quota is free again at once
                self.seat.release("the workers could not start")
            raise
        return self

    def _reconnect(self, rec: dict[str, Any], say: Progress) -> bool:
        """Take over the workers of the student's group (False, after freeing it, when one is gone)."""
        ray = _ray()
        try:
            actors = [ray.get_actor(n, namespace=rec["namespace"]) for n in rec["actor_names"]]
            ray.get([a.ping.remote() for a in actors], timeout=10)
        except Exception as exc:  # noqa: BLE001 - whatever Ray says, a worker is gone: start a fresh group
            say(f"your previous worker group is broken ({type(exc).__name__}): starting a fresh one")
            self.seat.release("a worker of the group was gone at reconnect")
            self.seat.group = None
            return False
        pairs = pickle.loads(rec["plans"])
        self.workers = [Worker(a, plan, meta) for a, (plan, meta) in zip(actors, pairs, strict=True)]
        self.actor_names = list(rec["actor_names"])
        self.size = len(self.workers)
        self.cpus_per_worker, self.gpus_per_worker = rec["cpus_per_worker"], rec["gpus_per_worker"]
        self.group_id, self.generation = rec["group_id"], rec["generation"]
        self.backend, self.backend_note, self.master = rec["backend"], rec["backend_note"], rec["master"]
        self.started_at = rec["started_at"]
        self._pg = self.seat.pg
        self.reconnected = True
        self.seat.started(self)  # this kernel holds the group now
        say(
            f"reconnected to your worker group ({self.size} worker(s), started "
            f"{time.strftime('%H:%M:%S', time.localtime(self.started_at or time.time()))}): the workers kept their "
            f"variables"
        )
        return True

    def _start(self, progress: Progress | None) -> WorkerGroup:
        super()._start(progress)
        self.seat.started(self)
        return self

    def _place(self, bundle: dict[str, float], say: Progress) -> None:
        """The broker checks the quota and the budget, then reserves; here we wait for the reservation."""
        impossible = _placement.impossible_request(self.size, bundle)
        if impossible:
            raise GroupError(impossible)
        pg = self.seat.reserve(self.size, bundle, self.strategy)
        self._reserved = True
        self._pg = pg  # before the wait: an interrupt during it removes the reservation
        if not _placement.wait_until_placed(pg, self.timeouts.placement, say):
            self._pg = None
            self.seat.release("its resources could not be placed in time")
            raise GroupError(_placement.placement_error(self.size, bundle, self.timeouts.placement, pg))

    def _spawn(self) -> None:
        """Detached workers, named by the student's ID in the workshop's namespace (a new kernel finds them)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        cls = remote_worker_class()
        self._spawned = []
        self.actor_names = [actor_name(self.seat.student, self.generation, i) for i in range(self.size)]
        for i, name in enumerate(self.actor_names):
            opts: dict[str, Any] = {
                "num_cpus": self.cpus_per_worker,
                "num_gpus": self.gpus_per_worker,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=i
                ),
                "name": name,
                "namespace": self.seat.namespace,
                "lifetime": "detached",
            }
            if self.runtime_env:
                opts["runtime_env"] = self.runtime_env
            self._spawned.append(cls.options(**opts).remote(self.group_id, self.env))

    def _rank_workers(self, actors: Any) -> list[Worker]:
        workers = super()._rank_workers(actors)
        # rank order, for the record: actor i was named actor_names[i]
        self.actor_names = [self.actor_names[w.plan.actor_index] for w in workers]
        return workers

    def resize(self, size: int, progress: Progress | None = None) -> None:
        """Checked against the quota first: a scale the broker would refuse leaves the workers as they are."""
        self.seat.check(size, _placement.worker_bundle(self.cpus_per_worker, self.gpus_per_worker))
        super().resize(size, progress)

    def detach(self) -> None:
        """Forget the workers without ending them (they wait for the student's next kernel)."""
        self.workers, self._spawned, self._pg = [], [], None


class Heartbeat:
    """A daemon thread that reports the kernel to the broker every ``period`` seconds and calls
    ``on_stop(why, keep)`` when the broker says the cluster must stop."""

    def __init__(
        self,
        seat: Seat,
        period: float,
        state: Callable[[], tuple[bool, float]],
        on_stop: Callable[[str, bool], None],
    ) -> None:
        self.seat = seat
        self.period = period
        self.state = state
        self.on_stop = on_stop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpu_notebook-workshop-heartbeat")

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            busy, last = self.state()
            try:
                reply = self.seat._call(
                    "heartbeat", self.seat.student, self.seat.job_id, busy, last, timeout=10.0
                )
            except WorkshopError as exc:  # the broker is gone: so is the reservation, and the workers with it
                reply = {"stop": str(exc)}
            except Exception:  # noqa: BLE001 - a missed beat (Ray busy) is retried at the next one
                continue
            if reply.get("warn"):
                print(f"gpu_notebook: workshop {self.seat.workshop!r}: {reply['warn']}", file=sys.stderr)
            if reply.get("stop"):
                self._stop.set()
                self.on_stop(str(reply["stop"]), bool(reply.get("keep")))
                return
