"""The start of a save, on the training thread: where several ranks write it, what they agree on (its place in
the commit order, a nonce naming it, and, for a spread save, whether it is a full base); then the snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._group import agree_save
from ..format.manifest import commit_id
from ..per_rank import RankSnapshot
from ..per_rank import take as take_snapshot
from ..snapshot import BufferPool
from .lineage import Lineage
from .order import CommitOrder
from .spread import Spread

__all__ = ["SaveStart", "start_save"]


@dataclass(frozen=True)
class SaveStart:
    """What the start of a save reads of its :class:`Checkpointer`: its settings as resolved for this process,
    and the state it carries from one save to the next (made afresh for each save, so it sees them as they are)."""

    full_every: int  # a full base at the latest every full_every-th checkpoint (SaveOptions)
    max_restore_ratio: float | None  # a full base before a restore would read more than this (SaveOptions)
    allow_pickle: bool  # values without a safe representation are pickled (SaveOptions)
    rank: int  # this process's rank
    sharded: bool  # every rank saves its own shard (only True in a job of several ranks)
    rng: bool  # every rank's RNG states go into its per-rank section
    spread: bool  # the ranks share a replicated save (only True in a job with a process group)
    token: str  # the session token: names a save's records where no nonce can be agreed on
    order: CommitOrder  # the place of the next commit, and its parent
    lineage: Lineage  # what the next delta is computed against
    buffers: BufferPool  # the host buffers a snapshot copies into
    spreader: Spread  # which rank encodes each big tensor of a spread save


def start_save(
    ck: SaveStart, state: Any, step: int, full: bool | None, multi: bool
) -> tuple[RankSnapshot, str]:
    """The snapshot of ``state`` that the Checkpointer described by ``ck`` saves next, and its checkpoint id.
    ``multi``: several ranks write the save (one collective here, on every rank)."""
    # the ranks' parts meet under one id: agree on its counter (it could drift apart), and name this save
    place = ck.order.propose()
    spread = multi and ck.spread
    # a spread save is a full base where any rank's part calls for one (its own delta base, chain, sizes)
    base = bool(full) or (spread and ck.lineage.next_is_base(False, ck.full_every, ck.max_restore_ratio))
    seq, nonce, base = agree_save(place, ck.token, base) if multi else (place, "", bool(full))
    ck.order.proposed(seq)
    snap = take_snapshot(
        ck.buffers,
        state,
        step,
        ck.allow_pickle,
        ck.sharded or ck.rank == 0 or spread,
        ck.rng,
        ck.spreader if spread else None,
    )
    snap.nonce, snap.writers, snap.spread = nonce, multi, spread
    snap.full = base
    return snap, commit_id(seq)
