"""Handing a running group's workers over to another kernel: what it needs to know, and finding them live.

A group whose workers are named actors that outlive the kernel (a workshop student's, or a cluster detached from
one kernel to be attached in another) is described by a :class:`GroupRecord`; the next kernel's
:meth:`WorkerGroup.adopt <gpu_notebook.distributed.WorkerGroup.adopt>` takes the workers over with their state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_notebook.distributed._errors import GroupError
from gpu_notebook.distributed._ranks import RankPlan
from gpu_notebook.distributed._worker import Worker, WorkerMeta

__all__ = ["GroupRecord", "live_workers"]


@dataclass(frozen=True)
class GroupRecord:
    """What another kernel needs to take a running group's workers over (:meth:`WorkerGroup.adopt`).

    The workers are named actors: the record names them, and keeps what the group learnt when it started them.
    """

    actor_names: list[str]  # the workers' Ray actor names, in rank order
    ranks: list[tuple[RankPlan, WorkerMeta]]  # each rank's plan and what its process reported, in rank order
    group_id: str
    generation: int  # the group's start count (names its workers and reservation)
    backend: str | None  # torch.distributed's backend, initialised on the workers
    backend_note: str  # why the backend is not NCCL
    master: tuple[str, int] | None  # rank 0's rendezvous address
    cpus_per_worker: float
    gpus_per_worker: float
    started_at: float | None
    namespace: str | None = None  # the Ray namespace of the named workers (None: the kernel's own)
    reservation: Any = None  # what the workers run in (a Ray placement group), taken over by the placement

    @property
    def size(self) -> int:
        return len(self.actor_names)


def live_workers(record: GroupRecord) -> list[Worker]:
    """The records of the workers ``record`` names, in rank order, each found by name and answering; a
    :class:`GroupError` when one is gone."""
    import ray

    try:
        actors = [ray.get_actor(n, namespace=record.namespace) for n in record.actor_names]
        ray.get([a.ping.remote() for a in actors], timeout=10)
    except Exception as exc:  # noqa: BLE001 - whatever Ray raises, a worker is gone: the caller decides
        raise GroupError(f"a worker of the group to take over is gone ({type(exc).__name__}: {exc})") from exc
    return [Worker(a, plan, meta) for a, (plan, meta) in zip(actors, record.ranks, strict=True)]
