"""The delta state of one rank: the snapshot the next delta is computed against, and what past saves measured.

Chains of one (the default, ``delta_against="base"``): every delta is computed against the last full base, so
that a restore reads and decodes two frames per chunk at most (the base's and the delta's), whatever the number of
saves since the base; the base's snapshot stays in memory until the next base, and each delta's snapshot buffers
are recycled once it is committed. A new base (a *rollup*) is written when the last delta cost at least the
average per checkpoint since the base, the base included: a delta against an older base grows as training moves
away from it, and from that point on a fresh base lowers the bytes per checkpoint (the stopping rule that
minimises the average cost of a cycle). ``delta_against="previous"``: every delta is against the checkpoint
before it (chains up to ``full_every`` long; fewer bytes, slower restores).

After a restore, the restored tensors are the base of the next delta when the restored checkpoint is a full base
(their memory is the caller's, so it is hashed again before a delta uses it); a restored delta is not a base, so
the next save is a full one.
"""

from __future__ import annotations

from typing import Any

from ..format.manifest import doc_hash, restore_frames, walk_chunks
from ..format.tree import GROUP_PREFIX, Leaf

__all__ = ["Lineage"]


class Lineage:
    """What a delta is computed against, and how the previous saves went."""

    def __init__(self, delta_against: str = "base") -> None:
        if delta_against not in ("base", "previous"):
            raise ValueError("delta_against must be 'base' or 'previous'")
        self.against_base = delta_against == "base"
        #: leaf name -> {"dtype", "nbytes", "data" (its bytes), "chunks" (manifest entries), "check"?}
        self.shadow: dict[str, dict[str, Any]] = {}
        self.parent: str | None = None  # the checkpoint the next one follows
        self.shadow_id: str | None = None  # the checkpoint whose chunk entries the shadow holds
        self.since_base = 0  # deltas since the last full base
        self.rates: dict[bool, float] = {}  # raw bytes/s of the last full (True) and delta (False) persist
        self.new_bytes: dict[bool, int] = {}  # bytes written by the last full (True) and delta (False) save
        self.last_raw = 0  # raw bytes of the last save
        #: raw hash -> manifest entry of every chunk of the last save (reused as is when its bytes come again)
        self.recent: dict[str, dict[str, Any]] = {}
        #: bytes written since the last base, the base included (None: unknown, the base was restored)
        self.run_bytes: int | None = None
        self.last_delta_bytes = 0  # bytes written by the last delta
        #: chunk kind (leaf, index, dtype, delta?) -> (encoding choice, the save counter it was chosen at)
        self.hints: dict[tuple[str, int, str, bool], tuple[Any, int]] = {}
        #: a spread save's base was committed with no leaf of this rank's (its part is empty, not missing)
        self.empty_part = False

    def next_is_base(self, full: bool, full_every: int, max_restore_ratio: float | None) -> bool:
        """Whether the next save is a full base: asked for, nothing to compute a delta against, ``full_every``
        reached, or restoring another delta would cost too much."""
        return (
            full
            or not (self.shadow or self.empty_part)
            or self.since_base + 1 >= full_every
            or self.rollup_due()
            or self.restore_too_costly(max_restore_ratio)
        )

    def rollup_due(self) -> bool:
        """Chains of one: did the last delta cost at least the average per checkpoint since the last base (the
        base included)? Deltas against the base only grow from here on, so a fresh base lowers the average."""
        if not self.against_base or not self.since_base or self.run_bytes is None:
            return False
        return self.last_delta_bytes * (self.since_base + 1) >= self.run_bytes

    def restore_too_costly(self, max_restore_ratio: float | None) -> bool:
        """Would restoring the next delta read more than ``max_restore_ratio`` times a full checkpoint's bytes?
        The last checkpoint's chains (every frame down to their bases) plus what the last delta added, against
        their base frames (what a full checkpoint of the same state about costs)."""
        if max_restore_ratio is None:
            return False
        chunks = [c for sh in self.shadow.values() for c in sh["chunks"]]
        chains = sum(restore_frames(chunks).values())
        full = sum(walk_chunks(c)[-1]["size"] for c in chunks)
        return full > 0 and chains + self.new_bytes.get(False, 0) > max_restore_ratio * full

    def committed(
        self,
        leaves: list[Leaf],
        leaves_doc: dict[str, Any],
        ckpt_id: str,
        is_base: bool,
        new_bytes: int = 0,
        spread: bool = False,
    ) -> dict[str, dict[str, Any]]:
        """A save of ``leaves`` was committed as ``ckpt_id`` (writing ``new_bytes``): a base (or, with
        ``delta_against="previous"``, any save) becomes what the next delta is computed against. Returns what no
        delta needs any more (whose buffers can be reused): the shadow it replaces, or a delta's own snapshot.
        ``spread``: this rank's part of a spread save (``leaves`` may then be none at all)."""
        self.recent = {e["raw"]: e for lf in leaves_doc.values() for e in lf["chunks"]}
        self.parent = ckpt_id
        if is_base:
            self.run_bytes = new_bytes
        else:
            self.last_delta_bytes = new_bytes
            if self.run_bytes is not None:
                self.run_bytes += new_bytes
        self.since_base = 0 if is_base else self.since_base + 1
        if self.against_base and not is_base and self.shadow:
            return {leaf.name: {"data": leaf.data} for leaf in leaves}
        old = self.shadow
        self.empty_part = spread and not leaves
        self.shadow = {
            leaf.name: {
                "dtype": leaf.dtype,
                "nbytes": leaf.nbytes,
                "data": leaf.data,
                "chunks": leaves_doc[leaf.name]["chunks"],
            }
            for leaf in leaves
        }
        self.shadow_id = ckpt_id
        return old

    def restored(
        self, doc: dict[str, Any], shard: dict[str, Any], datas: dict[str, Any], rank: int, hash_name: str
    ) -> None:
        """Continue the delta chain from what was restored (a checkpoint hashed otherwise than this writer
        hashes, e.g. format version 2: the next save is a full base)."""
        # what was encoded: the leaves in no group, and the groups (small tensors saved together)
        encoded = {n: lf for n, lf in shard["leaves"].items() if "group" not in lf}
        encoded.update((GROUP_PREFIX + k, g) for k, g in (shard.get("groups") or {}).items())
        depth = max((c.get("depth", 0) for lf in encoded.values() for c in lf["chunks"]), default=0)
        mine = (not doc.get("sharded") or shard["rank"] == rank) and doc_hash(doc) == hash_name
        self.recent = {}
        self.run_bytes = None
        self.empty_part = False
        if mine and self.against_base and depth:
            self.shadow = {}  # a restored delta is no base for chains of one: the next save is a full base
            self.parent = doc["id"]
        elif mine:
            self.shadow = {
                name: {
                    "dtype": lf["dtype"],
                    "nbytes": lf["nbytes"],
                    "data": datas[name],
                    "chunks": lf["chunks"],
                    "check": True,  # the caller's tensors share this memory: hash it before a delta uses it
                }
                for name, lf in encoded.items()
            }
            self.parent = self.shadow_id = doc["id"]
            self.since_base = 0 if doc.get("is_base") else depth
        elif doc_hash(doc) != hash_name:
            self.shadow = {}  # nothing to compute a delta against: the next save is a full base
