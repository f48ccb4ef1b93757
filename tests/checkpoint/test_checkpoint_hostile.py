"""A hostile (or badly damaged) store: manifests that claim huge or inconsistent sizes, delta chains that loop or
run deeper than they say, frames whose header or zstd planes disagree with the manifest, trees nested absurdly
deep. Each restore fails quickly with a clear error naming the manifest, tensor and chunk, before memory is
allocated for what the manifest claims (measured with tracemalloc: numpy reports its allocations to it)."""

from __future__ import annotations

import json
import struct
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zstandard

from gpu_notebook.checkpoint import Checkpointer, CheckpointError, IntegrityError, PerRank
from gpu_notebook.checkpoint.format import codec, validate
from gpu_notebook.checkpoint.format.manifest import doc_hash, hash_fn, object_key
from gpu_notebook.checkpoint.format.tree import DTYPES

pytestmark = pytest.mark.timeout(60)

TB = 1 << 40
#: a restore of the small checkpoint below allocates far less than this; a hostile claim far more
_ALLOC_LIMIT = 64 << 20


def _state(step: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(step)
    return {
        "w": torch.randn(64, 64, generator=g),  # 16 KiB: four chunks of 4 KiB
        "b": torch.arange(100, dtype=torch.int64) + step,
        "nested": {"a": [1, 2, {"c": "x"}]},
        "step": step,
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A store with a base and two deltas (its files are copied for each test)."""
    root = tmp_path_factory.mktemp("hostile-src")
    ck = Checkpointer(root, chunk_mb=4 / 1024, preemption=None, progress=False)
    w = _state(0)
    for step in range(3):
        w["w"] = w["w"] + 1e-3 * torch.randn(64, 64, generator=torch.Generator().manual_seed(10 + step))
        w["b"] = w["b"] + 1
        w["step"] = step
        ck.save(w, step=step, block=True)
    ck.close()
    ids = [c.id for c in Checkpointer(root, read_only=True, preemption=None).list()]
    assert len(ids) == 3
    return root, ids


@pytest.fixture
def store(saved: tuple[Path, list[str]], tmp_path: Path) -> tuple[Path, list[str]]:
    src, ids = saved
    for p in src.rglob("*"):
        if p.is_file():
            dst = tmp_path / p.relative_to(src)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(p.read_bytes())
    return tmp_path, ids


def _manifest(root: Path, ckpt_id: str) -> Path:
    return root / "manifests" / f"{ckpt_id}.json"


def _edit(root: Path, ckpt_id: str, fn: Callable[[dict[str, Any]], Any]) -> None:
    path = _manifest(root, ckpt_id)
    doc = json.loads(path.read_text())
    fn(doc)
    path.chmod(0o644)
    path.write_text(json.dumps(doc))


def _leaf(doc: dict[str, Any], name: str = "w") -> dict[str, Any]:
    leaf: dict[str, Any] = doc["shards"][0]["leaves"][name]
    return leaf


def _restore_fails(root: Path, ckpt_id: str, err: type[Exception], match: str) -> str:
    """Restore ``ckpt_id`` from a fresh reader: it must raise ``err`` matching ``match`` without allocating more
    than ``_ALLOC_LIMIT`` on the way."""
    tracemalloc.start()
    try:
        with pytest.raises(err, match=match) as e:
            Checkpointer(root, read_only=True, preemption=None, progress=False).restore(ckpt_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < _ALLOC_LIMIT, f"{peak} bytes allocated before the error"
    return str(e.value)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit setting one field of the newest chunk of tensor ``w`` (``path``: "leaf.X" or "chunk.X")."""
    where, _, key = path.partition(".")

    def fn(doc: dict[str, Any]) -> None:
        target = _leaf(doc) if where == "leaf" else _leaf(doc)["chunks"][0]
        target[key] = value

    return fn


def _nbytes_1tb_shape_not(doc: dict[str, Any]) -> None:
    lf = _leaf(doc)
    lf["nbytes"] = TB
    lf["chunks"][0]["len"] = TB - 3 * 4096


def _shape_matches_1tb(doc: dict[str, Any]) -> None:
    lf = _leaf(doc)
    lf["shape"] = [1 << 38]  # float32: 1 TiB, and the chunks add up to it, each at most 4 GiB
    c = lf["chunks"][0]
    lf["chunks"] = [{**c, "len": 4 << 30, "depth": 0, "size": 100} for _ in range(256)]
    for e in lf["chunks"]:
        e.pop("base", None)
    lf["nbytes"] = TB


def _extra_chunk(doc: dict[str, Any]) -> None:
    lf = _leaf(doc)
    lf["chunks"].append(dict(lf["chunks"][0]))


def _deeper_than_it_says(doc: dict[str, Any]) -> None:
    _leaf(doc)["chunks"][0]["depth"] = 7  # more than the chain below it has


def _base_of_other_length(doc: dict[str, Any]) -> None:
    _leaf(doc)["chunks"][0]["base"]["len"] = 8192


def _huge_base_frame(doc: dict[str, Any]) -> None:
    _leaf(doc)["chunks"][0]["base"]["size"] = TB


def _tree_references_unknown(doc: dict[str, Any]) -> None:
    doc["shards"][0]["tree"]["extra"] = {"$tensor": "not/there"}


def _tree_too_deep(doc: dict[str, Any]) -> None:
    node: Any = 1
    for _ in range(600):  # readable JSON (Python's reader goes to ~1000), deeper than a writer writes
        node = [node]
    doc["shards"][0]["tree"]["deep"] = node


def _drop_leaves(doc: dict[str, Any]) -> None:
    doc["shards"][0]["leaves"] = []


HOSTILE: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    # sizes
    "nbytes 1 TB, shape not": (
        _nbytes_1tb_shape_not,
        r"tensor 'w'.*claims 1099511627776 bytes, but its shape",
    ),
    "nbytes negative": (_set("leaf.nbytes", -16384), r"tensor 'w'.*claims -16384 bytes"),
    "nbytes not an integer": (_set("leaf.nbytes", 16384.0), r"tensor 'w'.*claims 16384.0 bytes"),
    "nbytes a string": (_set("leaf.nbytes", "16384"), r"tensor 'w'.*claims '16384' bytes"),
    "shape negative": (_set("leaf.shape", [-64, -64]), r"tensor 'w'.*shape that is not a list"),
    "shape of 100 dims": (_set("leaf.shape", [1] * 100), r"tensor 'w'.*shape that is not a list"),
    "dtype unknown": (_set("leaf.dtype", "float128"), r"tensor 'w'.*unknown dtype 'float128'"),
    "kind unknown": (_set("leaf.kind", "module"), r"tensor 'w'.*unknown kind 'module'"),
    "chunk len 1 TB": (_set("chunk.len", TB), r"tensor 'w' chunk 0 of .*length of 1099511627776"),
    "chunk len negative": (_set("chunk.len", -1), r"tensor 'w' chunk 0 of .*length of -1"),
    "chunks do not add up": (_extra_chunk, r"tensor 'w'.*do not add up to its 16384 bytes"),
    "frame size 1 TB": (_set("chunk.size", TB), r"tensor 'w' chunk 0 of .*stored frame of 1099511627776"),
    "frame offset negative": (_set("chunk.off", -5), r"tensor 'w' chunk 0 of .*offset -5"),
    "base frame size 1 TB": (
        _huge_base_frame,
        r"tensor 'w' chunk 0, delta base 1, of .*stored frame of 1099511627776",
    ),
    "object key outside objects/": (_set("chunk.obj", "../../etc/passwd"), r"chunk 0 .*not an object key"),
    # chains
    "deeper than depth says": (
        _deeper_than_it_says,
        r"tensor 'w' chunk 0 of .* says 7 delta bases are below it, but its chain has \d",
    ),
    "base of another length": (
        _base_of_other_length,
        r"delta base 1, of .* claims 8192 bytes, its chunk 4096",
    ),
    # structure
    "tree references an unknown tensor": (_tree_references_unknown, r"references a tensor 'not/there'"),
    "tree nested 600 deep": (_tree_too_deep, r"tree of .* nests deeper than 400 levels"),
    "leaves not a mapping": (_drop_leaves, r"has no leaves"),
    "step not a number": (lambda d: d.update(step="three"), r"'step' is 'three'"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_manifest_fails_clearly_before_allocating(store: tuple[Path, list[str]], case: str) -> None:
    root, ids = store
    edit, match = HOSTILE[case]
    _edit(root, ids[-1], edit)
    msg = _restore_fails(root, ids[-1], IntegrityError, match)
    assert f"manifests/{ids[-1]}.json" in msg  # names the manifest
    # the checkpoints before it still restore
    assert Checkpointer(root, read_only=True, preemption=None).restore(ids[-2])["step"] == 1


def test_a_consistent_claim_of_1_tb_is_refused_for_the_memory_it_needs(store: tuple[Path, list[str]]) -> None:
    """Shape, nbytes and chunks agree on 1 TiB: nothing in the manifest is wrong, but no restore can allocate
    it; it says so (naming the checkpoint, the need and what is available) instead of a MemoryError."""
    root, ids = store
    _edit(root, ids[-1], _shape_matches_1tb)
    msg = _restore_fails(root, ids[-1], CheckpointError, r"needs 1\.1 TB of host memory.* is available")
    assert ids[-1] in msg


def test_json_nested_beyond_the_readers_limit_is_an_integrity_error(store: tuple[Path, list[str]]) -> None:
    """100,000 levels of nesting: Python's JSON reader gives up with a RecursionError, reported as a damaged
    manifest; so is a delta chain embedded 2000 bases deep (the writer's JSON encoder stops earlier: the text is
    written by hand)."""
    root, ids = store
    path = _manifest(root, ids[-1])
    text = path.read_text().rstrip()
    path.chmod(0o644)
    path.write_text(text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _restore_fails(root, ids[-1], IntegrityError, rf"manifest manifests/{ids[-1]}.json nests too deep")

    doc = json.loads(text)
    c = dict(_leaf(doc)["chunks"][0])
    c.pop("base", None)
    head = json.dumps(c)[:-1]
    nested = head + "}"
    for _ in range(2000):
        nested = head + ', "base": ' + nested + "}"
    _leaf(doc)["chunks"][0] = "@@"
    path.write_text(json.dumps(doc).replace('"@@"', nested))
    _restore_fails(root, ids[-1], IntegrityError, rf"manifest manifests/{ids[-1]}.json nests too deep")


def test_a_delta_chain_that_loops_or_runs_too_deep_is_refused() -> None:
    """Chains referenced rather than embedded can loop: the reader follows at most MAX_CHAIN bases and never
    one twice (checked on manifests built in memory, the form a chain of references is resolved into)."""
    frame = {"len": 8, "size": 24, "off": 0, "obj": object_key("ab" * 32), "raw": "x", "hash": "y"}
    a: dict[str, Any] = {**frame, "t": "xor"}
    b: dict[str, Any] = {**frame, "t": "xor", "base": a}
    a["base"] = b
    doc = {
        "id": "c1",
        "shards": [
            {"rank": 0, "tree": {"$tensor": "x"}, "leaves": {"x": {**_LEAF, "chunks": [a]}}},
        ],
    }
    with pytest.raises(IntegrityError, match="tensor 'x' chunk 0 of .*loops back on itself at base 2"):
        validate.check_manifest(doc, "m")
    deep: dict[str, Any] = dict(frame)
    for _ in range(validate.MAX_CHAIN):
        deep = {**frame, "base": deep}
    doc["shards"][0]["leaves"]["x"]["chunks"] = [deep]
    with pytest.raises(IntegrityError, match="longer than 1000 frames"):
        validate.check_manifest(doc, "m")


_LEAF = {"kind": "tensor", "dtype": "float32", "shape": [2], "nbytes": 8}


@pytest.mark.parametrize(
    "leaf",
    [
        {"nbytes": "8", "chunks": []},
        {"nbytes": TB, "chunks": [{"len": TB}]},
        {"nbytes": 8, "chunks": [{"len": 4}]},
        {"nbytes": 8, "chunks": None},
        {"nbytes": 8, "chunks": [{"len": 8.0}]},
    ],
)
def test_the_decoder_checks_the_sizes_it_allocates_by_itself(leaf: dict[str, Any]) -> None:
    """A shard put together after reading (e.g. with a rank's own section) is checked again, cheaply, where it
    is decoded: the sizes it allocates by."""
    with pytest.raises(IntegrityError, match="tensor 'x' of checkpoint c1 has sizes that are not a writer's"):
        validate.check_restore({"id": "c1"}, {"leaves": {"x": {**_LEAF, **leaf}}})
    validate.check_restore(
        {"id": "c1"},
        {"leaves": {"x": {**_LEAF, "chunks": [{"len": 8}]}, "e": {**_LEAF, "nbytes": 0, "chunks": []}}},
    )


# --------------------------------------------------------------------------- frames that disagree with the manifest
def _replace_frame(root: Path, ckpt_id: str, frame: bytes) -> None:
    """Store ``frame`` as a new object and point tensor ``w``'s chunk 0 at it as a full frame, with a consistent
    hash (the manifest is not what is wrong: the frame is)."""
    doc = json.loads(_manifest(root, ckpt_id).read_text())
    h = hash_fn(doc_hash(doc))
    key = object_key(h(frame))
    (root / key).parent.mkdir(parents=True, exist_ok=True)
    (root / key).write_bytes(frame)

    def point(d: dict[str, Any]) -> None:
        c = _leaf(d)["chunks"][0]
        c.pop("base", None)
        c.update(obj=key, off=0, size=len(frame), hash=h(frame), depth=0, t="none")

    _edit(root, ckpt_id, point)


def test_frame_whose_raw_length_disagrees_with_the_manifest(store: tuple[Path, list[str]]) -> None:
    root, ids = store
    raw = np.arange(512, dtype=np.uint8)  # 512 bytes, where the manifest says 4096
    frame, _ = codec.encode_chunk(raw, 4)
    _replace_frame(root, ids[-1], frame)
    msg = _restore_fails(root, ids[-1], IntegrityError, r"tensor 'w' chunk 0 .* does not decode")
    assert "4096" in msg and "512" in msg


def _zstd_claiming(content_size: int, data: bytes) -> bytes:
    """A zstd frame of ``data`` whose header claims ``content_size`` decompressed bytes."""
    z = zstandard.ZstdCompressor(write_content_size=True, write_checksum=False).compress(data)
    fhd = z[4]
    fcs_len = {0: 1 if fhd & 0x20 else 0, 1: 2, 2: 4, 3: 8}[fhd >> 6]
    head = 5 + (0 if fhd & 0x20 else 1) + {0: 0, 1: 1, 2: 2, 3: 4}[fhd & 3]
    return (
        z[:4]
        + bytes([(fhd & 0x3F) | 0xC0])
        + z[5:head]
        + struct.pack("<Q", content_size)
        + z[head + fcs_len :]
    )


def test_zstd_plane_claiming_a_huge_decompressed_size(store: tuple[Path, list[str]]) -> None:
    """A plane's zstd frame header says 1 TB: the decoder refuses it before zstd allocates that."""
    root, ids = store
    n = 4096
    plane = _zstd_claiming(TB, bytes(n))
    assert zstandard.frame_content_size(plane) == TB
    hdr = codec._HDR.pack(codec.FRAME_MAGIC, codec.FRAME_VERSION, codec._MODE_PLANES, 0, 1, n)
    ext = codec._EXT.pack(0, 0, 0)
    frame = hdr + ext + codec._PLANE.pack(codec._KIND_ZSTD, len(plane)) + plane
    with pytest.raises(ValueError, match="plane claims"):
        codec.decode_chunk(frame, None, np.empty(n, np.uint8))
    _replace_frame(root, ids[-1], frame)
    _restore_fails(root, ids[-1], IntegrityError, r"tensor 'w' chunk 0 .*plane claims 1099511627776 bytes")


# --------------------------------------------------------------------------- what still reads
def test_every_golden_manifest_passes_the_checks() -> None:
    """The checks accept everything today's writer (and the format-2 one) wrote."""
    golden = Path(__file__).with_name("golden")
    paths = sorted(golden.glob("v*/*/manifests/*.json"))
    assert paths
    for p in paths:
        validate.check_manifest(json.loads(p.read_text()), p.name, p.stem)


def test_a_hostile_per_rank_section(tmp_path: Path) -> None:
    """A rank's own section (``PerRank`` values) is checked like a shard."""
    ck = Checkpointer(tmp_path, preemption=None, progress=False)
    ck.save({"w": torch.ones(10), "pos": PerRank({"i": torch.arange(10)})}, step=0, block=True)
    ck.close()
    (cid,) = [c.id for c in Checkpointer(tmp_path, read_only=True, preemption=None).list()]

    def huge(doc: dict[str, Any]) -> None:
        (lf,) = doc["per_rank"][0]["leaves"].values()
        lf["nbytes"] = lf["chunks"][0]["len"] = TB

    _edit(tmp_path, cid, huge)
    _restore_fails(
        tmp_path, cid, IntegrityError, r"tensor '//rank/.*' of per-rank section 0 of manifest .* claims"
    )


def test_the_reader_knows_every_dtype_a_writer_writes() -> None:
    assert set(validate.ITEMSIZE) == set(DTYPES)
    for name, size in validate.ITEMSIZE.items():
        dt = getattr(torch, name)
        assert torch.empty(0, dtype=dt).element_size() == size, name


def test_a_manifest_holding_another_checkpoints_id(store: tuple[Path, list[str]]) -> None:
    root, ids = store
    _edit(root, ids[-1], lambda d: d.update(id=ids[0]))
    _restore_fails(root, ids[-1], IntegrityError, rf"holds checkpoint id '{ids[0]}', not '{ids[-1]}'")


def test_list_skips_a_hostile_manifest_and_names_it(store: tuple[Path, list[str]]) -> None:
    """Listing a store with a hostile manifest shows the others (and names the bad one) instead of failing on a
    TypeError somewhere in the summary."""
    root, ids = store
    _edit(root, ids[1], lambda d: d.update(step=[1]))
    ck = Checkpointer(root, read_only=True, preemption=None)
    assert [c.id for c in ck.list()] == [ids[0], ids[2]]
    ((bad, err),) = ck.unreadable
    assert bad == ids[1] and isinstance(err, IntegrityError)
