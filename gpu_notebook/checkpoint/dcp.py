"""Experimental: torch.distributed.checkpoint (DCP) on our stores: dedup and deltas per write item, FSDP2 and
DTensor states.

``dcp.save(state_dict, storage_writer=DCPWriter(url))`` and ``dcp.load(state_dict, storage_reader=DCPReader(url))``
work as with DCP's ``FileSystemWriter`` / ``FileSystemReader``, including what DCP does itself: FSDP2
(``fully_shard``) and DTensor states, loading at another world size (DCP's resharding), ``dcp.async_save`` and a
load in one process (``no_dist=True``). What differs is where and how the bytes are kept:

- **In our stores**: a local folder or ``s3://bucket/prefix`` (:func:`~.stores.open_store`), under ``dcp/``, next
  to (never mixed with) a :class:`~.Checkpointer`'s checkpoints of the same prefix.
- **Chunked, compressed, deduplicated**: every write item (a tensor, or one rank's shard of one) is cut into
  4 MiB chunks, each stored once by content (``dcp/objects/<hash[:2]>/<hash>``): a chunk that did not change since
  the last save is not written again, whichever rank writes it.
- **Deltas**: a writer kept from one save to the next (one per rank, as a training loop keeps it) encodes a
  changed chunk against the same chunk of its last full base (the codec's xor/sub frames, lossless), so a
  fine-tune's small updates cost a fraction of their size. A delta is always against a full frame (decoding reads
  at most two), and a chunk whose delta grew past 60% of its base is written full and becomes the new base.
- **Commits**: the coordinator writes ``dcp/commits/<seq>.json`` create-only after every rank wrote its items (DCP
  gathers the ranks' results first), so a save that failed anywhere leaves no commit, and a reader never sees half
  of one. The metadata is JSON (no pickle): tensors' dtypes, sizes and chunks, and each item's chunk records.

A commit is named by its sequence number; ``checkpoint_id`` (DCP's argument) is kept as its label, and a reader
picks the newest commit, a ``seq``, or the newest with a label. See ``docs/checkpoint.md`` ("Experimental:
FSDP2 and DTensor").

**Experimental.** The names here (``DCPWriter``, ``DCPReader``, ``DCPCommit``, ``list_commits``) keep working, but
this module is a second implementation of ideas the :class:`~.Checkpointer` has, and shares only the codec's frames
(``format/codec.py``), the stores and the commit-retry bound (``save/order.py``'s ``COMMIT_TRIES``) with it. What
it does not share:

- **Its layout and commit**: ``dcp/commits/<seq>.json`` and ``dcp/objects/``, numbered on their own, not the
  manifests and commit order of ``docs/checkpoint-format.md`` (no ``parent``, no branches, no ``FORMAT`` marker,
  no leases). ``list()``, ``show``, exports, ``%gpu_checkpoint`` and the standalone ``reader.py`` do not see it.
- **Its rebasing rule**: a changed chunk is a delta against that chunk's last full frame, and is written full
  (the new base) once the delta passes ``REBASE_RATIO`` (60%) of the base; not the Checkpointer's plan
  (``full_every``, ``max_restore_ratio``, a new base when the last delta cost the average).
- **Its encoder**: chunks are encoded and written in DCP's call, on one thread per rank, not by the Checkpointer's
  background pipeline.
- **No gc**: a Checkpointer's ``gc`` never touches ``dcp/``, and nothing deletes a DCP commit or chunk: every chunk
  ever written stays. Deleting a commit's file frees nothing (later commits reuse its chunks). To reclaim space,
  delete the whole ``dcp/`` folder or prefix once none of its commits is needed (``rm -r <folder>/dcp``, ``aws s3
  rm --recursive s3://bucket/prefix/dcp/``), e.g. with one prefix per run.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import StorageReader, StorageWriter
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from gpu_notebook.checkpoint._errors import CheckpointError, NoCheckpointError, ObjectMissingError
from gpu_notebook.checkpoint.format import codec
from gpu_notebook.checkpoint.format._scratch import heap_empty
from gpu_notebook.checkpoint.format.manifest import blake3_available, hash_fn
from gpu_notebook.checkpoint.save.order import COMMIT_TRIES
from gpu_notebook.checkpoint.stores import Store, open_store

__all__ = ["DCPCommit", "DCPReader", "DCPWriter", "list_commits"]

PREFIX = "dcp/"
COMMITS = PREFIX + "commits/"
OBJECTS = PREFIX + "objects/"
FORMAT = "gpu_notebook.dcp"
VERSION = 1
CHUNK_BYTES = 4 * 2**20
SEQ_DIGITS = 10
REBASE_RATIO = 0.6  # a delta frame above this share of its base frame's size: written full, the new base
_MAX_ITEM_BYTES = 2**40  # a commit claiming more for one item is refused before anything is allocated


def _object_key(h: str) -> str:
    return f"{OBJECTS}{h[:2]}/{h}"


def _commit_key(seq: int) -> str:
    return f"{COMMITS}{seq:0{SEQ_DIGITS}d}.json"


@dataclass(frozen=True)
class DCPCommit:
    """One committed DCP save (experimental): its sequence number, label (``checkpoint_id``), time and bytes."""

    seq: int
    label: str | None
    created: float
    items: int
    logical_bytes: int  # the state's size
    written_bytes: int  # bytes this save put into the store (new chunks only)


def list_commits(store: str | os.PathLike[str] | Store) -> list[DCPCommit]:
    """Every DCP commit in ``store``, oldest first (experimental; nothing deletes them: see the module's
    docstring, "No gc")."""
    st = open_store(store)
    out = []
    for info in st.list(COMMITS):
        doc = _read_commit(st, info.key)
        out.append(
            DCPCommit(
                doc["seq"],
                doc.get("label"),
                doc["created"],
                len(doc["items"]),
                doc["logical"],
                doc["written"],
            )
        )
    return out


def _read_commit(store: Store, key: str) -> dict[str, Any]:
    try:
        doc = json.loads(store.get(key))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"DCP commit {key!r} is not valid JSON ({exc}): the store is damaged") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise CheckpointError(f"{key!r} is not a gpu_notebook DCP commit")
    if not isinstance(doc.get("version"), int) or doc["version"] > VERSION:
        raise CheckpointError(
            f"DCP commit {key!r} has version {doc.get('version')!r}; this gpu_notebook reads up to {VERSION}: "
            f"upgrade gpu_notebook"
        )
    return doc


# ---- metadata as JSON --------------------------------------------------------------------------------------
def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"DCP commit names an unknown dtype {name!r}")
    return dt


def _index_doc(idx: MetadataIndex) -> dict[str, Any]:
    return {"fqn": idx.fqn, "offset": None if idx.offset is None else list(idx.offset), "index": idx.index}


def _index(doc: dict[str, Any]) -> MetadataIndex:
    return MetadataIndex(doc["fqn"], doc["offset"], doc["index"])


def _sdm_doc(md: Any) -> dict[str, Any]:
    if isinstance(md, BytesStorageMetadata):
        return {"kind": "bytes"}
    p = md.properties
    return {
        "kind": "tensor",
        "dtype": _dtype_name(p.dtype),
        "requires_grad": bool(p.requires_grad),
        "size": list(md.size),
        "chunks": [{"offsets": list(c.offsets), "sizes": list(c.sizes)} for c in md.chunks],
    }


def _sdm(doc: dict[str, Any]) -> Any:
    if doc["kind"] == "bytes":
        return BytesStorageMetadata()
    return TensorStorageMetadata(
        properties=TensorProperties(dtype=_dtype(doc["dtype"]), requires_grad=doc["requires_grad"]),
        size=torch.Size(doc["size"]),
        chunks=[
            ChunkStorageMetadata(torch.Size(c["offsets"]), torch.Size(c["sizes"])) for c in doc["chunks"]
        ],
    )


def _planner_data_doc(data: Any) -> Any:
    """DCP's default planner's key paths (fqn -> tuple of keys) as JSON; anything else is not kept."""
    if isinstance(data, dict) and all(
        isinstance(v, tuple) and all(isinstance(k, str | int) for k in v) for v in data.values()
    ):
        return {str(k): list(v) for k, v in data.items()}
    return None


# ---- bytes of one item ---------------------------------------------------------------------------------------
def _tensor_bytes(t: torch.Tensor) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return np.zeros(0, np.uint8)
    return t.view(torch.uint8).numpy()


class DCPWriter(StorageWriter):
    """Experimental (see the module's docstring): a DCP ``StorageWriter`` into a store (a folder or ``s3://``;
    ``store_options`` go to :func:`~.stores.open_store`). Keep one per rank across saves: its deltas are against
    what it wrote before.

    ``last_written_bytes`` / ``last_logical_bytes``: what this rank's last save wrote and how big its part of the
    state is; ``last_commit``: the coordinator's last commit (None on other ranks).
    """

    def __init__(self, store: str | os.PathLike[str] | Store, level: int = 1, **store_options: Any) -> None:
        super().__init__()
        self.store = open_store(store, **store_options)
        self.level = level
        self.label: str | None = None
        self.is_coordinator = True
        self.hash_name = "blake3" if blake3_available() else "sha256"
        self._hash = hash_fn(self.hash_name)
        self._chunks: dict[_ItemKey, list[_Chunk | None]] = {}  # per item, per chunk: its base and last save
        self._prior_records: dict[tuple[_ItemKey, int], dict[str, Any]] | None = None
        self._lock = threading.Lock()
        self.last_written_bytes = 0
        self.last_logical_bytes = 0
        self.last_commit: DCPCommit | None = None

    # ---- StorageWriter ---------------------------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        self.label = None if checkpoint_id is None else os.fspath(checkpoint_id)
        self.last_written_bytes = self.last_logical_bytes = 0

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("use_collectives", True) is False:
            raise CheckpointError(
                "DCPWriter needs DCP's collectives (use_collectives=True, the default): the commit is written "
                "once every rank's items are, by the coordinator"
            )
        self.is_coordinator = is_coordinator
        if is_coordinator:
            self.store.check(write=True)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        results = []
        written = logical = 0
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)
                raw = np.frombuffer(data.getbuffer(), np.uint8).copy()
                record, n_written = self._write_bytes(raw)
                width = 1
            else:
                assert isinstance(data, torch.Tensor)
                raw = _tensor_bytes(data)
                width = data.element_size()
                key = (item.index.fqn, None if item.index.offset is None else tuple(item.index.offset))
                record, n_written = self._write_tensor(key, raw, width)
            written += n_written
            logical += raw.nbytes
            results.append(WriteResult(index=item.index, size_in_bytes=raw.nbytes, storage_data=record))
        self.last_written_bytes, self.last_logical_bytes = written, logical
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        items = [
            {"index": _index_doc(r.index), "nbytes": r.size_in_bytes, **r.storage_data}
            for rs in results
            for r in rs
        ]
        doc = {
            "format": FORMAT,
            "version": VERSION,
            "hash": self.hash_name,
            "label": self.label,
            "created": time.time(),
            "save_id": uuid.uuid4().hex,
            "state": {k: _sdm_doc(v) for k, v in metadata.state_dict_metadata.items()},
            "planner_data": _planner_data_doc(metadata.planner_data),
            "items": items,
            "logical": sum(i["nbytes"] for i in items),
            "written": sum(i["written"] for i in items),
        }
        # the bound of a Checkpointer's commit (save/order.py): every try lists the commits again, so a try is
        # lost only to a writer on the same prefix that committed between this listing and this write
        seq = 0
        for _ in range(COMMIT_TRIES):
            seq = max(seq, _next_seq(self.store))
            doc["seq"] = seq
            body = json.dumps(doc, separators=(",", ":")).encode()
            if self.store.put(_commit_key(seq), body, create_only=True):
                break
            seq += 1
        else:
            raise CheckpointError(
                f"could not commit the DCP save in {self.store.url}: {COMMIT_TRIES} places were taken by other "
                "writers while it tried them"
            )
        self.last_commit = DCPCommit(
            seq, self.label, doc["created"], len(items), doc["logical"], doc["written"]
        )

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False  # a store is given as the writer itself; checkpoint_id is only the commit's label

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.label)

    # ---- chunks --------------------------------------------------------------------------------------------
    def _put(self, frame: bytes) -> tuple[str, int]:
        """Store a frame by its hash (create-only): its key's hash and the bytes written (0: it was there)."""
        h = self._hash(frame)
        return h, len(frame) if self.store.put(_object_key(h), frame, create_only=True) else 0

    def _write_bytes(self, raw: np.ndarray) -> tuple[dict[str, Any], int]:
        frame, _ = codec.encode_chunk(raw, 1, None, self.level)
        h, n = self._put(frame)
        chunk = {"obj": h, "base": None, "n": raw.nbytes, "len": len(frame)}
        return {"kind": "bytes", "chunks": [chunk], "written": n}, n

    def _write_tensor(self, key: _ItemKey, raw: np.ndarray, width: int) -> tuple[dict[str, Any], int]:
        with self._lock:
            before = self._chunks.get(key)
        after: list[_Chunk | None] = []
        records, written = [], 0
        rec: dict[str, Any]
        step = max(width, CHUNK_BYTES // width * width)
        for i, off in enumerate(range(0, max(raw.nbytes, 1), step)):
            part = raw[off : off + step]
            raw_h = self._hash(part)
            old = before[i] if before is not None and i < len(before) else None
            if old is not None and old.raw.nbytes != part.nbytes:
                old = None
            if old is not None and raw_h in (old.last_raw, old.base_raw):  # unchanged: its frame, unwritten
                rec = (
                    old.last
                    if raw_h == old.last_raw
                    else {"obj": old.base_obj, "base": None, "len": old.base_len}
                )
                records.append({**rec, "n": part.nbytes, "raw": raw_h})
                after.append(old)
                continue
            # no base here: the first commit this writer saw
            prior = self._prior().get((key, i)) if old is None else None
            if prior is not None and prior["raw"] == raw_h and prior["n"] == part.nbytes:
                records.append(prior)  # unchanged since the last commit (another process wrote it)
                full = prior["base"] is None and isinstance(prior.get("len"), int)
                rec = {k: prior[k] for k in ("obj", "base", "len") if k in prior}
                after.append(
                    _Chunk(raw_h, prior["obj"], part.copy(), prior["len"], raw_h, rec) if full else None
                )
                continue
            if old is not None:
                frame, transform = codec.encode_chunk(part, width, old.raw, self.level)
                if transform in ("xor", "sub") and len(frame) <= REBASE_RATIO * old.base_len:
                    h, n = self._put(frame)
                    written += n
                    rec = {"obj": h, "base": old.base_obj}
                    records.append({**rec, "n": part.nbytes, "raw": raw_h})
                    after.append(_Chunk(old.base_raw, old.base_obj, old.raw, old.base_len, raw_h, rec))
                    continue
            frame, _ = codec.encode_chunk(part, width, None, self.level)  # full: the chunk's new base
            h, n = self._put(frame)
            written += n
            rec = {"obj": h, "base": None, "len": len(frame)}
            records.append({**rec, "n": part.nbytes, "raw": raw_h})
            after.append(_Chunk(raw_h, h, part.copy(), len(frame), raw_h, rec))
        with self._lock:
            self._chunks[key] = after
        return {"kind": "tensor", "width": width, "chunks": records, "written": written}, written

    def _prior(self) -> dict[tuple[_ItemKey, int], dict[str, Any]]:
        """The newest commit's chunk records by (item, chunk index): read once, for a writer's first save."""
        if self._prior_records is None:
            found: dict[tuple[_ItemKey, int], dict[str, Any]] = {}
            keys = self.store.list(COMMITS)
            if keys:
                doc = _read_commit(self.store, keys[-1].key)
                if doc.get("hash") == self.hash_name:
                    for item in doc["items"]:
                        if item.get("kind") == "tensor":
                            idx = item["index"]
                            key = (idx["fqn"], None if idx["offset"] is None else tuple(idx["offset"]))
                            for i, c in enumerate(item["chunks"]):
                                found[(key, i)] = c
            self._prior_records = found
        return self._prior_records


_ItemKey = tuple[str, tuple[int, ...] | None]  # a write item: its fqn and offset


@dataclass(frozen=True)
class _Chunk:
    """What a writer remembers of one chunk of an item: its full base frame (raw bytes kept, to encode deltas
    against) and the record of its last save."""

    base_raw: str  # hash of the base's raw bytes
    base_obj: str  # the base frame's object
    raw: np.ndarray  # the base's raw bytes
    base_len: int  # the base frame's size
    last_raw: str  # hash of the raw bytes last saved
    last: dict[str, Any]  # the last save's record ({"obj", "base"})


def _next_seq(store: Store) -> int:
    keys = [i.key for i in store.list(COMMITS)]
    if not keys:
        return 1
    return int(keys[-1][len(COMMITS) :].split(".")[0]) + 1


class DCPReader(StorageReader):
    """Experimental (see the module's docstring): a DCP ``StorageReader`` from a store: the newest commit, or
    ``seq=``, or the newest with ``label=`` (the ``checkpoint_id`` it was saved with; DCP's own ``checkpoint_id``
    argument to ``dcp.load`` picks a label too)."""

    def __init__(
        self,
        store: str | os.PathLike[str] | Store,
        seq: int | None = None,
        label: str | None = None,
        verify: bool = True,
        **store_options: Any,
    ) -> None:
        super().__init__()
        self.store = open_store(store, **store_options)
        self.seq, self.label, self.verify = seq, label, verify
        self.commit: dict[str, Any] | None = None
        self.storage_data: dict[MetadataIndex, dict[str, Any]] = {}
        self.state_md: dict[str, Any] = {}  # the checkpoint's tensors (DCP's state_dict_metadata)
        self._hash = hash_fn("blake3" if blake3_available() else "sha256")  # read_metadata: the commit's own

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self.label, self.seq = os.fspath(checkpoint_id), None
        self.commit, self.storage_data = None, {}

    def _find(self) -> dict[str, Any]:
        if self.seq is not None:
            try:
                return _read_commit(self.store, _commit_key(self.seq))
            except ObjectMissingError:
                raise NoCheckpointError(f"no DCP commit {self.seq} in {self.store.url}") from None
        for info in reversed(self.store.list(COMMITS)):
            doc = _read_commit(self.store, info.key)
            if self.label is None or doc.get("label") == self.label:
                return doc
        what = "no DCP commit" if self.label is None else f"no DCP commit labelled {self.label!r}"
        raise NoCheckpointError(
            f"{what} in {self.store.url} (saved with dcp.save(..., storage_writer=DCPWriter))"
        )

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        doc = self.commit = self._find()
        self._hash = hash_fn(doc.get("hash", "sha256"))
        storage: dict[MetadataIndex, dict[str, Any]] = {}
        for item in doc["items"]:
            n = item.get("nbytes")
            if not isinstance(n, int) or not 0 <= n <= _MAX_ITEM_BYTES:
                raise CheckpointError(f"DCP commit {doc.get('seq')} claims an item of {n!r} bytes: damaged")
            if sum(c["n"] for c in item["chunks"]) != n:
                raise CheckpointError(
                    f"DCP commit {doc.get('seq')}: an item's chunks do not add up to its size"
                )
            storage[_index(item["index"])] = item
        planner = doc.get("planner_data")
        md = Metadata(
            state_dict_metadata={k: _sdm(v) for k, v in doc["state"].items()},
            planner_data=None if planner is None else {k: tuple(v) for k, v in planner.items()},
            storage_data=storage,
            storage_meta=StorageMeta(checkpoint_id=doc.get("label"), load_id=uuid.uuid4().hex),
        )
        return md

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        self.storage_data = metadata.storage_data
        self.state_md = metadata.state_dict_metadata

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        decoded: dict[MetadataIndex, np.ndarray] = {}  # an item several reads of this plan slice
        frames: dict[str, np.ndarray] = {}  # decoded full frames (bases shared by several chunks' deltas)
        for req in plan.items:
            item = self.storage_data[req.storage_index]
            raw = decoded.get(req.storage_index)
            if raw is None:
                raw = decoded[req.storage_index] = self._item_bytes(item, frames)
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(raw.tobytes()))
                continue
            md = self.state_md[req.storage_index.fqn]
            stored = _stored_shape(md, req)
            tensor = torch.from_numpy(raw).view(md.properties.dtype).reshape(stored)
            for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                tensor = tensor.narrow(dim, start, length)
            target = planner.resolve_tensor(req).detach()
            if target.size() != tensor.size():
                raise CheckpointError(
                    f"DCP load of {req.storage_index.fqn!r}: the checkpoint's piece is {tuple(tensor.size())}, "
                    f"the target's {tuple(target.size())}"
                )
            target.copy_(tensor)
            planner.commit_tensor(req, target)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

    # ---- decoding ------------------------------------------------------------------------------------------
    def _frame(self, h: str) -> bytes:
        data = self.store.get(_object_key(h))
        if self.verify and self._hash(data) != h:
            raise CheckpointError(f"DCP object {h} does not match its hash: the store is damaged")
        return data

    def _item_bytes(self, item: dict[str, Any], frames: dict[str, np.ndarray]) -> np.ndarray:
        out = heap_empty(item["nbytes"])  # (as torch allocates: no huge-page advice, see _scratch.heap_empty)
        pos = 0
        for c in item["chunks"]:
            n = c["n"]
            base = None
            if c.get("base"):
                base = frames.get(c["base"])
                if base is None:
                    base = frames[c["base"]] = codec.decode_chunk(self._frame(c["base"]))
            codec.decode_chunk(self._frame(c["obj"]), base, out[pos : pos + n])
            pos += n
        return out


def _stored_shape(md: TensorStorageMetadata, req: Any) -> list[int]:
    """The shape of the piece an item holds: the chunk of the tensor at the request's storage offset."""
    offset = list(req.storage_index.offset or [])
    for c in md.chunks:
        if list(c.offsets) == offset:
            return list(c.sizes)
    return list(md.size)
