"""Pure functions for rank layout: ordering workers by node, local ranks, GPU visibility, rank selections."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any


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
    gpu_ids: tuple[str, ...]
    cuda_visible_devices: str | None  # what this rank's CUDA_VISIBLE_DEVICES is set to (None: leave as is)
    device_index: int  # CUDA device index within the visible devices


def _gpu_key(gpu_ids: Sequence[str]) -> tuple[int, ...]:
    keys = []
    for g in gpu_ids:
        try:
            keys.append(int(g))
        except ValueError:
            keys.append(10**6)
    return tuple(sorted(keys)) or (10**6,)


def plan_ranks(
    metas: Sequence[dict[str, Any]], driver_ip: str | None = None, gpu_visibility: str = "own"
) -> list[RankPlan]:
    """Order workers by node (the driver's node first, then by IP and node id), then by GPU id.

    Parameters
    ----------
    metas
        One dict per created actor, in creation order: ``node_id``, ``ip``, ``gpu_ids`` (Ray-assigned).
    driver_ip
        The notebook's IP; its node gets the lowest ranks (rank 0 hosts the rendezvous).
    gpu_visibility
        ``"own"``: each rank sees only its own GPUs (``CUDA_VISIBLE_DEVICES`` = its Ray GPU ids, device 0).
        ``"node"``: each rank sees every GPU given to the group's ranks on its node (what Ray Train does, so
        NVLink peer access works and ``cuda:LOCAL_RANK`` indexing of torchrun code matches); the device is the
        position of its own GPU in that list.

    Returns
    -------
    list of RankPlan, in rank order.
    """
    if gpu_visibility not in ("own", "node"):
        raise ValueError("gpu_visibility must be 'own' or 'node'")
    nodes: dict[str, dict[str, Any]] = {}
    for i, m in enumerate(metas):
        nodes.setdefault(m["node_id"], {"ip": m["ip"], "members": []})["members"].append(i)
    order = sorted(nodes, key=lambda n: (nodes[n]["ip"] != driver_ip, nodes[n]["ip"], n))
    plans: list[RankPlan] = []
    rank = 0
    for node_rank, node_id in enumerate(order):
        members = sorted(nodes[node_id]["members"], key=lambda i: (_gpu_key(metas[i]["gpu_ids"]), i))
        node_gpus = sorted({g for i in members for g in metas[i]["gpu_ids"]}, key=lambda g: _gpu_key([g]))
        for local_rank, i in enumerate(members):
            own = tuple(metas[i]["gpu_ids"])
            if not own:
                visible, device_index = None, 0
            elif gpu_visibility == "own":
                visible, device_index = ",".join(own), 0
            else:
                visible, device_index = ",".join(node_gpus), node_gpus.index(own[0])
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
                    cuda_visible_devices=visible,
                    device_index=device_index,
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


def format_ranks(ranks: Sequence[int]) -> str:
    """Compact form of a rank list: ``[0, 1, 2, 5]`` -> ``0-2,5``."""
    ranks = sorted(ranks)
    out: list[str] = []
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)
