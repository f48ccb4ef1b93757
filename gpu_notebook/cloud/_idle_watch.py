"""Head-node idle auto-stop: tear the whole cluster down after N idle minutes.

Ray's ``idle_timeout_minutes`` only removes idle *workers*; the head (and ``min_workers``) keep billing
forever. The launcher starts this module on the head after ``ray start``::

    python -m gpu_notebook.cloud._idle_watch --minutes 60 --config ~/ray_bootstrap_config.yaml

(``--down`` instead of ``--minutes`` tears it down at once: a detached cluster's keeper does so when its guards
stop it.)

Idle means what a user means (see :func:`activity`): no notebook cell running on our workers, no resources
held by anything but our own reservations, and the GPUs (the CPUs on a CPU-only cluster) under a threshold.
The persistent workers of a notebook hold their CPUs and GPUs for as long as the notebook keeps its cluster,
and our samplers run on every node: neither is use. After ``minutes`` of continuous idleness it runs Ray's
teardown with the head's bootstrap config, which terminates every node including the head.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook import monitor as gpu_monitor

from . import _ray_compat

#: placement groups and actors of our worker groups are named with these (see distributed/_group.py); a
#: workshop's student workers live in a namespace of ours instead (``gpu_notebook-workshop-NAME``)
OUR_GROUP_PREFIX = "gpu_notebook-"
OUR_WORKER_PREFIX = "gpu_notebook:"
OUR_NAMESPACE_PREFIX = "gpu_notebook-"
#: utilisation (percent) at or over which the cluster is in use: the busiest GPU, or CPU without GPUs
GPU_THRESHOLD = 5.0
CPU_THRESHOLD = 10.0


@dataclass
class Activity:
    """What one look at the cluster found (:func:`activity`); :attr:`busy` is the verdict."""

    cells_running: int = 0  # our workers running a cell or call (or not answering: counted as running)
    held_by_others: dict[str, float] = field(default_factory=dict)  # CPU/GPU held beyond our reservations
    utilisation: float | None = None  # busiest GPU %, or busiest node's CPU % (kind "cpu"); None: no samples
    kind: str = "gpu"

    @property
    def threshold(self) -> float:
        return GPU_THRESHOLD if self.kind == "gpu" else CPU_THRESHOLD

    @property
    def busy(self) -> bool:
        return bool(
            self.cells_running
            or any(v > 1e-6 for v in self.held_by_others.values())
            or (self.utilisation is not None and self.utilisation >= self.threshold)
        )

    def __str__(self) -> str:
        held = ", ".join(f"{v:g} {k}" for k, v in self.held_by_others.items() if v > 1e-6)
        util = "no samples yet" if self.utilisation is None else f"{self.utilisation:.0f}%"
        return (
            f"{'busy' if self.busy else 'idle'}: {self.cells_running} cell(s) running, "
            f"{held or 'nothing'} held besides our workers, {self.kind.upper()} {util}"
        )


def our_reservations(table: dict[str, Any]) -> dict[str, float]:
    """CPU and GPU reserved by our worker groups' placement groups in ``ray.util.placement_group_table()``."""
    out = {"CPU": 0.0, "GPU": 0.0}
    for pg in table.values():
        if not str(pg.get("name", "")).startswith(OUR_GROUP_PREFIX) or pg.get("state") != "CREATED":
            continue
        for bundle in (pg.get("bundles") or {}).values():
            for k in out:
                out[k] += float(bundle.get(k, 0.0))
    return out


def held_by_others(
    total: dict[str, float], avail: dict[str, float], ours: dict[str, float]
) -> dict[str, float]:
    """CPU/GPU in use beyond our reservations (a user's own Ray tasks, another job's actors)."""
    return {
        k: max(0.0, total.get(k, 0.0) - avail.get(k, 0.0) - ours.get(k, 0.0))
        for k in ("CPU", "GPU")
        if total.get(k, 0.0) > 0
    }


def cells_running(timeout: float = 10.0) -> int:
    """How many of our workers (named actors, any namespace) run a cell or call now.

    ``ping`` runs in the workers' control concurrency group, so it answers while a cell runs; a worker that
    does not answer within ``timeout`` counts as running (an idle stop must never guess idle).
    """
    import ray

    refs: list[Any] = []
    for entry in ray.util.list_named_actors(all_namespaces=True):  # [{"name": ..., "namespace": ...}]
        name, namespace = str(entry["name"]), str(entry.get("namespace") or "")
        if not (name.startswith(OUR_WORKER_PREFIX) or namespace.startswith(OUR_NAMESPACE_PREFIX)):
            continue
        try:
            handle = ray.get_actor(name, namespace=namespace or None)
            refs.append(handle.ping.remote())
        except ValueError:  # it ended between the listing and now
            continue
        except AttributeError:  # an actor of ours that is no worker (a workshop's broker): runs no cells
            continue
    if not refs:
        return 0
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    running = len(pending)
    for ref in ready:
        try:
            running += bool(ray.get(ref).get("busy"))
        except Exception:  # noqa: BLE001 - a worker that died meanwhile (RayActorError) runs nothing
            pass
    return running


class _RayNodes:
    """The connected Ray cluster as :class:`~gpu_notebook.monitor.Monitor` needs it (``ray_nodes()``)."""

    def ray_nodes(self) -> list[dict[str, Any]]:
        import ray

        return [n for n in ray.nodes() if n.get("Alive")]


def utilisation_monitor(interval: float = 5.0, window_s: float = 120.0, **kwargs: Any) -> Any:
    """A started :class:`~gpu_notebook.monitor.Monitor` of every node of the connected cluster (zero-CPU
    samplers, so it neither waits for the workers nor keeps an autoscaled node alive)."""
    return gpu_monitor.Monitor(
        _RayNodes(), interval=interval, pull_interval=interval, history_s=window_s, **kwargs
    ).start()


def activity(monitor: Any = None, window_s: float = 60.0, ping_timeout: float = 10.0) -> Activity:
    """One look at the (already connected) Ray cluster: cells running, resources held beyond our own
    reservations, and (with ``monitor``) the busiest GPU's, or without GPUs the busiest CPU's, utilisation."""
    import ray

    total = ray.cluster_resources()
    avail = ray.available_resources()
    ours = our_reservations(ray.util.placement_group_table())
    act = Activity(
        cells_running=cells_running(ping_timeout), held_by_others=held_by_others(total, avail, ours)
    )
    if monitor is not None:
        act.kind, act.utilisation = gpu_monitor.busiest_utilisation(
            gpu_monitor.utilisation_summary(monitor, window_s)
        )
    return act


def ray_busy(monitor: Any = None, window_s: float = 60.0) -> bool:
    """True while the (already connected) Ray cluster is in use; see :func:`activity`."""
    return activity(monitor, window_s).busy


@dataclass
class IdleTracker:
    """Decides when the cluster has been idle long enough (pure logic, tested without Ray)."""

    minutes: float
    idle_since: float | None = None

    def update(self, busy: bool, now: float) -> bool:
        """Record one observation; True once idle for ``minutes`` without a busy observation."""
        if busy:
            self.idle_since = None
            return False
        if self.idle_since is None:
            self.idle_since = now
        return now - self.idle_since >= self.minutes * 60.0


def run(
    minutes: float,
    config_path: str,
    busy: Callable[[], bool],
    teardown: Callable[[str], None],
    poll_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    max_polls: int | None = None,
) -> bool:
    """Poll ``busy`` until idle for ``minutes``, then ``teardown(config_path)``; True if it tore down."""
    tracker = IdleTracker(minutes)
    polls = 0
    while max_polls is None or polls < max_polls:
        polls += 1
        try:
            is_busy = busy()
        # can't tell (Ray restarting, GCS busy, anything): never stop a cluster on an error
        except Exception:  # noqa: BLE001
            is_busy = True
        if tracker.update(is_busy, clock()):
            print(f"idle for {minutes:g} min: tearing the cluster down", flush=True)
            teardown(config_path)
            return True
        sleep(poll_s)
    return False


def _teardown(config_path: str) -> None:
    import os

    import yaml

    with open(os.path.expanduser(config_path)) as f:
        config = yaml.safe_load(f)
    _ray_compat.teardown_cluster(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float)
    parser.add_argument("--config", default="~/ray_bootstrap_config.yaml")
    parser.add_argument("--poll", type=float, default=30.0)
    parser.add_argument(
        "--down", action="store_true", help="tear down now (a detached cluster's guard fired)"
    )
    args = parser.parse_args(argv)
    if args.down:
        print(f"tearing the cluster down ({args.config})", flush=True)
        _teardown(args.config)
        print("teardown done", flush=True)
        return 0
    if args.minutes is None:
        parser.error("--minutes is required (or --down)")
    import ray

    ray.init(address="auto", log_to_driver=False)
    mon = utilisation_monitor(interval=min(5.0, args.poll), window_s=max(60.0, 2 * args.poll))

    def busy() -> bool:
        act = activity(mon, window_s=max(args.poll, 10.0))
        print(act, flush=True)
        return act.busy

    run(args.minutes, args.config, busy, _teardown, poll_s=args.poll)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
