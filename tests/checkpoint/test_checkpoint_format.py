"""Format versions: versions 3 and 4 hash with BLAKE3, version 2 with SHA-256; both are written and read, and a
chain never mixes them."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch

import gpu_notebook.checkpoint.checkpointer as ckmod
from gpu_notebook.checkpoint import FORMAT_VERSION, Checkpointer
from gpu_notebook.checkpoint.format.manifest import doc_hash, hash_fn

pytestmark = pytest.mark.timeout(120)


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(300_000, generator=g), "b": torch.randn(1000, generator=g).to(torch.bfloat16)}


def _objects(root: Path) -> list[Path]:
    return [f for f in (root / "objects").rglob("*") if f.is_file()]


@pytest.mark.parametrize("name,version", [("blake3", 5), ("sha256", 2)])
def test_object_keys_are_the_hash_of_their_bytes(tmp_path: Path, name: str, version: int) -> None:
    ck = Checkpointer(tmp_path, hash=name, preemption=None, progress=False)
    try:
        st = _state()
        ck.save(st, 0, block=True)
        with torch.no_grad():
            st["w"][:1000] += 1e-3
        info = ck.save(st, 1, block=True).result()
        assert info is not None and not info.is_base
        doc = ck.manifest(info.id)
        assert doc["version"] == version and doc_hash(doc) == name
        h = hash_fn(name)
        files = _objects(tmp_path)
        assert files and all(f.name == h(f.read_bytes()) for f in files)
        if name == "sha256":
            assert all(f.name == hashlib.sha256(f.read_bytes()).hexdigest() for f in files)
        got = ck.restore(info.id)
        assert torch.equal(got["w"], st["w"]) and torch.equal(got["b"], st["b"])
        assert json.loads((tmp_path / "FORMAT").read_text())["version"] == version
    finally:
        ck.close()
    assert FORMAT_VERSION == 5


def test_version_2_store_is_read_and_continued_with_a_full_base(tmp_path: Path) -> None:
    old = Checkpointer(tmp_path, hash="sha256", preemption=None, progress=False)
    st = _state()
    old.save(st, 0, block=True)
    old.close()
    new = Checkpointer(tmp_path, preemption=None, progress=False)  # BLAKE3 (version 5)
    try:
        assert new.hash == "blake3"
        got = new.restore()
        assert torch.equal(got["w"], st["w"])
        with torch.no_grad():
            st["w"][:10] += 1.0
        info = new.save(st, 1, block=True).result()
        assert info is not None and info.is_base  # no chain across hash functions
        assert new.manifest(info.id)["version"] == 5
        assert torch.equal(new.restore(info.id)["w"], st["w"])
        assert torch.equal(new.restore(new.list()[0].id)["w"], got["w"])  # the version-2 one still reads
    finally:
        new.close()


def test_without_blake3_the_writer_uses_version_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ckmod, "blake3_available", lambda: False)
    ck = Checkpointer(tmp_path, preemption=None, progress=False)
    try:
        assert ck.hash == "sha256"
        info = ck.save(_state(), 0, block=True).result()
        assert info is not None and ck.manifest(info.id)["version"] == 2
    finally:
        ck.close()


def test_reading_version_3_without_blake3_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = Checkpointer(tmp_path, preemption=None, progress=False)
    ck.save(_state(), 0, block=True)
    ck.close()
    monkeypatch.setitem(sys.modules, "blake3", None)  # import blake3 -> ImportError
    monkeypatch.setattr(ckmod, "blake3_available", lambda: False)
    reader = Checkpointer(tmp_path, preemption=None, progress=False)
    try:
        with pytest.raises(ImportError, match="pip install blake3"):
            reader.restore()
    finally:
        reader.close()
    with pytest.raises(ValueError, match="unknown hash"):
        Checkpointer(tmp_path, hash="md5")


def test_restored_tensors_changed_in_place_are_not_used_as_delta_bases(tmp_path: Path) -> None:
    """Restore hands out the decoded buffers themselves (no second copy); they are also the base of the next
    delta, which checks them first, and they are never recycled as snapshot buffers."""
    ck = Checkpointer(tmp_path, preemption=None, progress=False)
    try:
        st = _state()
        ck.save(st, 0, block=True)
        ck2 = Checkpointer(tmp_path, preemption=None, progress=False)
        got = ck2.restore()
        kept = got["w"].clone()
        got["w"][:5000] += 1.0  # the caller trains on the restored tensors directly
        st2 = {"w": got["w"], "b": got["b"]}
        a = ck2.save(st2, 1, block=True).result()
        assert a is not None
        assert torch.equal(ck2.restore(a.id)["w"], st2["w"])  # right bytes despite the changed base memory
        with torch.no_grad():
            st2["w"][:10] -= 0.5
        b = ck2.save(st2, 2, block=True).result()  # a delta against the previous save: its own copy
        assert b is not None and not b.is_base
        assert torch.equal(ck2.restore(b.id)["w"], st2["w"])
        assert torch.equal(ck.restore(ck.list()[0].id)["w"], kept - 0.0)
        ck2.close()
    finally:
        ck.close()
