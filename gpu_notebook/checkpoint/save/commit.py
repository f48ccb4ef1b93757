"""The commit point of a save: its manifest, written create-only and last. In a sharded save every rank but 0
writes its shard record, and rank 0 gathers them into the one manifest."""

from __future__ import annotations

import functools
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from typing import Any

from .._errors import CheckpointError, ObjectMissingError
from ..format.manifest import FORMAT_NAME, SHARD_PREFIX, CheckpointInfo, manifest_key, read_manifest
from ..snapshot import Snapshot
from ..stores import Store

__all__ = ["Committer", "writer_info"]


@functools.cache
def _static_writer_info() -> dict[str, Any]:
    """What a manifest records about the code that wrote it, apart from the pid and torch (computed once:
    looking up the installed version reads package metadata, several milliseconds per save otherwise)."""
    info: dict[str, Any] = {
        "lib": "gpu_notebook.checkpoint",
        "python": platform.python_version(),
        "host": platform.node(),
        "program": os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "",
    }
    from importlib.metadata import PackageNotFoundError, version

    try:
        info["version"] = version("gpu_notebook")
    except PackageNotFoundError:  # run from a source tree that was never installed
        pass
    return info


def writer_info() -> dict[str, Any]:
    info = {**_static_writer_info(), "pid": os.getpid()}
    if "torch" in sys.modules:  # may be imported after the first save
        info["torch"] = sys.modules["torch"].__version__
    return info


def _shard_key(ckpt_id: str, rank: int) -> str:
    return f"{SHARD_PREFIX}{ckpt_id}/rank-{rank:05d}.json"


@dataclass
class Committer:
    """Writes the manifest of a save (with the shards of every rank, in a sharded save)."""

    store: Store
    version: int  # the format version written
    rank: int
    world_size: int
    sharded: bool
    commit_timeout_s: float

    def commit(
        self,
        snap: Snapshot,
        ckpt_id: str,
        shard: dict[str, Any],
        stats: dict[str, Any],
        is_base: bool,
        parent: str | None,
    ) -> CheckpointInfo | None:
        """Commit the save; its info, or None on a rank other than 0 of a sharded save (rank 0 commits)."""
        shards = [shard]
        replicated = self.world_size == 1 or not self.sharded
        if self.sharded:
            if self.rank != 0:
                rec = json.dumps({"shard": shard, "stats": stats}).encode()
                self.store.put(_shard_key(ckpt_id, self.rank), rec, create_only=True)
                return None
            shards += self._gather(ckpt_id, stats)
            sig = [{n: [c["raw"] for c in lf["chunks"]] for n, lf in s["leaves"].items()} for s in shards]
            replicated = all(s == sig[0] for s in sig) and all(s["tree"] == shards[0]["tree"] for s in shards)
        doc = {
            "format": FORMAT_NAME,
            "version": self.version,
            "id": ckpt_id,
            "step": snap.step,
            "created_at": snap.created_at,
            "committed_at": time.time(),
            "parent": parent,
            "is_base": is_base,
            "world_size": self.world_size,
            "sharded": self.sharded,
            "replicated": replicated,
            "writer": writer_info(),
            "stats": stats,
            "shards": shards,
        }
        data = json.dumps(doc, separators=(",", ":")).encode()
        if not self.store.put(manifest_key(ckpt_id), data, create_only=True):
            doc = self._ours_already(snap, ckpt_id)
        if self.sharded:
            for r in range(1, self.world_size):
                self.store.delete(_shard_key(ckpt_id, r))
        return CheckpointInfo.from_manifest(doc)

    def _gather(self, ckpt_id: str, stats: dict[str, Any]) -> list[dict[str, Any]]:
        """Rank 0: the other ranks' shard records, from the store (their stats added to ``stats``)."""
        shards = []
        deadline = time.monotonic() + self.commit_timeout_s
        for r in range(1, self.world_size):
            delay = 0.05
            while True:
                try:
                    rec = json.loads(self.store.get(_shard_key(ckpt_id, r)))
                    break
                except ObjectMissingError:
                    if time.monotonic() > deadline:
                        raise CheckpointError(
                            f"checkpoint {ckpt_id}: rank {r} did not save its shard within "
                            f"{self.commit_timeout_s:.0f} s; the checkpoint is not committed"
                        ) from None
                    time.sleep(delay)
                    delay = min(1.0, delay * 2)
            shards.append(rec["shard"])
            for k in ("raw_bytes", "new_bytes", "new_objects", "reused_bytes"):
                stats[k] += rec["stats"].get(k, 0)
        return shards

    def _ours_already(self, snap: Snapshot, ckpt_id: str) -> dict[str, Any]:
        """The manifest is there already. An earlier attempt of this very save may have been committed with its
        answer lost (a dropped connection after the server stored it): then it is ours, and committed; anything
        else is refused."""
        try:
            there = read_manifest(self.store, ckpt_id)
        except CheckpointError:
            there = None
        if not (
            there is not None
            and there.get("id") == ckpt_id
            and there.get("created_at") == snap.created_at
            and there.get("step") == snap.step
        ):
            raise CheckpointError(
                f"manifest {manifest_key(ckpt_id)} already exists; refusing to overwrite it"
            )
        return there
