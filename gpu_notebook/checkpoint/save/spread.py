"""Spread saves: the ranks of a replicated (DDP) job share the encoding of one checkpoint.

In replicated DDP every rank holds the same parameters and optimizer state. Left to rank 0, a save costs rank 0
the whole snapshot copy (the training stall of the job: every rank waits for the slowest at its next collective)
and the CPU time of encoding the whole state, while the other ranks' cores idle. A *spread* save splits the big
tensors (``SPREAD_MIN`` bytes and more) between the ranks: each rank copies and encodes only the ones it owns and
sends their chunk entries in its commit record; rank 0 also takes everything else (small tensors in their groups,
arrays, pickled values, the tree) and writes the one manifest, the same as a save of rank 0 alone would.

Which rank owns a tensor is decided by its name, on every rank alike: the first time a name is seen, it goes to
the rank with the fewest bytes so far (the walk's order is the same on every rank, so the ranks agree without a
word), and it stays there: that rank keeps its delta base, so each delta is computed where its base lies. With
list scheduling the most loaded rank holds at most the average plus one tensor.

Small tensors stay rank 0's, as in a save of rank 0 alone: those that can differ between ranks in DDP (norm
layers' running statistics, updated after the buffers were broadcast; a loss) are small, and a checkpoint of a
replicated state holds rank 0's.
"""

from __future__ import annotations

from typing import Any

from .._errors import CheckpointError
from ..format.tree import GROUP_PREFIX

__all__ = ["SPREAD_MIN", "Spread", "fill_remote_chunks", "own_chunks"]

#: tensors of at least this many bytes are shared out between the ranks (smaller ones are rank 0's)
SPREAD_MIN = 1 << 20


class Spread:
    """Which rank of a replicated job encodes each big tensor (kept for the life of a ``Checkpointer``)."""

    def __init__(self, rank: int, world_size: int, min_bytes: int = SPREAD_MIN) -> None:
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.min_bytes = int(min_bytes)
        self.owners: dict[str, int] = {}
        self.load = [0] * self.world_size  # bytes owned, per rank

    def owner(self, name: str, nbytes: int) -> int:
        """The rank that encodes tensor ``name``: its owner so far, else the least loaded rank (ties: the
        highest, rank 0 also encodes the small tensors and commits)."""
        o = self.owners.get(name)
        if o is None:
            o = min(range(self.world_size), key=lambda r: (self.load[r], -r))
            self.owners[name] = o
            self.load[o] += int(nbytes)
        return o


def own_chunks(shard: dict[str, Any]) -> dict[str, Any]:
    """A rank's part of a spread save, from its shard: per leaf it encoded, its dtype, shape and chunk entries."""
    return {
        n: {"dtype": lf["dtype"], "shape": lf["shape"], "chunks": lf["chunks"]}
        for n, lf in shard["leaves"].items()
        if lf.get("chunks") is not None
    }


def fill_remote_chunks(shard: dict[str, Any], parts: dict[int, dict[str, Any]], ckpt_id: str) -> None:
    """Rank 0: put the chunk entries the other ranks encoded (``parts``, by rank, from their records) into its
    shard; :class:`CheckpointError` when a leaf was encoded by no rank, or another rank's tensor of that name has
    another dtype or shape (the ranks walked different states)."""
    leaves = shard["leaves"]
    for rank, part in sorted(parts.items()):
        for name, got in part.items():
            lf = leaves.get(name)
            if lf is None or lf.get("chunks") is not None:
                continue
            if [got["dtype"], got["shape"]] != [lf["dtype"], lf["shape"]]:
                raise CheckpointError(
                    f"checkpoint {ckpt_id}: tensor {name!r} of the replicated state is {lf['dtype']} "
                    f"{lf['shape']} on rank 0 and {got['dtype']} {got['shape']} on rank {rank}; " + _ADVICE
                )
            lf["chunks"] = got["chunks"]
    missing = [n for n, lf in leaves.items() if lf.get("chunks") is None]
    missing += [GROUP_PREFIX + k for k, g in (shard.get("groups") or {}).items() if g.get("chunks") is None]
    if missing:
        raise CheckpointError(
            f"checkpoint {ckpt_id}: no rank encoded {len(missing)} tensor(s) of the replicated state (first: "
            f"{missing[0]!r}); " + _ADVICE
        )


_ADVICE = (
    "are the states the same on every rank? Pass sharded=True where each rank holds its own, or spread=False "
    "to have rank 0 write the state alone"
)
