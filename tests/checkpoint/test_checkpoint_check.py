"""The restore check of decoded bytes: XXH3-128 (the chunk field ``xxh3``) where the writer recorded it, else the
chunk's BLAKE3 hash (``raw``). Both fail a restore whose bytes are not what was saved; the fast one is the one
used when both are there (a damaged ``xxh3`` fails the restore, a damaged ``raw`` alone does not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

xxhash = pytest.importorskip("xxhash")

from gpu_notebook.checkpoint import Checkpointer, IntegrityError  # noqa: E402
from gpu_notebook.checkpoint.restore import decode as decode_mod  # noqa: E402
from gpu_notebook.checkpoint.save import encode as encode_mod  # noqa: E402


def _ck(root: Path) -> Checkpointer:
    return Checkpointer(root, preemption=None, progress=False, current=False, chunk_mb=0.25)


def _saved(root: Path) -> tuple[dict[str, torch.Tensor], str, str]:
    """A base and a delta on it; their ids."""
    g = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(200_000, generator=g), "b": torch.randn(64, generator=g)}
    with _ck(root) as ck:
        base = ck.save(state, 0, block=True).result()
        state["w"][::3] += 1e-3
        delta = ck.save(state, 1, block=True).result()
    assert base is not None and delta is not None and not delta.is_base
    return state, base.id, delta.id


def _chunks(doc: dict[str, Any]) -> list[dict[str, Any]]:
    shard = doc["shards"][0]
    return [c for lf in shard["leaves"].values() for c in lf["chunks"]]


def test_each_new_chunk_records_the_xxh3_of_its_raw_bytes(tmp_path: Path) -> None:
    state, _, delta = _saved(tmp_path)
    doc = json.loads((tmp_path / "manifests" / f"{delta}.json").read_text())
    raw = state["w"].view(torch.uint8).numpy()
    off = 0
    for c in doc["shards"][0]["leaves"]["w"]["chunks"]:
        assert c["xxh3"] == xxhash.xxh3_128_hexdigest(raw[off : off + c["len"]].tobytes())
        off += c["len"]
    assert off == raw.nbytes and len(doc["shards"][0]["leaves"]["w"]["chunks"]) > 1


def _damage(root: Path, ckpt_id: str, field: str) -> None:
    path = root / "manifests" / f"{ckpt_id}.json"
    doc = json.loads(path.read_text())
    c = _chunks(doc)[0]
    c[field] = ("0" if c[field][0] != "0" else "1") + c[field][1:]
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize("which", ["base", "delta"])
def test_a_restore_checks_the_xxh3_not_the_blake3(tmp_path: Path, which: str) -> None:
    state, base, delta = _saved(tmp_path)
    ckpt_id = base if which == "base" else delta
    _damage(tmp_path, ckpt_id, "raw")  # not checked while an xxh3 is there
    got = _ck(tmp_path).restore(ckpt_id)
    if which == "delta":
        assert torch.equal(got["w"], state["w"])
    _damage(tmp_path, ckpt_id, "xxh3")
    with pytest.raises(IntegrityError, match="decoded bytes of tensor 'w' chunk 0 .* do not match"):
        _ck(tmp_path).restore(ckpt_id)
    assert _ck(tmp_path).restore(ckpt_id, verify=False)["w"].shape == state["w"].shape


def test_without_xxhash_a_reader_checks_the_blake3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, _, delta = _saved(tmp_path)
    _damage(tmp_path, delta, "xxh3")
    monkeypatch.setattr(decode_mod, "check_fn", lambda: None)
    assert torch.equal(_ck(tmp_path).restore(delta)["w"], state["w"])  # the xxh3 is not looked at
    _damage(tmp_path, delta, "raw")
    with pytest.raises(IntegrityError, match="do not match"):
        _ck(tmp_path).restore(delta)


def test_without_xxhash_a_writer_records_none_and_restores_check_the_blake3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(encode_mod, "check_fn", lambda: None)
    state, _, delta = _saved(tmp_path)
    doc = json.loads((tmp_path / "manifests" / f"{delta}.json").read_text())
    assert not any("xxh3" in c for c in _chunks(doc))
    assert torch.equal(_ck(tmp_path).restore(delta)["w"], state["w"])
    _damage(tmp_path, delta, "raw")
    with pytest.raises(IntegrityError, match="do not match"):
        _ck(tmp_path).restore(delta)


def test_an_xxh3_that_is_not_a_string_is_refused_before_decoding(tmp_path: Path) -> None:
    _, _, delta = _saved(tmp_path)
    path = tmp_path / "manifests" / f"{delta}.json"
    doc = json.loads(path.read_text())
    _chunks(doc)[0]["xxh3"] = 12
    path.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError, match="'xxh3' check 12 that is not a hex digest"):
        _ck(tmp_path).restore(delta)
