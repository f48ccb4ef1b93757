"""Reading what a store holds: listing its checkpoints, finding the newest one (what a resume restores),
resolving an id or a prefix of one, and showing or comparing checkpoints. Nothing here writes."""

from __future__ import annotations

import builtins
import concurrent.futures as cf
import logging
from typing import Any

from ._errors import CheckpointError, FormatVersionError, NoCheckpointError, StoreError
from .format.manifest import (
    MANIFEST_PREFIX,
    CheckpointInfo,
    CheckpointList,
    id_from_key,
    manifest_key,
    old_id_step,
    read_manifest,
    restore_frames,
    seq_of,
    shard_chunks,
)
from .results import DiffResult, ShowResult
from .stores import Store

__all__ = ["Inspector"]

log = logging.getLogger("gpu_notebook.checkpoint")


class Inspector:
    """The read side of a store, with the manifests it has read cached (manifests are immutable)."""

    def __init__(self, store: Store, threads: int) -> None:
        self.store = store
        self.threads = threads
        self._info_cache: dict[str, CheckpointInfo] = {}
        #: (id, error) of each manifest the last :meth:`list` could not read
        self.unreadable: builtins.list[tuple[str, CheckpointError]] = []

    def list(self) -> CheckpointList:
        """All committed checkpoints in commit order, oldest first (format-3 ones first, by step then time), each
        with its ``branch``: "live" for the newest commit and those it continues, else "abandoned"."""
        out = CheckpointList()
        self.unreadable = []
        new: list[str] = []
        for o in self.store.list(MANIFEST_PREFIX):
            cid = id_from_key(o.key)
            if cid is None:
                continue
            cached = self._info_cache.get(cid)  # manifests are immutable: read each one once
            if cached is not None:
                out.append(cached)
            else:
                new.append(cid)
        # the manifests not read before, several at a time (a round trip each on S3)
        n = min(len(new), max(self.threads, int(getattr(self.store, "max_concurrency", 0))))
        if n > 1:
            with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="gnb-ckpt-list") as ex:
                got = list(ex.map(self._read_info, new))
        else:
            got = [self._read_info(cid) for cid in new]
        for cid, r in zip(new, got, strict=True):
            if isinstance(r, CheckpointError):
                log.warning("skipping unreadable manifest %s: %s", manifest_key(cid), r)
                self.unreadable.append((cid, r))
            else:
                self._info_cache[cid] = r
                out.append(r)
        out.sort(key=lambda c: c.order)
        live = set(_branch_of(out[-1].id, out)) if out else set()
        for c in out:  # (cached infos are shared between listings: the branch is set afresh each time)
            c.branch = "live" if c.id in live else "abandoned"
        return out

    def _read_info(self, cid: str) -> CheckpointInfo | CheckpointError:
        try:
            return CheckpointInfo.from_manifest(read_manifest(self.store, cid))
        except StoreError:
            raise  # the store failed (endpoint down, access denied): not a damaged manifest to skip
        except CheckpointError as e:
            return e

    def older(self, ckpt_id: str) -> builtins.list[str]:
        """The ids of the checkpoints ``ckpt_id`` continues (its parent, the parent's parent, ...) that are in the
        store, newest first: what a resume falls back to (never a branch it did not come from)."""
        return _branch_of(ckpt_id, self.list())[1:]

    def newest(self, step: int | None) -> dict[str, Any]:
        """The manifest of the newest commit, or of the newest commit at ``step`` (one on the live branch if
        there is one). Ids sort by commit order, so finding the latest checkpoint, what a resume does, costs one
        listing and a GET or two however many checkpoints the store holds (a store of format-3 checkpoints only:
        the manifests of the highest step). A manifest of a newer format version raises (it must not be skipped
        silently); an unreadable one is skipped."""
        if step is not None:
            return self._newest_at(step)
        listed = [cid for o in self.store.list(MANIFEST_PREFIX) if (cid := id_from_key(o.key))]
        commits = sorted((s, cid) for cid in listed if (s := seq_of(cid)) is not None)
        for _seq, cid in reversed(commits):
            doc = self._read_newest(cid)
            if doc is not None:
                return doc
        by_step: dict[int, builtins.list[str]] = {}
        for cid in listed:
            st = old_id_step(cid)
            if st is not None:
                by_step.setdefault(st, []).append(cid)
        for st in sorted(by_step, reverse=True):
            docs = [d for cid in by_step[st] if (d := self._read_newest(cid)) is not None]
            if docs:
                return max(docs, key=lambda d: (float(d.get("created_at", 0.0)), str(d["id"])))
        raise NoCheckpointError(f"no checkpoint in {self.store.url}")

    def _read_newest(self, cid: str) -> dict[str, Any] | None:
        try:
            return read_manifest(self.store, cid)
        except (FormatVersionError, StoreError):
            raise  # never resume from an older checkpoint because the newest one could not be fetched
        except CheckpointError as e:
            log.warning("skipping unreadable manifest of %s: %s", cid, e)
            return None

    def _newest_at(self, step: int) -> dict[str, Any]:
        lst = self.list()
        at = [c for c in lst if c.step == step]
        if not at:
            for _cid, err in self.unreadable:  # it may have been there, written by a newer version
                if isinstance(err, FormatVersionError):
                    raise err
            raise NoCheckpointError(f"no checkpoint at step {step} in {self.store.url}")
        best = max(at, key=lambda c: (c.branch == "live", c.order))
        return read_manifest(self.store, best.id)

    def latest(self) -> CheckpointInfo | None:
        """The newest commit, or None if the store is empty."""
        try:
            info = CheckpointInfo.from_manifest(self.newest(None))
        except NoCheckpointError:
            return None
        info.branch = "live"  # (the newest commit heads the live branch)
        return info

    def resolve(self, ckpt_id: str | None, step: int | None) -> dict[str, Any]:
        """The manifest of a checkpoint given by id (or a unique prefix of one, or ``"latest"``) or by step."""
        if ckpt_id not in (None, "latest") and step is not None:
            raise ValueError(f"give a checkpoint id or a step, not both (id {ckpt_id!r}, step {step})")
        if ckpt_id is None or ckpt_id == "latest":
            return self.newest(step)
        try:  # a whole id: one request
            return read_manifest(self.store, ckpt_id)
        except NoCheckpointError:  # else a unique prefix of one
            matches = [o for o in self.store.list(MANIFEST_PREFIX + ckpt_id) if id_from_key(o.key)]
            if len(matches) > 1:
                few = ", ".join(str(id_from_key(o.key)) for o in matches[:5])
                more = f" and {len(matches) - 5} more" if len(matches) > 5 else ""
                raise NoCheckpointError(
                    f"checkpoint id prefix {ckpt_id!r} is ambiguous: it matches {len(matches)} "
                    f"checkpoints ({few}{more}); give more of the id"
                ) from None
            if not matches:
                raise
            return read_manifest(self.store, id_from_key(matches[0].key))  # type: ignore[arg-type]

    def show(self, ckpt_id: str | None = None) -> ShowResult:
        """Summary of one checkpoint: info, what a restore of it reads (the groups of small tensors and the
        per-rank sections included), and per tensor dtype/shape/chunks/transforms/stored bytes."""
        doc = self.resolve(ckpt_id, None)
        tensors = {}
        parts = [*doc["shards"], *(doc.get("per_rank") or [])]
        chunks = [c for part in parts for c in shard_chunks(part)]
        frames = restore_frames(chunks)
        several = len(parts) > 1
        for part in parts:
            for name, lf in part["leaves"].items():
                ts: dict[str, int] = {}
                for c in lf["chunks"]:
                    ts[c["t"]] = ts.get(c["t"], 0) + 1
                label = f"rank{part['rank']}:{name}" if several else name
                tensors[label] = {
                    "dtype": lf["dtype"],
                    "shape": lf["shape"],
                    "nbytes": lf["nbytes"],
                    "stored": sum(c["size"] for c in lf["chunks"]),
                    "chunks": len(lf["chunks"]),
                    "transforms": ts,
                    "max_depth": max((c.get("depth", 0) for c in lf["chunks"]), default=0),
                }
                if "group" in lf:  # a small tensor saved inside its group's chunks
                    tensors[label]["group"] = lf["group"]
        return ShowResult(
            info=CheckpointInfo.from_manifest(doc),
            restore={
                "bytes": sum(frames.values()),
                "objects": len({k for k, _ in frames}),
                "max_depth": max((c.get("depth", 0) for c in chunks), default=0),
            },
            stats=doc.get("stats", {}),
            writer=doc.get("writer", {}),
            tensors=tensors,
        )

    def diff(self, a: str, b: str) -> DiffResult:
        """Compare two checkpoints: which tensors/chunks changed (by content hash) and which plain values."""
        da, db = self.resolve(a, None), self.resolve(b, None)
        la = {n: (lf, s) for s in da["shards"] for n, lf in s["leaves"].items()}
        lb = {n: (lf, s) for s in db["shards"] for n, lf in s["leaves"].items()}
        changed: dict[str, Any] = {}
        unchanged: list[str] = []
        for n in la.keys() & lb.keys():
            ca, cb = _raws(*la[n]), _raws(*lb[n])
            if ca == cb and la[n][0]["shape"] == lb[n][0]["shape"] and la[n][0]["dtype"] == lb[n][0]["dtype"]:
                unchanged.append(n)
            else:
                nch = sum(1 for x, y in zip(ca, cb, strict=False) if x != y) + abs(len(ca) - len(cb))
                changed[n] = {"chunks": len(cb), "chunks_changed": nch}
        values: dict[str, Any] = {}
        _diff_values(da["shards"][0]["tree"], db["shards"][0]["tree"], "", values)
        return DiffResult(
            a=da["id"],
            b=db["id"],
            changed=dict(sorted(changed.items())),
            unchanged=sorted(unchanged),
            added=sorted(lb.keys() - la.keys()),
            removed=sorted(la.keys() - lb.keys()),
            values=values,
        )


def _raws(leaf: dict[str, Any], shard: dict[str, Any]) -> builtins.list[str]:
    """The raw hashes of a leaf's chunks; for a small tensor saved in a group with others, of the group's chunks
    that hold its bytes (a change of a neighbour in the same chunk shows as a change of it too)."""
    group = leaf.get("group")
    if group is None:
        return [c["raw"] for c in leaf["chunks"]]
    lo, hi = int(leaf.get("goff", 0)), int(leaf.get("goff", 0)) + int(leaf["nbytes"])
    out, pos = [], 0
    for c in (shard.get("groups") or {}).get(group, {}).get("chunks", []):
        if pos < hi and pos + int(c["len"]) > lo:
            out.append(c["raw"])
        pos += int(c["len"])
    return out


def _diff_values(a: Any, b: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        if len(a) == 1 and len(b) == 1:
            ((ka, va),) = a.items()
            ((kb, vb),) = b.items()
            if ka in ("$tensor", "$ndarray", "$pickle") or kb in ("$tensor", "$ndarray", "$pickle"):
                return
            if ka == kb == "$state":
                _diff_values(va["value"], vb["value"], path, out)
                return
        for k in a.keys() | b.keys():
            _diff_values(a.get(k), b.get(k), f"{path}/{k}" if path else str(k), out)
        return
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff_values(x, y, f"{path}/{i}", out)
        return
    if a != b:
        out[path or "<root>"] = (a, b)


def _branch_of(ckpt_id: str, listed: builtins.list[CheckpointInfo]) -> builtins.list[str]:
    """``ckpt_id`` and the ids of the listed checkpoints it continues, through ``parent``, newest first (the walk
    stops at a root, at a parent that is not listed, deleted by gc, and at a loop)."""
    parent = {c.id: c.parent for c in listed}
    out: builtins.list[str] = []
    cid: str | None = ckpt_id
    while cid is not None and cid in parent and cid not in out:
        out.append(cid)
        cid = parent[cid]
    return out
