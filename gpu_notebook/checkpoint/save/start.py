"""The start of a save, on the training thread: where several ranks write it, what they agree on (its place in
the commit order, a nonce naming it, and, for a spread save, whether it is a full base); then the snapshot."""

from __future__ import annotations

from typing import Any

from .._group import agree_save
from ..format.manifest import commit_id
from ..per_rank import RankSnapshot
from ..per_rank import take as take_snapshot

__all__ = ["start_save"]


def start_save(ck: Any, state: Any, step: int, full: bool | None, multi: bool) -> tuple[RankSnapshot, str]:
    """The snapshot of ``state`` that :class:`Checkpointer` ``ck`` saves next, and its checkpoint id. ``multi``:
    several ranks write the save (one collective here, on every rank)."""
    # the ranks' parts meet under one id: agree on its counter (it could drift apart), and name this save
    place = ck._order.propose()
    spread = multi and ck.spread
    # a spread save is a full base where any rank's part calls for one (its own delta base, chain, sizes)
    base = bool(full) or (spread and ck._lineage.next_is_base(False, ck.full_every, ck.max_restore_ratio))
    seq, nonce, base = agree_save(place, ck._token, base) if multi else (place, "", bool(full))
    ck._order.proposed(seq)
    snap = take_snapshot(
        ck._buffers,
        state,
        step,
        ck.allow_pickle,
        ck.sharded or ck.rank == 0 or spread,
        ck.rng,
        ck._spread if spread else None,
    )
    snap.nonce, snap.writers, snap.spread = nonce, multi, spread
    snap.full = base
    return snap, commit_id(seq)
