"""Placing a group's workers: one resource bundle per worker, reserved together in a Ray placement group.

The group reserves every worker's resources before it starts any worker, so a group that does not fit fails
in one clear message (what was asked, what there is, what to change) instead of leaving some ranks waiting.
Two cases differ:

- a request larger than the whole cluster, on a cluster that cannot grow (a local Ray, or a cluster reached
  by address whose autoscaler cannot launch nodes), can never be placed: it fails at once, naming what is
  missing and what would fit (:func:`never_fits`);
- a request that fits the cluster but not what is free now (another notebook holds the rest), or any request
  on a cluster that can grow, waits with progress up to a deadline, then says who holds what
  (:func:`placement_error`).

Whether a cluster can grow is what its autoscaler says in the GCS (:func:`cluster_can_grow`): every Ray head
runs one, and without a cluster config (``ray start --head``, ``ray.init()``) it uses Ray's read-only provider,
which launches nothing and names each node type after the node's id.

Where the resources come from is the group's :class:`Placement`, its one seam: the default,
:class:`RayPlacement`, makes the group's own placement group; another implementation (a workshop's seat, whose
broker reserves inside a quota) plugs in by meeting the same contract.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpu_notebook._display import Progress
from gpu_notebook.distributed._errors import GroupError

if TYPE_CHECKING:  # for the annotations only: the group imports this module
    from gpu_notebook.distributed._group import WorkerGroup

__all__ = [
    "Placement",
    "PlacementRequest",
    "RayPlacement",
    "available_text",
    "bundles_that_fit",
    "cluster_can_grow",
    "fmt_bundle",
    "holders_text",
    "impossible_request",
    "never_fits",
    "node_resources",
    "placement_error",
    "wait_until_placed",
    "worker_bundle",
]

#: the node type names of Ray's read-only autoscaler provider: ``node_`` and the node's id (28 bytes, in hex)
_READONLY_NODE_TYPE = re.compile(r"node_[0-9a-f]{56}")
#: the flag that changes each resource of a worker
_FLAGS = {"CPU": "--cpus-per-worker", "GPU": "--gpus-per-worker"}


def worker_bundle(cpus: float, gpus: float) -> dict[str, float]:
    """The resources of one worker, as a placement-group bundle.

    Ray refuses an empty bundle, so a worker asking for nothing reserves a sliver of a CPU.

    >>> worker_bundle(1, 0), worker_bundle(0, 1), worker_bundle(0, 0)
    ({'CPU': 1}, {'GPU': 1}, {'CPU': 0.001})
    """
    bundle: dict[str, float] = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    if not cpus:
        bundle = {k: v for k, v in bundle.items() if v} or {"CPU": 0.001}
    return bundle


def fmt_bundle(bundle: Mapping[str, float]) -> str:
    """``"0.5 CPU, 1 GPU"``."""
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items())


def bundles_that_fit(nodes: Sequence[Mapping[str, float]], bundle: Mapping[str, float]) -> int:
    """How many ``bundle``s the ``nodes`` (each node's total resources) can hold, each bundle on one node.

    What a PACK or SPREAD placement group can get at most; a bundle never straddles two nodes.

    >>> bundles_that_fit([{"CPU": 2}, {"CPU": 3}], {"CPU": 1.5})
    3
    >>> bundles_that_fit([{"CPU": 8}], {"CPU": 1, "GPU": 1})
    0
    """
    total = 0
    for node in nodes:
        per_node = min(
            math.floor(node.get(k, 0.0) / v + 1e-9) if v > 0 else math.inf for k, v in bundle.items()
        )
        total += int(per_node) if per_node != math.inf else 0
    return total


def _largest_share(
    nodes: Sequence[Mapping[str, float]], bundle: Mapping[str, float], key: str, size: int
) -> float | None:
    """The most of resource ``key`` each of ``size`` workers can have (the rest of ``bundle`` as it is), in
    hundredths; None when not even 0.01 fits."""
    total = sum(n.get(key, 0.0) for n in nodes)
    share = math.floor(total / size * 100) / 100
    while share >= 0.01:
        if bundles_that_fit(nodes, {**bundle, key: share}) >= size:
            return share
        share = round(share - 0.01, 2)
    return None


def never_fits(size: int, bundle: Mapping[str, float], nodes: Sequence[Mapping[str, float]]) -> str | None:
    """Why ``size`` workers of ``bundle`` can never be placed on ``nodes`` as they are (each node's total
    resources), and what would fit; None when they fit.

    >>> print(never_fits(8, {"CPU": 1}, [{"CPU": 2}]))
    8 workers x 1 CPU need 8 CPU; this cluster has 2 CPU in all (1 node) and cannot grow: use --workers 2 or --cpus-per-worker 0.25
    >>> never_fits(2, {"CPU": 1}, [{"CPU": 2}]) is None
    True
    """
    fit = bundles_that_fit(nodes, bundle)
    if fit >= size:
        return None
    need = ", ".join(f"{size * v:g} {k}" for k, v in bundle.items())
    have = ", ".join(f"{sum(n.get(k, 0.0) for n in nodes):g} {k}" for k in bundle)
    options = [f"--workers {fit}"] if fit >= 1 else []
    for key, flag in _FLAGS.items():
        if bundle.get(key, 0) > 0:
            share = _largest_share(nodes, bundle, key, size)
            if share is not None and share < bundle[key]:
                options.append(f"{flag} {share:g}")
    what = "use " + " or ".join(options) if options else "add nodes that have these resources"
    where = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    return (
        f"{size} worker{'s' if size != 1 else ''} x {fmt_bundle(bundle)} need{'s' if size == 1 else ''} {need}; "
        f"this cluster has {have} in all ({where}) "
        f"and cannot grow: {what}"
    )


def node_resources() -> list[dict[str, float]]:
    """Each alive node's total resources (Ray's ``ray.nodes()``)."""
    import ray

    return [dict(n.get("Resources", {})) for n in ray.nodes() if n.get("Alive")]


def cluster_can_grow() -> bool:
    """Whether the connected Ray cluster's autoscaler can add nodes; True when it cannot be told.

    The autoscaler (v1) writes its status into the GCS every few seconds. A status whose node types are all
    the read-only provider's (or no status: no autoscaler) means no node can be added. Autoscaler v2 (KubeRay)
    and anything this cannot read count as "can grow": the start then waits, as for any cluster that grows.
    """
    try:
        from ray._private import ray_constants
        from ray.autoscaler.v2.utils import is_autoscaler_v2
        from ray.experimental import internal_kv

        if is_autoscaler_v2(fetch_from_server=True):
            return True
        raw = internal_kv._internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
    except Exception:  # noqa: BLE001 - Ray's private state API changes between versions: wait, as before
        return True
    if not raw:
        return False
    try:
        report = json.loads(raw).get("autoscaler_report") or {}
    except (ValueError, AttributeError):
        return True
    types = set(report.get("active_nodes") or {}) | set(report.get("pending_launches") or {})
    types |= set((report.get("node_type_mapping") or {}).values())
    return any(not _READONLY_NODE_TYPE.fullmatch(str(t)) for t in types)


def impossible_request(size: int, bundle: Mapping[str, float]) -> str | None:
    """Why ``size`` workers of ``bundle`` can never be placed on the connected cluster; None when they may
    be (they fit its nodes, or it can grow)."""
    why = never_fits(size, bundle, node_resources())
    if why is None or cluster_can_grow():
        return None
    return why


def wait_until_placed(pg: Any, timeout: float, say: Progress) -> bool:
    """Wait for the placement group's resources; False when ``timeout`` seconds passed first.

    Says what is free every 5 seconds of waiting (an autoscaler may be adding nodes).
    """
    import time

    import ray

    deadline = time.monotonic() + timeout
    waited_msg = time.monotonic()
    while True:
        ready, _ = ray.wait([pg.ready()], timeout=1.0)
        if ready:
            return True
        now = time.monotonic()
        if now > deadline:
            return False
        if now - waited_msg > 5:
            waited_msg = now
            say(f"waiting for resources ({available_text()}; {holders_text()})")


def available_text() -> str:
    """``"free 2/4 CPU, 0/0 GPU"``: what the cluster has left, for a message."""
    import ray

    try:
        avail = ray.available_resources()
        total = ray.cluster_resources()
    except Exception:  # noqa: BLE001 - only a hint in a message: Ray's state API must not fail the start
        return "cluster resources unknown"
    return (
        f"free {avail.get('CPU', 0):g}/{total.get('CPU', 0):g} CPU, "
        f"{avail.get('GPU', 0):g}/{total.get('GPU', 0):g} GPU"
    )


def holders_text(exclude: Any = None) -> str:
    """Who holds the cluster's CPUs and GPUs: each reserved placement group (a notebook's workers are one)
    by name or id, and what tasks and actors outside any hold; ``exclude`` is a placement group left out."""
    import ray
    from ray.util.placement_group import placement_group_table

    try:
        table = placement_group_table()
        total = ray.cluster_resources()
        avail = ray.available_resources()
    except Exception:  # noqa: BLE001 - only a hint in a message: Ray's state API must not fail the start
        return "who holds them is unknown"
    skip = getattr(exclude, "id", None)
    skip_hex = skip.hex() if skip is not None else None
    parts: list[str] = []
    held = {"CPU": 0.0, "GPU": 0.0}
    for pg_id, info in table.items():
        if info.get("state") != "CREATED" or pg_id == skip_hex:
            continue
        sums = {k: sum(b.get(k, 0.0) for b in info.get("bundles", {}).values()) for k in held}
        for k in held:
            held[k] += sums[k]
        who = f"placement group {info['name']!r}" if info.get("name") else f"placement group {pg_id[:12]}"
        parts.append(f"{who} holds {fmt_bundle({k: v for k, v in sums.items() if v})}")
    rest = {
        k: round(total.get(k, 0.0) - avail.get(k, 0.0) - held[k], 3)
        for k in held
        if total.get(k, 0.0) - avail.get(k, 0.0) - held[k] > 1e-3
    }
    if rest:
        parts.append(f"tasks and actors outside placement groups hold {fmt_bundle(rest)}")
    return "; ".join(parts) if parts else "nothing else holds resources"


def placement_error(size: int, bundle: Mapping[str, float], timeout: float, pg: Any = None) -> str:
    """Why ``size`` workers of ``bundle`` could not be placed within ``timeout`` s, who holds the resources
    (``pg``, ours, left out), and what to ask for instead."""
    return (
        f"could not place {size} worker(s) of {fmt_bundle(bundle)} each within {timeout:g} s "
        f"({available_text()}; held now: {holders_text(pg)}). Wait for them to be freed (another notebook's "
        f"cluster: %gpu_cluster stop there), or ask for fewer workers, fewer CPUs per worker (fractions such "
        f"as --cpus-per-worker 0.5 are allowed) or fewer GPUs, or add nodes."
    )


@dataclass(frozen=True)
class PlacementRequest:
    """What a group asks its placement for at a start: ``size`` workers of ``bundle`` each."""

    size: int  # workers, one bundle each
    bundle: dict[str, float]  # one worker's resources (see worker_bundle)
    strategy: str  # Ray's placement strategy: PACK, SPREAD, ...
    timeout: float  # seconds to wait for the resources before giving up
    group_id: str  # the group's id and start count: they name what this start reserves and starts
    generation: int


@runtime_checkable
class Placement(Protocol):
    """Where a :class:`~gpu_notebook.distributed.WorkerGroup`'s workers get their resources.

    The contract an implementation meets, in the order the group calls it:

    - :meth:`check` before a resize ends any worker: raise when the new size could never be held;
    - :meth:`reserve` at every start (a rebuild and a resize included): reserve one ``bundle`` per worker and
      wait for it, keeping it in :attr:`reservation` *before* the wait (an interrupt during the wait must be
      able to free it), and raise, holding nothing, when it cannot be had;
    - :meth:`actor_options` once per worker: the Ray actor options that put worker ``index`` into its bundle
      (the scheduling strategy, and the actor's name; a namespace and ``lifetime`` when the workers must outlive
      the kernel). The group adds ``num_cpus``, ``num_gpus`` and the runtime environment;
    - :meth:`started` once the workers run (a fresh start, or :meth:`WorkerGroup.adopt`);
    - :meth:`release` when the workers end: free the reservation (Ray ends any worker still in it); a no-op when
      nothing is held, and it must not raise.

    :attr:`reservation` is what is held now (a Ray placement group, or None); the group sets it directly when
    it adopts workers that run in a reservation made elsewhere, and clears it when it lets its workers go
    without ending them (:meth:`WorkerGroup.detach`).
    """

    reservation: Any

    def check(self, size: int, bundle: dict[str, float]) -> None:
        """Raise when ``size`` workers of ``bundle`` could never be held (before a resize ends any worker)."""
        ...

    def reserve(self, request: PlacementRequest, say: Progress) -> None:
        """Reserve and wait for ``request``'s resources (see the class docstring)."""
        ...

    def actor_options(self, request: PlacementRequest, index: int) -> dict[str, Any]:
        """The Ray actor options of worker ``index`` of the start ``request`` made."""
        ...

    def started(self, group: WorkerGroup) -> None:
        """The group's workers run (started fresh, or adopted)."""
        ...

    def release(self) -> None:
        """Free the reservation, if any; never raises."""
        ...


class RayPlacement:
    """The default placement: the group's own Ray placement group, named ``gpu_notebook-GROUP-GENERATION`` (who
    holds what, in another notebook's message), and workers named ``gpu_notebook:GROUP:GENERATION:INDEX``.

    A request the cluster can never hold fails at once; one that waits longer than its timeout fails naming who
    holds the resources (see the module docstring).
    """

    def __init__(self, namespace: str | None = None) -> None:
        self.reservation: Any = None  # the Ray placement group held, or None
        #: a detached cluster's Ray namespace: its reservation and workers then outlive the kernel (detached)
        self.namespace = namespace

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {'holding' if self.reservation is not None else 'holding nothing'}>"

    def check(self, size: int, bundle: dict[str, float]) -> None:
        impossible = impossible_request(size, bundle)
        if impossible:
            raise GroupError(impossible)

    def reserve(self, request: PlacementRequest, say: Progress) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group

        self.check(request.size, request.bundle)
        name = f"gpu_notebook-{request.group_id}-{request.generation}"
        pg = placement_group(
            [dict(request.bundle) for _ in range(request.size)],
            strategy=request.strategy,
            name=name,
            lifetime="detached" if self.namespace else None,
        )
        self.reservation = pg  # before the wait: an interrupt during it removes the reservation
        if not wait_until_placed(pg, request.timeout, say):
            remove_placement_group(pg)
            self.reservation = None
            raise GroupError(placement_error(request.size, request.bundle, request.timeout, pg))

    def actor_options(self, request: PlacementRequest, index: int) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.reservation, placement_group_bundle_index=index
            ),
            "name": f"gpu_notebook:{request.group_id}:{request.generation}:{index}",
            **({"namespace": self.namespace, "lifetime": "detached"} if self.namespace else {}),
        }

    def started(self, group: WorkerGroup) -> None:
        """Nothing to tell anyone: the placement group is this kernel's."""

    def release(self) -> None:
        if self.reservation is None:
            return
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(self.reservation)
        except Exception:  # noqa: BLE001 - already removed, or Ray is shutting down: nothing to free
            pass
        self.reservation = None
