"""Pure functions for rank layout: ordering workers by node, local ranks, GPU visibility, rank selections."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_notebook._display import format_ranks

__all__ = ["GPU_VISIBILITIES", "RankPlan", "format_ranks", "parse_ranks", "plan_ranks", "some_ranks"]

#: The ways a rank's ``CUDA_VISIBLE_DEVICES`` can be set (see :func:`plan_ranks`); the first is the default.
GPU_VISIBILITIES = ("node", "own")


@dataclass(frozen=True)
class RankPlan:
    """Where one rank lives and what it sees."""

    rank: int
    actor_index: int  # index into the list of created actors
    node_id: str
    node_ip: str
    node_rank: int
    local_rank: int
    local_world_size: int
    gpu_ids: tuple[str, ...]  # the GPUs Ray gave this rank, in numeric order
    cuda_visible_devices: str | None  # what this rank's CUDA_VISIBLE_DEVICES is set to (None: leave as is)
    # this rank's own GPUs as CUDA device indices within the visible ones, its current device first (as Ray
    # Train's get_devices()); empty without a GPU
    device_indices: tuple[int, ...] = ()

    @property
    def device_index(self) -> int:
        """The CUDA device this rank makes current (its first own GPU; 0 without a GPU)."""
        return self.device_indices[0] if self.device_indices else 0


def _gpu_key(gpu_ids: Sequence[str]) -> tuple[int, ...]:
    keys = []
    for g in gpu_ids:
        try:
            keys.append(int(g))
        except ValueError:
            keys.append(10**6)
    return tuple(sorted(keys)) or (10**6,)


def _numeric(gpu_ids: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted(gpu_ids, key=lambda g: _gpu_key([g])))


def _node_union(own_by_local_rank: Sequence[tuple[str, ...]]) -> tuple[str, ...]:
    """The node's GPUs in local-rank order, each once: local rank k's GPUs come after those of ranks below k.

    So with G GPUs per rank, local rank k's GPUs are devices k*G .. k*G+G-1, whatever ids Ray gave out.
    """
    seen: dict[str, None] = {}
    for own in own_by_local_rank:
        seen.update(dict.fromkeys(own))
    return tuple(seen)


def plan_ranks(
    metas: Sequence[dict[str, Any]], driver_ip: str | None = None, gpu_visibility: str = "node"
) -> list[RankPlan]:
    """Order workers by node (the driver's node first, then by IP and node id), then by GPU id.

    Parameters
    ----------
    metas
        One dict per created actor, in creation order: ``node_id``, ``ip``, ``gpu_ids`` (Ray-assigned).
    driver_ip
        The notebook's IP; its node gets the lowest ranks (rank 0 hosts the rendezvous).
    gpu_visibility
        ``"node"`` (the default, as torchrun and Ray Train): each rank sees every GPU given to the group's
        ranks on its node, in local-rank order, so local rank k's GPU is device k (``cuda:LOCAL_RANK`` is
        right, as under torchrun) and, with G GPUs per rank, its GPUs are devices k*G .. k*G+G-1. NVLink peer
        access between the node's ranks works. Ranks sharing a GPU (fractional GPUs) see it once: their
        device is its position in that list, not ``LOCAL_RANK``.
        ``"own"``: each rank sees only its own GPUs (``CUDA_VISIBLE_DEVICES`` = its Ray GPU ids): its GPU
        is device 0 whatever its ``LOCAL_RANK``.

    Returns
    -------
    list of RankPlan, in rank order.

    Examples
    --------
    Two workers with one GPU each: local rank k is device k, as under torchrun.

    >>> metas = [{"node_id": "n", "ip": "x", "gpu_ids": [g]} for g in ("3", "1")]
    >>> [(p.local_rank, p.cuda_visible_devices, p.device_indices) for p in plan_ranks(metas)]
    [(0, '1,3', (0,)), (1, '1,3', (1,))]
    >>> [(p.cuda_visible_devices, p.device_indices) for p in plan_ranks(metas, gpu_visibility="own")]
    [('1', (0,)), ('3', (0,))]
    """
    if gpu_visibility not in GPU_VISIBILITIES:
        raise ValueError(f"gpu_visibility must be one of {', '.join(map(repr, GPU_VISIBILITIES))}")
    nodes: dict[str, dict[str, Any]] = {}
    for i, m in enumerate(metas):
        nodes.setdefault(m["node_id"], {"ip": m["ip"], "members": []})["members"].append(i)
    order = sorted(nodes, key=lambda n: (nodes[n]["ip"] != driver_ip, nodes[n]["ip"], n))
    plans: list[RankPlan] = []
    rank = 0
    for node_rank, node_id in enumerate(order):
        # ranks without a GPU sort last, so the GPU ranks' local ranks match their devices
        members = sorted(nodes[node_id]["members"], key=lambda i: (_gpu_key(metas[i]["gpu_ids"]), i))
        owns = [_numeric(metas[i]["gpu_ids"]) for i in members]
        node_gpus = _node_union(owns)
        for local_rank, (i, own) in enumerate(zip(members, owns, strict=True)):
            visible: tuple[str, ...] | None = None
            if own:
                visible = own if gpu_visibility == "own" else node_gpus
            plans.append(
                RankPlan(
                    rank=rank,
                    actor_index=i,
                    node_id=node_id,
                    node_ip=nodes[node_id]["ip"],
                    node_rank=node_rank,
                    local_rank=local_rank,
                    local_world_size=len(members),
                    gpu_ids=own,
                    cuda_visible_devices=",".join(visible) if visible else None,
                    device_indices=tuple(visible.index(g) for g in own) if visible else (),
                )
            )
            rank += 1
    return plans


def parse_ranks(spec: str | Iterable[int] | None, world_size: int) -> list[int]:
    """Parse a rank selection: ``all``, ``0,2``, ``0-3``, ``1,3-5`` (or an iterable of ints).

    Raises
    ------
    ValueError
        With a message saying what was wrong and what the valid ranks are.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "all", "*")):
        return list(range(world_size))
    ranks: set[int] = set()
    if isinstance(spec, str):
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            try:
                if "-" in part:
                    lo_s, hi_s = part.split("-", 1)
                    lo, hi = int(lo_s), int(hi_s)
                    if hi < lo:
                        raise ValueError
                    ranks.update(range(lo, hi + 1))
                else:
                    ranks.add(int(part))
            except ValueError:
                raise ValueError(
                    f"bad rank selection {spec!r}: use 'all', a list like '0,2' or a range like '0-3'"
                ) from None
    else:
        ranks.update(int(r) for r in spec)
    bad = sorted(r for r in ranks if r < 0 or r >= world_size)
    if bad:
        raise ValueError(f"rank(s) {bad} out of range: this group has ranks 0-{world_size - 1}")
    if not ranks:
        raise ValueError(f"empty rank selection {spec!r}")
    return sorted(ranks)


def some_ranks(selected: list[int], size: int) -> list[int] | None:
    """The selected ranks when they are not every rank of ``size`` (their collectives then check their group).

    >>> some_ranks([0, 1], 2), some_ranks([1], 2)
    (None, [1])
    """
    return None if set(selected) >= set(range(size)) else list(selected)
