"""Manifest and store layout constants, and helpers to read manifests safely.

Store layout (same for a folder and an S3 prefix)::

    FORMAT                         {"format": "gpu_notebook.checkpoint", "version": 5}
    objects/<h[:2]>/<h>            immutable chunk frames or packs of frames; h = BLAKE3 (versions 3-5) or
                                   SHA-256 (version 2) of the stored bytes
    manifests/<id>.json            one per checkpoint, written last and create-only: the commit point; new ids
                                   are ``c<commit sequence, 10 digits>`` (sorting by commit order), format-3 ids
                                   ``<step, 12 digits>-<token><n>`` sort before them
    shards/<id>/rank-<r>.json      per-rank shard records of a sharded save, before rank 0 commits
    leases/<name>.json             what a save in flight reuses, honoured by gc (see ``save/lease.py``)
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..._display import fmt_bytes
from .._errors import FormatVersionError, IntegrityError, NoCheckpointError, ObjectMissingError, StoreError
from ._nogc import no_gc
from .validate import check_manifest

__all__ = ["FORMAT_NAME", "CheckpointInfo", "object_key", "manifest_key", "read_manifest"]

FORMAT_NAME = "gpu_notebook.checkpoint"
# FORMAT_VERSION, the version this library writes and the newest it reads, is defined once: in ..reader, which
# must stay a standalone file (it imports nothing of gpu_notebook)

#: the hash function of each format version: object keys and the chunk fields ``raw`` and ``hash`` (version 4
#: adds optional manifest fields to version 3: a reader treats every one of them as absent in older manifests;
#: version 5 lists the members of a group of small tensors in the group, columnar, instead of one leaf each)
HASH_OF_VERSION = {1: "sha256", 2: "sha256", 3: "blake3", 4: "blake3", 5: "blake3"}


def doc_hash(doc: dict[str, Any]) -> str:
    """The hash function a manifest (or FORMAT document) was written with."""
    v = doc.get("version")
    return HASH_OF_VERSION.get(v if isinstance(v, int) else 2, "sha256")


def hash_fn(name: str) -> Callable[[Any], str]:
    """Hex digest of a bytes-like object: ``blake3`` (3-4x faster than SHA-256, also cryptographic) or ``sha256``."""
    if name == "sha256":
        return lambda data: hashlib.sha256(data).hexdigest()
    if name == "blake3":
        try:
            from blake3 import blake3
        except ImportError:
            raise ImportError(
                "checkpoints of format versions 3 to 5 are hashed with BLAKE3: pip install blake3 "
                "(or gpu_notebook[checkpoint])"
            ) from None
        return lambda data: blake3(data).hexdigest()
    raise ValueError(f"unknown hash {name!r}: 'blake3' or 'sha256'")


def check_fn() -> Callable[[Any], str] | None:
    """The restore check of a chunk's decoded bytes: XXH3-128 (hex), which a writer records as the chunk field
    ``xxh3`` and a reader compares instead of BLAKE3-hashing the bytes again (``raw``: 6 GB/s on one core here,
    against 60 GB/s); None without the ``xxhash`` package (a writer records none, a reader checks ``raw``).

    It guards against what a store or a codec can get wrong (flipped bits, a wrong base, a truncated frame), as
    zstd's own XXH64 checksums do; like ``raw``, it is no protection against a store that rewrites the manifest
    too."""
    try:
        import xxhash
    except ImportError:
        return None
    return xxhash.xxh3_128_hexdigest  # type: ignore[no-any-return]


def blake3_available() -> bool:
    try:
        import blake3  # noqa: F401
    except ImportError:
        return False
    return True


MANIFEST_PREFIX = "manifests/"
OBJECT_PREFIX = "objects/"
SHARD_PREFIX = "shards/"
LEASE_PREFIX = "leases/"
#: a commit id is this letter and the commit sequence in SEQ_DIGITS digits: ids sort by commit order, and after
#: every format-3 id (those start with a digit)
COMMIT_ID_PREFIX = "c"
SEQ_DIGITS = 10


def commit_id(seq: int) -> str:
    """The id of the commit at place ``seq`` of a store's commit order.

    >>> commit_id(42)
    'c0000000042'
    """
    return f"{COMMIT_ID_PREFIX}{seq:0{SEQ_DIGITS}d}"


def seq_of(ckpt_id: str | None) -> int | None:
    """The commit sequence a commit id names; None for a format-3 id (``<step>-<token><n>``) or anything else.

    >>> seq_of("c0000000042"), seq_of("000000000120-3fa9c2d10007")
    (42, None)
    """
    if (
        ckpt_id
        and len(ckpt_id) == 1 + SEQ_DIGITS
        and ckpt_id.startswith(COMMIT_ID_PREFIX)
        and ckpt_id[1:].isdigit()
    ):
        return int(ckpt_id[1:])
    return None


def old_id_step(ckpt_id: str | None) -> int | None:
    """The step a format-3 id starts with (``<step, 12 digits>-...``); None for anything else."""
    head = ckpt_id.split("-", 1)[0] if ckpt_id and "-" in ckpt_id else ""
    return int(head) if len(head) == 12 and head.isdigit() else None


def object_key(h: str) -> str:
    return f"{OBJECT_PREFIX}{h[:2]}/{h}"


def manifest_key(ckpt_id: str) -> str:
    return f"{MANIFEST_PREFIX}{ckpt_id}.json"


def id_from_key(key: str) -> str | None:
    if key.startswith(MANIFEST_PREFIX) and key.endswith(".json"):
        return key[len(MANIFEST_PREFIX) : -len(".json")]
    return None


def check_version(doc: dict[str, Any], what: str) -> None:
    # the version is defined once, in the standalone reader (which imports numpy: not at this module's import,
    # so that importing gpu_notebook.checkpoint stays light)
    from ..reader import FORMAT_VERSION

    if doc.get("format") != FORMAT_NAME:
        raise FormatVersionError(f"{what} is not a {FORMAT_NAME} document (format={doc.get('format')!r})")
    v = doc.get("version")
    if not isinstance(v, int) or v > FORMAT_VERSION:
        raise FormatVersionError(
            f"{what} uses checkpoint format version {v}, newer than this library reads ({FORMAT_VERSION}); "
            "upgrade gpu_notebook to restore it"
        )


def open_format(store: Any, version: int, *, read_only: bool, write_marker: bool) -> None:
    """Check that ``store`` is reachable and is a checkpoint store this library reads; unless ``read_only``, make
    it one: write its ``FORMAT`` marker (create-only: a no-op when it exists) if ``write_marker`` (rank 0) or
    nobody wrote it yet. A store that cannot be written to fails here, before training starts, and not in the
    first background save."""
    store.check(write=not read_only)
    doc = {"format": FORMAT_NAME, "version": version}
    if not read_only and (write_marker or not store.exists("FORMAT")):
        store.put("FORMAT", json.dumps(doc).encode(), create_only=True)
    try:
        existing = json.loads(store.get("FORMAT"))
    except ObjectMissingError:
        if read_only:
            raise StoreError(
                f"{store.url} is not a checkpoint store (it has no FORMAT marker): check the path"
            ) from None
        return  # pragma: no cover - raced with another rank
    except ValueError as e:
        raise StoreError(f"{store.url}/FORMAT is not valid JSON: {e}") from e
    check_version(existing, f"store {store.url}")


@no_gc()  # (10,000 tensors make a manifest of some 100,000 objects: see no_gc)
def read_manifest(store: Any, ckpt_id: str) -> dict[str, Any]:
    """Fetch and validate one manifest."""
    key = manifest_key(ckpt_id)
    try:
        raw = store.get(key)
    except ObjectMissingError:
        raise NoCheckpointError(f"no checkpoint {ckpt_id!r} in {store.url}") from None
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise IntegrityError(f"manifest {key} nests too deep to be read (damaged or hostile?)") from None
    except ValueError as e:
        raise IntegrityError(f"manifest {key} is not valid JSON: {e}") from e
    if not isinstance(doc, dict):
        raise IntegrityError(f"manifest {key} is not a JSON object (a damaged file?)")
    check_version(doc, f"manifest {key}")
    check_manifest(doc, key, ckpt_id)  # every size it claims, before anything is allocated for it
    return doc


def n_leaves(shard: dict[str, Any]) -> int:
    """How many tensors and values a shard holds (a group's members counted, listed in the group as a writer of
    format 5 lists them, or as leaves)."""
    return len(shard.get("leaves", {})) + sum(
        len(g.get("names", ())) for g in (shard.get("groups") or {}).values()
    )


def walk_chunks(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """A chunk entry and its delta bases, newest first."""
    out = []
    e: dict[str, Any] | None = entry
    while e is not None:
        out.append(e)
        e = e.get("base")
    return out


def manifest_objects(doc: dict[str, Any]) -> set[str]:
    """Every object key a manifest needs, including the bases of its delta chains (per-rank sections too)."""
    keys: set[str] = set()
    for shard in [*doc.get("shards", []), *(doc.get("per_rank") or [])]:
        for ch in shard_chunks(shard):
            for e in walk_chunks(ch):
                keys.add(e["obj"])
    return keys


def shard_chunks(shard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every chunk entry of a shard: its leaves' and its groups' (small tensors saved together, format 4)."""
    parts = [*shard.get("leaves", {}).values(), *(shard.get("groups") or {}).values()]
    return [c for part in parts for c in part.get("chunks", [])]


def restore_frames(chunks: Any) -> dict[tuple[str, int], int]:
    """Every frame a restore of these chunk entries reads (each once: tied chunks share theirs), with its size."""
    return {(e["obj"], int(e["off"])): int(e["size"]) for c in chunks for e in walk_chunks(c)}


def _shard_restore_bytes(shard: dict[str, Any]) -> int:
    return sum(restore_frames(shard_chunks(shard)).values())


@dataclass
class CheckpointInfo:
    """Summary of one committed checkpoint."""

    id: str
    step: int
    created_at: float
    is_base: bool = False
    parent: str | None = None
    world_size: int = 1
    replicated: bool = True
    raw_bytes: int = 0
    new_bytes: int = 0
    n_tensors: int = 0
    #: bytes a restore reads: every frame of every chunk's delta chain, once (the largest shard's)
    restore_bytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    #: its place in the store's commit order (None: a format-3 checkpoint, ordered by step before every commit)
    seq: int | None = None
    #: "live" (the newest commit or one it continues, through ``parent``) or "abandoned" (a branch training
    #: rewound from); set by a listing of the store ("" on its own)
    branch: str = ""

    @property
    def order(self) -> tuple[Any, ...]:
        """Its sort key in the commit order: format-3 checkpoints first, by step then time, then commits by
        sequence."""
        if self.seq is not None:
            return (1, self.seq, 0.0, self.id)
        return (0, self.step, self.created_at, self.id)

    @classmethod
    def from_manifest(cls, doc: dict[str, Any]) -> CheckpointInfo:
        st = doc.get("stats", {})
        return cls(
            id=doc["id"],
            step=int(doc.get("step", -1)),
            created_at=float(doc.get("created_at", 0.0)),
            is_base=bool(doc.get("is_base")),
            parent=doc.get("parent"),
            world_size=int(doc.get("world_size", 1)),
            replicated=bool(doc.get("replicated", True)),
            raw_bytes=int(st.get("raw_bytes", 0)),
            new_bytes=int(st.get("new_bytes", 0)),
            n_tensors=sum(n_leaves(s) for s in doc.get("shards", [])),
            restore_bytes=max((_shard_restore_bytes(s) for s in doc.get("shards", [])), default=0),
            extra={"stats": st, "writer": doc.get("writer", {})},
            seq=doc["seq"] if isinstance(doc.get("seq"), int) else seq_of(doc["id"]),
        )

    @property
    def ratio(self) -> float:
        """Bytes newly written for this checkpoint / raw bytes of its state."""
        return self.new_bytes / self.raw_bytes if self.raw_bytes else 0.0

    def __repr__(self) -> str:
        kind = "base" if self.is_base else "delta"
        return (
            f"<Checkpoint {self.id} step={self.step} {kind} {fmt_bytes(self.raw_bytes)} state, "
            f"{fmt_bytes(self.new_bytes)} written>"
        )


def _fmt_time(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


class CheckpointList(list):  # type: ignore[type-arg]
    """A list of :class:`CheckpointInfo` with a table display."""

    def _table_rows(self) -> list[list[str]]:
        rows = []
        for c in self:
            rows.append(
                [
                    c.id,
                    str(c.step),
                    c.branch,
                    _fmt_time(c.created_at),
                    "base" if c.is_base else "delta",
                    fmt_bytes(c.raw_bytes),
                    fmt_bytes(c.new_bytes),
                    f"{c.ratio:.3f}",
                    fmt_bytes(c.restore_bytes),
                    str(c.world_size),
                ]
            )
        return rows

    _HEAD = ["id", "step", "branch", "time", "kind", "state", "written", "ratio", "restore reads", "ranks"]

    def __repr__(self) -> str:
        if not self:
            return "(no checkpoints)"
        rows = [self._HEAD, *self._table_rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows)

    def _repr_html_(self) -> str:
        import html

        if not self:
            return "<i>no checkpoints</i>"
        head = "".join(f"<th>{h}</th>" for h in self._HEAD)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in r) + "</tr>" for r in self._table_rows()
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
