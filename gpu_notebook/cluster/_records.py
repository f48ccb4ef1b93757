"""A worker group's record, as plain data a keeper holds: what another kernel needs to take the workers over.

A workshop's broker (:mod:`gpu_notebook.cluster.workshop`) and a detached cluster's keeper
(:mod:`gpu_notebook.cluster._keeper`) both keep it for the kernel that comes next; both are Ray actors that need
no torch, so the rank plans travel pickled (opaque to them).
"""

from __future__ import annotations

import pickle
from typing import Any

from gpu_notebook.distributed import GroupRecord, WorkerGroup

__all__ = ["group_record", "record_of"]


def record_of(group: WorkerGroup, namespace: str) -> dict[str, Any]:
    """What the broker keeps so that a new kernel can take the group over (plans pickled: opaque to it)."""
    rec = group.record()
    return {
        "namespace": namespace,
        "actor_names": rec.actor_names,
        "plans": pickle.dumps(rec.ranks),
        "group_id": rec.group_id,
        "generation": rec.generation,
        "backend": rec.backend,
        "backend_note": rec.backend_note,
        "master": rec.master,
        "cpus_per_worker": rec.cpus_per_worker,
        "gpus_per_worker": rec.gpus_per_worker,
        "size": rec.size,
        "started_at": rec.started_at,
    }


def group_record(rec: dict[str, Any], reservation: Any) -> GroupRecord:
    """The broker's record of a group (:func:`record_of`), for :meth:`WorkerGroup.adopt`."""
    return GroupRecord(
        actor_names=list(rec["actor_names"]),
        ranks=pickle.loads(rec["plans"]),
        group_id=rec["group_id"],
        generation=rec["generation"],
        backend=rec["backend"],
        backend_note=rec["backend_note"],
        master=rec["master"],
        cpus_per_worker=rec["cpus_per_worker"],
        gpus_per_worker=rec["gpus_per_worker"],
        started_at=rec["started_at"],
        namespace=rec["namespace"],
        reservation=reservation,
    )
