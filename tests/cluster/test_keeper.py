"""The keeper of a detached cluster, as plain Python (no Ray): who holds the workers, the cell, and the guards'
arithmetic on a fake clock. The same class runs as the Ray actor in tests/cluster/test_detach.py."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_notebook.cluster._keeper import SILENT_S, Keeper, namespace_of

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _keeper(**info: Any) -> tuple[Keeper, Clock]:
    clock = Clock()
    k = Keeper({"name": "run1", "kind": "local", **info}, clock=clock, start=False)
    k._cell_running = lambda: False  # type: ignore[method-assign]  # no workers to ask here
    return k, clock


def test_a_second_kernel_is_refused_naming_the_holder_until_it_takes_over() -> None:
    k, clock = _keeper()
    assert k.hold("job-a", {"host": "laptop", "pid": 11})["ok"]
    refused = k.hold("job-b", {"host": "laptop", "pid": 22})
    assert refused["held_by"]["pid"] == 11 and refused["held_by"]["job_id"] == "job-a"
    taken = k.hold("job-b", {"host": "laptop", "pid": 22}, take=True)
    assert taken["ok"] and k.holder is not None and k.holder["taken_from"]["pid"] == 11
    # the first kernel's next heartbeat hears it: it lets go, without ending the workers
    assert k.heartbeat("job-a", False, clock.now)["taken"]["pid"] == 22
    assert k.heartbeat("job-b", False, clock.now) == {}


def test_a_silent_holder_counts_as_gone_and_a_released_one_at_once() -> None:
    k, clock = _keeper()
    k.hold("job-a", {"pid": 11})
    clock.now += SILENT_S + 1
    assert k.hold("job-b", {"pid": 22})["ok"]  # no take needed: job-a has not beaten for SILENT_S
    k.release("job-b", "its kernel exited")
    assert k.describe()["holder"]["alive"] is False
    assert k.hold("job-c", {"pid": 33})["ok"]


def test_the_budget_is_charged_by_the_hour_and_stops_the_cluster() -> None:
    k, clock = _keeper(usd_per_hour=36.0, budget_usd=0.1)
    k.hold("job-a", {"pid": 11})
    clock.now += 5.0
    assert k.tick() is None and k.spent == pytest.approx(0.05)
    clock.now += 5.0
    why = k.tick()
    assert why is not None and "budget of $0.1 is spent" in why
    # the holder's heartbeat may change the rate (a node joined): charged from the next tick
    k2, clock2 = _keeper(usd_per_hour=0.0, budget_usd=1.0)
    k2.hold("job-a", {"pid": 11})
    k2.heartbeat("job-a", True, clock2.now, usd_per_hour=3600.0)
    clock2.now += 2.0
    assert k2.tick() is not None


def test_the_idle_stop_counts_from_the_last_cell() -> None:
    k, clock = _keeper(idle_stop_minutes=1.0)
    k.hold("job-a", {"pid": 11})
    k.cell_started("job-a", {"name": "7", "label": "cell In[7]"})
    clock.now += 600  # a cell runs: never idle
    k.heartbeat("job-a", True, clock.now)
    assert k.tick() is None
    k.cell_ended("job-a")
    clock.now += 59
    k.heartbeat("job-a", False, clock.now - 59)
    assert k.tick() is None and k.describe()["idle_stop_in_s"] == pytest.approx(1.0)
    clock.now += 2
    k.heartbeat("job-a", False, clock.now - 61)
    assert k.tick() == "idle for 1 min"


def test_the_cell_and_its_out_name_are_kept_for_the_next_kernel() -> None:
    k, _ = _keeper()
    k.hold("job-a", {"pid": 11})
    k.cell_started("job-a", {"name": "7", "label": "cell In[7]"})
    k.cell_note("job-a", "7", {"out": "losses"})
    k.cell_note("job-b", "7", {"out": "other"})  # not the holder: ignored
    got = k.hold("job-b", {"pid": 22}, take=True)
    assert (
        got["cell"]["label"] == "cell In[7]"
        and got["cell"]["out"] == "losses"
        and got["cell"]["ended"] is None
    )


def test_a_stopping_cluster_cannot_be_attached() -> None:
    k, _ = _keeper()
    k.state, k.why = "stopping", "idle for 30 min"
    assert k.hold("job-a", {"pid": 11}) == {"error": "the cluster is stopping (idle for 30 min)"}


def test_a_cloud_cluster_is_torn_down_by_its_holder_if_it_can_else_by_the_keeper() -> None:
    k, clock = _keeper(kind="cloud:aws", usd_per_hour=36.0, cloud={"cloud": "aws", "head_config": "~/c.yaml"})
    k.hold("job-a", {"pid": 11, "tears_down": True})  # the launching kernel: it has the saved state
    assert k.kernel_tears_down()
    k.heartbeat("job-a", False, clock.now, None)  # a kernel that cannot price the nodes leaves the rate alone
    assert k.info["usd_per_hour"] == 36.0
    k.release("job-a", "its kernel exited")
    assert not k.kernel_tears_down()  # nobody attached: the keeper tears it down from the head
    k.hold("job-b", {"pid": 22, "tears_down": False})  # attached from elsewhere (--address): no saved state
    assert not k.kernel_tears_down()


def test_the_namespace_names_the_cluster() -> None:
    assert namespace_of("run1") == "gpu_notebook-cluster-run1"
