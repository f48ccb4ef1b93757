"""Which checkpoint, which shard and which per-rank section a restore reads, and the fallback to an older intact
checkpoint."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import CheckpointError, IntegrityError, ObjectMissingError
from .._rng import set_rng_state
from ..format._nogc import no_gc
from ..format.manifest import read_manifest
from ..format.tree import unflatten
from ..inspect import Inspector
from ..per_rank import merge_section, pick_section, unwrap_into
from .decode import decode_shard
from .merge import load_into

__all__ = ["Restored", "restore_checkpoint", "pick_shard"]


@dataclass
class Restored:
    """A restored checkpoint: its manifest, the shard this rank read (with the leaves of its per-rank section),
    the state, and the leaves' bytes."""

    doc: dict[str, Any]
    shard: dict[str, Any]
    state: Any
    datas: dict[str, np.ndarray]


def pick_shard(doc: dict[str, Any], rank: int, world_size: int) -> dict[str, Any]:
    """The shard of ``doc`` that ``rank`` restores (the one shard of replicated state, whatever the rank)."""
    shards = doc["shards"]
    ws = int(doc.get("world_size", 1))
    if len(shards) == 1 or doc.get("replicated", False):
        return shards[0]
    if ws != world_size:
        raise CheckpointError(
            f"checkpoint {doc['id']} has {len(shards)} different shards (world size {ws}); it can only be "
            f"restored onto world size {ws}, not {world_size} (only replicated state can change world size)"
        )
    for s in shards:
        if s["rank"] == rank:
            return s
    raise CheckpointError(f"checkpoint {doc['id']} has no shard for rank {rank}")


def _older(
    doc: dict[str, Any], inspector: Inspector, world_size: int, agree_min: Callable[[int], int | None]
) -> tuple[list[str], bool]:
    """The ids of the checkpoints ``doc``'s continues (its parent, the parent's parent, ...: never an abandoned
    branch), newest first, to fall back to; and whether the ranks of a process group fall back together (each
    restores its own shard of the same checkpoint)."""
    older = inspector.older(doc["id"])
    n_older = agree_min(len(older)) if world_size > 1 else None
    if n_older is None:
        return older, False
    return older[:n_older], True  # the same candidates on every rank


@no_gc()  # (a walk over every tensor: see no_gc)
def restore_checkpoint(
    doc: dict[str, Any],
    *,
    inspector: Inspector,
    rank: int,
    world_size: int,
    agree_min: Callable[[int], int | None],
    decode: dict[str, Any],
    fallback: bool,
    latest: bool,
    into: Any,
    map_location: Any,
    per_rank: str | int = "strict",
    rng: bool = False,
) -> Restored:
    """Decode the checkpoint of ``doc`` and load it ``into`` the given objects. With ``fallback`` and ``latest``
    (``doc`` is the newest checkpoint), a checkpoint whose data is missing or corrupted gives way to the newest
    older one that is intact. ``decode``: the keyword arguments of :func:`decode_shard`. ``per_rank`` and
    ``rng``: which per-rank section this rank takes (see :func:`per_rank.pick_section`) and whether its RNG
    states are set."""
    older, together = _older(doc, inspector, world_size, agree_min) if fallback and latest else ([], False)
    first: CheckpointError | None = None  # the error of the checkpoint asked for
    while True:
        shard = pick_shard(doc, rank, world_size)
        section = pick_section(doc, rank, world_size, per_rank, rng)
        if section is not None:  # decoded with the shard, in one pass
            shard = {**shard, "leaves": {**shard["leaves"], **section["leaves"]}}
        err: CheckpointError | None = None
        try:
            values, datas = decode_shard(doc, shard, store=inspector.store, **decode)
        except (ObjectMissingError, IntegrityError) as e:
            if not fallback:
                raise
            err = e
        if together:  # a collective: every rank takes part in every round
            everyone = agree_min(0 if err else 1)
            if everyone == 0 and err is None:
                err = IntegrityError(f"another rank could not restore its part of checkpoint {doc['id']}")
        if err is None:
            break
        # this checkpoint cannot be restored (here, or on another rank): the one before it
        if first is None:
            first = err
        else:
            first.add_note(
                f"older checkpoint {doc['id']} (step {doc['step']}) cannot be restored either: {err}"
            )
        if not older:
            if first is err:
                raise err
            raise first from None
        warnings.warn(
            f"checkpoint {doc['id']} (step {doc['step']}) cannot be restored ({err}); restoring the one "
            f"before it, {older[0]}",
            RuntimeWarning,
            stacklevel=3,
        )
        doc = read_manifest(inspector.store, older.pop(0))
    if map_location is not None:
        for k, v in list(values.items()):
            if hasattr(v, "to") and not isinstance(v, np.ndarray):
                values[k] = v.to(map_location)
    state = unflatten(shard["tree"], values)
    rng_states = None
    if section is not None:
        state, rng_states = merge_section(state, section, values)
    if rng and rng_states is None:
        raise CheckpointError(f"checkpoint {doc['id']} holds no RNG states (saved with rng=False)")
    if into is not None:
        load_into(unwrap_into(into, keep=per_rank != "drop"), state, shard["tree"])
    if rng_states is not None and rng:
        set_rng_state(rng_states)
    return Restored(doc, shard, state, datas)
