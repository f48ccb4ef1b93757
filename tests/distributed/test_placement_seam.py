"""The placement seam of WorkerGroup: a placement of our own places the workers, and a second group adopts them.

A placement here reserves through the default (a Ray placement group), but names its workers and makes them
detached in a namespace of its own, so that they outlive the group that started them: what a workshop seat and a
detached cluster do. A second group, as a restarted kernel would, adopts them from the first's record and finds
the variables the first set.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from gpu_notebook._display import Progress
from gpu_notebook.distributed import GroupError, Placement, PlacementRequest, RayPlacement, WorkerGroup

pytestmark = pytest.mark.slow


class NamedPlacement(RayPlacement):
    """Detached workers named in a namespace of their own; every call the group makes is written down."""

    def __init__(self, namespace: str) -> None:
        super().__init__()
        self.namespace = namespace
        self.calls: list[str] = []

    def check(self, size: int, bundle: dict[str, float]) -> None:
        self.calls.append(f"check {size}")
        super().check(size, bundle)

    def reserve(self, request: PlacementRequest, say: Progress) -> None:
        self.calls.append(f"reserve {request.size}")
        super().reserve(request, say)

    def actor_options(self, request: PlacementRequest, index: int) -> dict[str, Any]:
        self.calls.append(f"options {index}")
        return {
            **super().actor_options(request, index),
            "name": f"seam-{request.generation}-{index}",
            "namespace": self.namespace,
            "lifetime": "detached",
        }

    def started(self, group: WorkerGroup) -> None:
        self.calls.append(f"started {group.size}")

    def release(self) -> None:
        self.calls.append("release" if self.reservation is not None else "release nothing")
        super().release()


def test_a_placement_of_our_own_places_the_workers_and_another_group_adopts_them(ray_session):
    namespace = f"seam-{uuid.uuid4().hex[:8]}"
    first = NamedPlacement(namespace)
    assert isinstance(first, Placement)  # the contract, as typing sees it: a structural match
    group = WorkerGroup(2, cpus_per_worker=0.5, backend="gloo", placement=first)
    adopted: WorkerGroup | None = None
    try:
        group.start()
        assert first.calls == ["reserve 2", "check 2", "options 0", "options 1", "started 2"]
        assert sorted(group.actor_names) == ["seam-1-0", "seam-1-1"] and group.actor_namespace == namespace
        group.run("import torch.distributed as dist; x = 40 + dist.get_rank()")
        record = group.record()
        assert record.reservation is first.reservation is not None and record.size == 2

        # the kernel goes; its workers and their reservation stay
        group.detach()
        assert group.workers == [] and first.reservation is None

        second = NamedPlacement(namespace)
        adopted = WorkerGroup(1, backend="gloo", placement=second).adopt(record)
        assert second.calls == ["started 2"] and second.reservation is record.reservation
        assert (adopted.size, adopted.group_id, adopted.backend) == (2, group.group_id, "gloo")
        assert list(adopted.run("x").values) == [40, 41]  # the workers kept their variables
        reduced = adopted.run("dist.all_reduce(t := __import__('torch').ones(1)); t.item()")
        assert list(reduced.values) == [2, 2]  # and their process group

        # a scale is checked first, then reserves anew; a stop frees the reservation the group took over
        adopted.resize(1)
        assert second.calls[1:] == ["check 1", "release", "reserve 1", "check 1", "options 0", "started 1"]
        adopted.stop()
        assert second.calls[-1] == "release" and second.reservation is None

        # the first group's workers are gone with their reservation: adopting them again fails, taking nothing
        late = WorkerGroup(1, placement=NamedPlacement(namespace))
        with pytest.raises(GroupError, match="a worker of the group to take over is gone"):
            late.adopt(record)
        assert late.workers == [] and late.placement.reservation is None
    finally:
        group.stop()
        if adopted is not None:
            adopted.stop()
