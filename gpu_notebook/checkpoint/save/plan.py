"""What one save encodes: its chunks, each with the chunk it is a delta against (the same chunk of the last full
base, or of the previous checkpoint with ``delta_against="previous"``), and the chunks already in the store that it
reuses as they are."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..format.tree import Leaf

__all__ = ["Chunk", "Plan", "chunks_of", "plan_save", "pack_threshold"]

# a pack is closed (and uploaded, while the encoding goes on) once it holds 1 / (_PACKS_PER_THREAD * threads) of
# what the previous save of the same kind wrote, so that the last pack, uploaded after the encoding, is small; at
# least _PACK_MIN bytes (every object is a request to write and one to read: S3 charges per request, and each
# costs a round trip; 4 MiB instead of 1 made a 20 MB bf16 restore from the test S3 server 15 % faster), at most
# pack_max
_PACKS_PER_THREAD = 2
_PACK_MIN = 4 << 20


@dataclass
class Chunk:
    """One chunk of a leaf to save, and what it is a delta against (None: encoded in full)."""

    k: int  # its position in the save (leaf after leaf, chunk after chunk)
    leaf: Leaf
    idx: int  # its index in the leaf
    off: int
    len: int
    base_arr: np.ndarray | None = None  # the same chunk's bytes in the checkpoint it is a delta against
    base_entry: dict[str, Any] | None = None  # ... and its manifest entry
    check: bool = False  # base_arr is restored memory (the caller's tensors): hash it before using it

    @property
    def raw(self) -> np.ndarray:
        return self.leaf.data[self.off : self.off + self.len]


@dataclass
class Plan:
    """The chunks of one save, biggest first (so that the threads finish together), and the reusable ones."""

    chunks: list[Chunk]
    #: raw hash -> manifest entry of a chunk already stored (a delta reuses any; a base only full frames)
    known: dict[str, dict[str, Any]]
    n_chunks: int


def chunks_of(leaf: Leaf, chunk_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of a leaf: ``chunk_bytes`` rounded down to whole elements."""
    n = leaf.nbytes
    w = max(1, leaf.width)
    size = max(w, (chunk_bytes // w) * w)
    return [(o, min(size, n - o)) for o in range(0, n, size)]


def plan_save(
    leaves: list[Leaf],
    shadow: dict[str, dict[str, Any]],
    chunk_bytes: int,
    is_base: bool,
    recent: dict[str, dict[str, Any]] | None = None,
) -> Plan:
    """Split ``leaves`` into chunks, each paired with the same chunk of ``shadow`` (what deltas are computed
    against: the last base, or the previous checkpoint) when this save is a delta and the leaf kept its dtype and
    size. ``recent``: the chunk entries of the last save (by raw hash), reused as they are when their bytes come
    again (a base reuses only full frames)."""
    chunks: list[Chunk] = []
    for leaf in leaves:
        sh = None if is_base else shadow.get(leaf.name)
        same = sh is not None and sh["dtype"] == leaf.dtype and sh["nbytes"] == leaf.nbytes
        for i, (o, ln) in enumerate(chunks_of(leaf, chunk_bytes)):
            c = Chunk(len(chunks), leaf, i, o, ln)
            if same and sh is not None and i < len(sh["chunks"]):
                c.base_entry = sh["chunks"][i]
                c.base_arr = sh["data"][o : o + ln]
                c.check = bool(sh.get("check"))
            chunks.append(c)
    known: dict[str, dict[str, Any]] = {}
    entries = [e for prev in shadow.values() for e in prev["chunks"]]
    for e in [*entries, *(recent or {}).values()]:
        if not is_base or e.get("depth", 0) == 0:
            known.setdefault(e["raw"], e)
    n = len(chunks)
    chunks.sort(key=lambda c: -c.len)  # big chunks first, so that the threads finish together
    return Plan(chunks, known, n)


def pack_threshold(expect: int | None, pack_max: int, threads: int) -> int:
    """How many bytes a pack collects before it is uploaded (``expect``: what the previous save of the same
    kind wrote)."""
    if not expect:
        return pack_max
    return min(pack_max, max(_PACK_MIN, expect // (_PACKS_PER_THREAD * threads)))
