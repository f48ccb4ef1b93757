"""A student's cluster: the address-connected :class:`~gpu_notebook.cluster.Cluster`, placed by the workshop.

``%gpu_cluster start --address HOST:PORT --workshop NAME --student ID`` makes a :class:`WorkshopCluster`: it
connects as any ``--address`` cluster does, then joins the workshop's broker (:mod:`._seat`), which places its
worker group inside the student's quota. What differs from a plain cluster:

- the workers outlive the kernel: a kernel restart (or crash) leaves them for the next kernel with the same
  ``--student`` ID, which reconnects to them with their variables, until the workshop's idle stop reclaims them;
- ``%gpu_cluster stop`` (and ``Cluster.stop``) ends them and frees the student's quota;
- the broker may stop the cluster (the teacher, the budget, the idle stop): a heartbeat thread hears it and
  stops the cluster here, and a running cell ends as "cluster stopped" with the reason.
"""

from __future__ import annotations

import re
import sys
from typing import Any

from gpu_notebook._display import Progress
from gpu_notebook._registry import ClusterManager, get_manager
from gpu_notebook.cluster import _connect
from gpu_notebook.cluster._cluster import Cluster
from gpu_notebook.cluster.providers import AddressProvider, ProviderCluster
from gpu_notebook.cluster.workshop._seat import Heartbeat, Seat, StudentGroup, WorkshopError
from gpu_notebook.distributed import WorkerGroup

__all__ = ["KERNEL_EXIT", "WorkshopCluster", "check_id"]

#: the reason the kernel's exit hook gives its clusters' stop (see gpu_notebook._registry): a workshop cluster
#: keeps its workers then, for the next kernel
KERNEL_EXIT = "kernel exit"


def check_id(value: str, what: str) -> str:
    """A workshop or student ID: 1-63 letters, digits, ``_``, ``.``, ``-`` (it names Ray actors and groups).

    >>> check_id("alice_1", "student ID")
    'alice_1'
    """
    if not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", value):
        raise ValueError(
            f"a {what} is 1-63 letters, digits, '_', '.' and '-', starting with a letter or digit, not {value!r}"
        )
    return value


class WorkshopProvider(AddressProvider):
    """The teacher's cluster, reached by address: named ``WORKSHOP-STUDENT``."""

    kind = "workshop"

    def default_name(self, cluster: ProviderCluster, taken: ClusterManager[Any]) -> str:
        assert isinstance(cluster, WorkshopCluster)
        return taken.unique_name(f"{cluster.workshop}-{cluster.student}")


_WORKSHOP = WorkshopProvider()


class WorkshopCluster(Cluster):
    """A student's cluster in a workshop (see the module docstring).

    Parameters
    ----------
    workshop, student
        The workshop's name (the teacher gives it) and this student's ID (any name of yours; the same ID
        reconnects to your workers after a kernel restart).
    address
        The teacher's cluster (``host:port``); ``RAY_ADDRESS`` when not given.
    **kwargs
        As for :class:`~gpu_notebook.cluster.Cluster` (``workers``, ``cpus_per_worker``, ...): without them, two
        workers that share the quota.

    Examples
    --------
    >>> c = WorkshopCluster("ml101", "alice", address="10.0.0.5:6379").start()   # doctest: +SKIP
    """

    def __init__(self, workshop: str, student: str, address: str | None = None, **kwargs: Any) -> None:
        check_id(workshop, "workshop name")
        check_id(student, "student ID")
        if address is None and not _ray_address_set():
            raise ValueError(
                "a workshop cluster needs the teacher's cluster: give --address HOST:PORT (the address the "
                "teacher handed out)"
            )
        if address == "local":
            raise ValueError("--workshop needs the teacher's cluster (--address HOST:PORT), not a local Ray")
        super().__init__(address=address, **kwargs)
        self.workshop = workshop
        self.student = student
        self.seat: Seat | None = None
        self._beat: Heartbeat | None = None
        self._progress: Progress = lambda msg: None  # the start's, for what joining the workshop says

    @property
    def provider(self) -> AddressProvider:
        return _WORKSHOP

    def _size_workers(self) -> tuple[int, float, float]:
        """Join the workshop (connected now); a group to reconnect to has its own size, else two workers
        that share the quota unless the student said otherwise."""
        import ray

        self.seat = Seat.join(self.workshop, self.student, self._progress)
        group = self.seat.group
        if group is not None:
            size = int(group["size"])
            if self.settings.resources.workers not in (None, size):
                self._progress(
                    f"your worker group has {size} worker(s), kept as they are: %gpu_cluster scale "
                    f"{self.settings.resources.workers} changes it"
                )
            return size, float(group["cpus_per_worker"]), float(group["gpus_per_worker"])
        total = ray.cluster_resources()
        workers, cpus, gpus = self.seat.default_size(float(total.get("CPU", 1)), float(total.get("GPU", 0)))
        asked = self.settings.resources
        if asked.workers is not None:
            workers = asked.workers
            if asked.cpus_per_worker is None and self.seat.settings.get("quota_cpus") is not None:
                cpus = min(1.0, max(0.1, int(self.seat.settings["quota_cpus"] / workers * 10) / 10))
        return (
            workers,
            asked.cpus_per_worker if asked.cpus_per_worker is not None else cpus,
            asked.gpus_per_worker if asked.gpus_per_worker is not None else gpus,
        )

    def _new_group(self, workers: int, **kwargs: Any) -> WorkerGroup:
        assert self.seat is not None
        return StudentGroup(self.seat, workers, **kwargs)

    def start(self, progress: Progress | None = None) -> WorkshopCluster:
        """Connect, join the workshop, reconnect to this student's workers or start them inside the quota."""
        if self.state == "running":
            return self
        for c in get_manager().list():  # one cluster per student and kernel: two would share the workers
            if (
                isinstance(c, WorkshopCluster)
                and c.running
                and (c.workshop, c.student) == (self.workshop, self.student)
            ):
                raise WorkshopError(
                    f"student {self.student!r} of workshop {self.workshop!r} is already connected in this kernel: "
                    f"cluster {c.name!r}"
                )
        self._progress = progress or (lambda msg: None)
        super().start(progress)
        assert self.seat is not None
        period = float(self.seat.settings.get("heartbeat_s", 5.0))
        self._beat = Heartbeat(self.seat, period, self._activity, self._stopped_by_broker).start()
        return self

    @property
    def reconnected(self) -> bool:
        """Whether the start took over workers that an earlier kernel of this student started."""
        return bool(isinstance(self.group, StudentGroup) and self.group.reconnected)

    def _activity(self) -> tuple[bool, float]:
        return self.busy, self.last_activity

    def _stopped_by_broker(self, why: str, keep: bool) -> None:
        print(
            f"gpu_notebook: workshop {self.workshop!r}: cluster {self.name!r} stopped: {why}", file=sys.stderr
        )
        self.stop(why, keep_workers=keep, tell_broker=not keep)  # keep: another kernel has them now

    def stop(
        self, reason: str = "stopped by the user", keep_workers: bool | None = None, tell_broker: bool = True
    ) -> str:
        """End the workers and free the quota; at kernel exit (or ``keep_workers=True``) leave them running for
        the student's next kernel instead (the workshop's idle stop reclaims them if none comes)."""
        if self.state != "running":
            return super().stop(reason)
        keep = reason == KERNEL_EXIT if keep_workers is None else keep_workers
        if self._beat is not None:
            self._beat.stop()
        group, seat, n = self.group, self.seat, self.world_size
        if keep and isinstance(group, StudentGroup):
            group.detach()
            self.group = None  # nothing for the base's stop to end
        elif group is not None:
            group.stop(reason)  # first: a running cell ends as "cluster stopped", not as dead workers
        if seat is not None and tell_broker:
            try:
                seat.detach(reason) if keep else seat.release(reason)
            except Exception as exc:  # noqa: BLE001 - the broker gone must not keep the cluster from stopping
                print(f"gpu_notebook: workshop {self.workshop!r}: {exc}", file=sys.stderr)
        msg = super().stop(reason)
        if keep:
            msg = (
                f"cluster {self.name!r} disconnected: its {n} worker(s) keep running for your next kernel "
                f"(%gpu_cluster start ... --student {self.student}) until the workshop's idle stop"
            )
        return msg


def _ray_address_set() -> bool:
    return _connect.address_from_env() is not None
