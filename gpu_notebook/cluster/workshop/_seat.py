"""A student's seat in a workshop: the kernel's side of the broker, and the worker group it places.

:class:`Seat` finds the workshop's broker by name and speaks to it; :class:`SeatPlacement` is the group's
:class:`~gpu_notebook.distributed.Placement` in a workshop: the broker reserves the resources (after checking the
quota and the budget), and the workers are detached, named actors in the workshop's namespace, so they outlive a
kernel restart. :class:`StudentGroup` is the ordinary :class:`~gpu_notebook.distributed.WorkerGroup` with that
placement, whose start first adopts the student's group when the broker has one (a restarted kernel gets its
workers back, variables and all).
:class:`Heartbeat` tells the broker every few seconds that the kernel is alive and whether a cell runs, and
stops the cluster when the broker says so (the teacher, the budget, the idle stop).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook.cluster._errors import ClusterError
from gpu_notebook.cluster._records import group_record, record_of
from gpu_notebook.cluster.workshop._broker import BROKER_NAME, namespace_of
from gpu_notebook.distributed import (
    GroupError,
    PlacementRequest,
    RayPlacement,
    WorkerGroup,
    impossible_request,
    placement_error,
    wait_until_placed,
)

__all__ = [
    "BudgetSpentError",
    "Heartbeat",
    "QuotaError",
    "Seat",
    "SeatPlacement",
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


class SeatPlacement(RayPlacement):
    """A student's placement: the broker reserves (after checking the quota and the budget) a placement group
    it owns, and the workers are detached actors named by the student's ID in the workshop's namespace, so they
    outlive the kernel and the student's next kernel finds them. Each start is reported to the broker (what a
    reconnect needs); freeing the reservation removes the broker's placement group, as a stop does."""

    def __init__(self, seat: Seat) -> None:
        super().__init__(
            seat.namespace
        )  # detached workers in the workshop's namespace, as a detached cluster's
        self.seat = seat
        self.reserved = False  # the broker made a reservation for this group

    def check(self, size: int, bundle: dict[str, float]) -> None:
        """The quota first (the broker says), then whether the cluster could ever hold it."""
        self.seat.check(size, bundle)
        super().check(size, bundle)

    def reserve(self, request: PlacementRequest, say: Progress) -> None:
        """The broker checks the quota and the budget, then reserves; here we wait for the reservation."""
        impossible = impossible_request(request.size, request.bundle)
        if impossible:
            raise GroupError(impossible)
        pg = self.seat.reserve(request.size, request.bundle, request.strategy)
        self.reserved = True
        self.reservation = pg  # before the wait: an interrupt during it removes the reservation
        if not wait_until_placed(pg, request.timeout, say):
            self.reservation = None
            self.seat.release("its resources could not be placed in time")
            raise GroupError(placement_error(request.size, request.bundle, request.timeout, pg))

    def actor_options(self, request: PlacementRequest, index: int) -> dict[str, Any]:
        """Detached workers, named by the student's ID in the workshop's namespace (a new kernel finds them)."""
        return {
            **super().actor_options(request, index),
            "name": actor_name(self.seat.student, request.generation, index),
        }

    def started(self, group: WorkerGroup) -> None:
        """This kernel holds the group now: the broker keeps its record for the next kernel."""
        self.seat.started(group)


class StudentGroup(WorkerGroup):
    """A worker group placed by the workshop's broker (:class:`SeatPlacement`), of detached workers named by the
    student's ID.

    ``start`` takes over (:meth:`~WorkerGroup.adopt`) the group the broker has for this student when there is
    one (its workers keep their state); otherwise it asks the broker for a reservation (quota and budget are
    checked there) and starts fresh workers in it. A scale is checked against the quota before any worker ends.
    """

    def __init__(self, seat: Seat, size: int, **kwargs: Any) -> None:
        placement = SeatPlacement(seat)
        super().__init__(size, placement=placement, **kwargs)
        self.placement: SeatPlacement = placement
        self.seat = seat
        self.reconnected = False

    def start(self, progress: Progress | None = None) -> StudentGroup:
        say = progress or (lambda msg: None)
        if self.seat.group is not None and self._reconnect(self.seat.group, say):
            return self
        try:
            super().start(progress)
        except BaseException:
            if self.placement.reserved:  # the workers did not start: the quota is free again at once
                self.seat.release("the workers could not start")
            raise
        return self

    def _reconnect(self, rec: dict[str, Any], say: Progress) -> bool:
        """Take over the workers of the student's group (False, after freeing it, when one is gone)."""
        try:
            self.adopt(group_record(rec, self.seat.pg))  # the broker hears that this kernel holds them
        except GroupError as exc:  # a worker is gone: start a fresh group
            cause = exc.__cause__ if exc.__cause__ is not None else exc
            say(f"your previous worker group is broken ({type(cause).__name__}): starting a fresh one")
            self.seat.release("a worker of the group was gone at reconnect")
            self.seat.group = None
            return False
        self.reconnected = True
        say(
            f"reconnected to your worker group ({self.size} worker(s), started "
            f"{time.strftime('%H:%M:%S', time.localtime(self.started_at or time.time()))}): the workers kept their "
            f"variables"
        )
        return True


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
