"""A restore from a cold page cache (after a restart, or once the system dropped the files): the local store reads
an uncached range ahead as a whole, and the restore reads cold objects in small pieces; warm ones as before."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, LocalStore
from gpu_notebook.checkpoint.stores import local as local_mod

pytestmark = pytest.mark.skipif(
    local_mod._NOWAIT is None or not hasattr(os, "posix_fadvise"),
    reason="telling and dropping what is in the page cache needs Linux (RWF_NOWAIT, posix_fadvise)",
)


def _evict(path: Path) -> None:
    """Drop a file from the page cache (written back first: only clean pages can be dropped). Under other I/O
    (the rest of the suite beside it) one drop may leave pages behind: asked again until they are gone."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        deadline = time.monotonic() + 10
        while True:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if not size or local_mod._resident(fd, 0, size) is not True or time.monotonic() > deadline:
                return
            time.sleep(0.05)
    finally:
        os.close(fd)


def _files(root: Path) -> list[Path]:
    return [f for f in root.rglob("*") if f.is_file()]


def _cold_file(tmp_path: Path, nbytes: int) -> tuple[LocalStore, str, bytes]:
    store = LocalStore(tmp_path)
    blob = os.urandom(nbytes)
    store.put("objects/ab/blob", blob)
    _evict(tmp_path / "objects" / "ab" / "blob")
    if store.cached("objects/ab/blob") is not False:
        pytest.fail("the page cache could not be dropped for a file in the test's temporary folder")
    return store, "objects/ab/blob", blob


def test_cached_tells_whether_an_object_is_in_the_page_cache(tmp_path: Path) -> None:
    store, key, blob = _cold_file(tmp_path, 3 << 20)
    assert store.cached(key) is False
    assert store.get(key) == blob  # read through the page cache
    assert store.cached(key) is True
    assert store.cached("objects/ab/missing") is None


def _wait_resident(store: LocalStore, key: str, offset: int, length: int, timeout: float) -> bool:
    fd = os.open(store._path(key), os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if local_mod._resident(fd, offset, length):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    finally:
        os.close(fd)


def test_an_uncached_range_is_read_ahead_as_a_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapped range is only read when touched, unless it was cold when asked for: then all of it is read
    ahead at once (the caller has not touched a byte of it)."""
    store, key, blob = _cold_file(tmp_path, 8 << 20)
    monkeypatch.setattr(local_mod, "READ_AHEAD", False)
    view = store.get_range(key, 1 << 20, 4 << 20)  # mapped, not touched
    # not a wait for a condition: that nothing gets read is checked after the time a read-ahead would have had
    time.sleep(0.3)
    assert not _wait_resident(store, key, 1 << 20, 4 << 20, timeout=0.0)
    monkeypatch.setattr(local_mod, "READ_AHEAD", True)
    view = store.get_range(key, 1 << 20, 4 << 20)
    assert _wait_resident(store, key, 1 << 20, 4 << 20, timeout=30.0)
    assert bytes(view) == blob[1 << 20 : 5 << 20]


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(1 << 18, generator=g) for i in range(24)}  # 24 MB in 1 MiB tensors


def test_a_cold_restore_reads_small_pieces_and_a_warm_one_big_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ckpt"
    state = _state(0)
    with Checkpointer(root, progress=False) as ck:
        ck.save(state, 1).result()
        later = {
            k: v + 1e-3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1))
            for k, v in state.items()
        }
        info = ck.save(later, 2).result()
    assert info is not None
    reads: list[int] = []
    real = LocalStore.get_range

    def get_range(self: LocalStore, key: str, offset: int, length: int) -> bytes | memoryview:
        if key.startswith("objects/"):
            reads.append(length)
        return real(self, key, offset, length)

    monkeypatch.setattr(LocalStore, "get_range", get_range)

    def restore() -> dict[str, torch.Tensor]:
        with Checkpointer(root, progress=False) as rd:
            return rd.restore(info.id)

    for f in _files(root):
        _evict(f)
    got = restore()
    assert set(got) == set(later) and all(torch.equal(got[k], later[k]) for k in later)
    cold = list(reads)
    assert cold and max(cold) <= LocalStore.read_bytes, cold
    reads.clear()
    got = restore()  # every object is in the page cache now
    assert all(torch.equal(got[k], later[k]) for k in later)
    assert max(reads) > LocalStore.read_bytes and len(reads) < len(cold), (reads, cold)


def test_reads_are_requested_in_the_order_the_chains_need_them(tmp_path: Path) -> None:
    """Each chunk's base frame and delta frame lie in different objects; the reads that bring them are requested
    one after the other, chain by chain (biggest first), so that chains finish while later reads still come in."""
    from gpu_notebook.checkpoint.format.manifest import read_manifest
    from gpu_notebook.checkpoint.restore.decode import _ShardDecoder

    root = tmp_path / "ckpt"
    state = _state(0)
    with Checkpointer(root, progress=False, pack_max_mb=1.5) as ck:  # a read per frame or two
        ck.save(state, 1).result()
        info = ck.save({k: v + 1e-3 for k, v in state.items()}, 2).result()
    assert info is not None
    store = LocalStore(root)
    doc = read_manifest(store, info.id)
    dec = _ShardDecoder(doc, store, threads=2, pack_max=int(1.5 * 2**20), verify=True)
    dec.plan(doc["shards"][0]["leaves"])
    assert all(len(ch.chain) == 2 for ch in dec.chains)  # chains of one: a base and a delta each
    assert len({dec.groups[gi][0] for ch in dec.chains for gi in ch.groups}) >= 2  # in two objects at least
    seen: list[int] = []  # the reads in the order the chains first need them
    for ch in dec.chains:
        seen.extend(gi for gi in ch.groups if gi not in seen)
    assert seen == sorted(seen) == list(range(len(dec.groups)))
