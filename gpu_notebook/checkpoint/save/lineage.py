"""The delta state of one rank: the snapshot the next delta is computed against, and what past saves measured.

After a save is committed its snapshot becomes the base of the next delta; after a restore, the restored
tensors do (their memory is the caller's, so it is hashed again before a delta uses it).
"""

from __future__ import annotations

from typing import Any

from ..format.manifest import doc_hash, restore_frames, walk_chunks
from ..format.tree import Leaf

__all__ = ["Lineage"]


class Lineage:
    """What a delta is computed against, and how the previous saves went."""

    def __init__(self) -> None:
        #: leaf name -> {"dtype", "nbytes", "data" (its bytes), "chunks" (manifest entries), "check"?}
        self.shadow: dict[str, dict[str, Any]] = {}
        self.parent: str | None = None  # the checkpoint the next one follows
        self.since_base = 0  # deltas since the last full base
        self.rates: dict[bool, float] = {}  # raw bytes/s of the last full (True) and delta (False) persist
        self.new_bytes: dict[bool, int] = {}  # bytes written by the last full (True) and delta (False) save
        self.last_raw = 0  # raw bytes of the last save
        #: chunk kind (leaf, index, dtype, delta?) -> (encoding choice, the save counter it was chosen at)
        self.hints: dict[tuple[str, int, str, bool], tuple[Any, int]] = {}

    def next_is_base(self, full: bool, full_every: int, max_restore_ratio: float | None) -> bool:
        """Whether the next save is a full base: asked for, nothing to compute a delta against, ``full_every``
        reached, or restoring another delta would cost too much."""
        return (
            full
            or not self.shadow
            or self.since_base + 1 >= full_every
            or self.restore_too_costly(max_restore_ratio)
        )

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
        self, leaves: list[Leaf], leaves_doc: dict[str, Any], ckpt_id: str, is_base: bool
    ) -> dict[str, dict[str, Any]]:
        """A save of ``leaves`` was committed as ``ckpt_id``: it becomes the base of the next delta. Returns the
        shadow it replaces (whose buffers can be reused)."""
        old = self.shadow
        self.shadow = {
            leaf.name: {
                "dtype": leaf.dtype,
                "nbytes": leaf.nbytes,
                "data": leaf.data,
                "chunks": leaves_doc[leaf.name]["chunks"],
            }
            for leaf in leaves
        }
        self.parent = ckpt_id
        self.since_base = 0 if is_base else self.since_base + 1
        return old

    def restored(
        self, doc: dict[str, Any], shard: dict[str, Any], datas: dict[str, Any], rank: int, hash_name: str
    ) -> None:
        """Continue the delta chain from what was restored (a checkpoint hashed otherwise than this writer
        hashes, e.g. format version 2: the next save is a full base)."""
        if (not doc.get("sharded") or shard["rank"] == rank) and doc_hash(doc) == hash_name:
            self.shadow = {
                name: {
                    "dtype": lf["dtype"],
                    "nbytes": lf["nbytes"],
                    "data": datas[name],
                    "chunks": lf["chunks"],
                    "check": True,  # the caller's tensors share this memory: hash it before a delta uses it
                }
                for name, lf in shard["leaves"].items()
            }
            self.parent = doc["id"]
            depth = max(
                (c.get("depth", 0) for lf in shard["leaves"].values() for c in lf["chunks"]), default=0
            )
            self.since_base = 0 if doc.get("is_base") else depth
        elif doc_hash(doc) != hash_name:
            self.shadow = {}  # nothing to compute a delta against: the next save is a full base
