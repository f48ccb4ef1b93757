"""Tests of the Checkpointer on the local folder store: bit-exact round trips, deltas, dedup, safety, faults."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gpu_notebook import checkpoint
from gpu_notebook.checkpoint import (
    Checkpointer,
    CheckpointSaveError,
    FormatVersionError,
    IntegrityError,
    LocalStore,
    NoCheckpointError,
    ObjectMissingError,
    ShapeMismatchError,
    UnsafeValueError,
)


def _model(seed: int = 0, width: int = 64) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.Tanh(), torch.nn.Linear(width, 8))


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(16, 32)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert _bits(a[k]) == _bits(b[k]), k
        elif isinstance(a[k], dict):
            _same_state(a[k], b[k])
        else:
            assert a[k] == b[k], k


def test_import_is_cheap() -> None:
    code = (
        "import sys; from gpu_notebook import checkpoint; checkpoint.Checkpointer; "
        "print(sorted(m for m in ('torch', 'boto3', 'zstandard', 'botocore') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_module_and_optimizer_restore_bit_exact(tmp_path: Path) -> None:
    m, m2 = _model(0), _model(1)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    opt2 = torch.optim.AdamW(m2.parameters(), lr=5e-2)
    _train(m, opt, 3)
    ckpt = Checkpointer(tmp_path)
    info = ckpt.save({"model": m, "optim": opt, "step": 3}).result()
    assert info is not None and info.step == 3
    _train(m2, opt2, 1)
    state = Checkpointer(tmp_path).restore(into={"model": m2, "optim": opt2})
    assert state["step"] == 3
    _same_state(m.state_dict(), m2.state_dict())
    _same_state(opt.state_dict()["state"], opt2.state_dict()["state"])
    assert opt2.param_groups[0]["lr"] == 1e-3
    # training continues identically
    torch.manual_seed(7)
    _train(m, opt, 2)
    torch.manual_seed(7)
    _train(m2, opt2, 2)
    _same_state(m.state_dict(), m2.state_dict())


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
     torch.uint8, torch.bool, torch.complex64],
    ids=str,
)  # fmt: skip
def test_every_dtype_bit_exact_through_deltas(tmp_path: Path, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    if dtype.is_floating_point or dtype.is_complex:
        t = (torch.randn(70_000, generator=g) * 0.02).to(dtype)
        t[:4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-39]).to(dtype)
    elif dtype == torch.bool:
        t = torch.rand(70_000, generator=g) > 0.5
    else:
        t = torch.randint(-100 if dtype != torch.uint8 else 0, 100, (70_000,), generator=g).to(dtype)
    ckpt = Checkpointer(tmp_path, chunk_mb=0.05, full_every=4)  # many chunks, deltas
    saved = []
    for step in range(5):
        if dtype.is_floating_point or dtype.is_complex:
            t = (t.to(torch.complex128 if dtype.is_complex else torch.float64) * 1.001).to(dtype)
        elif dtype == torch.bool:
            t = t.clone()
            t[step::5] = ~t[step::5]
        else:
            t = t.clone()
            t[step::3] += 1
        saved.append(t.clone())
        ckpt.save({"t": t, "scalar": t[:1].clone().reshape(()), "step": step})
    ckpt.wait()
    lst = ckpt.list()
    assert [c.step for c in lst] == list(range(5))
    assert not lst[1].is_base  # deltas were used
    for c in lst:
        got = ckpt.restore(c.id)
        assert got["t"].dtype == dtype
        assert _bits(got["t"]) == _bits(saved[c.step])
        assert got["scalar"].shape == ()


def test_plain_values_round_trip_safely(tmp_path: Path) -> None:
    state = {
        "step": 12,
        "loss": float("nan"),
        "best": float("-inf"),
        "name": "run/1",
        "flags": [True, False, None],
        "betas": (0.9, 0.999),
        "ids": {0: "a", 1: "b", (2, 3): "c"},
        "blob": b"\x00\xff",
        "$weird": 1,
        "dtype": torch.bfloat16,
        "size": torch.Size([2, 3]),
        "np": np.arange(5, dtype=np.int16),
        "npscalar": np.float32(1.5),
    }
    ckpt = Checkpointer(tmp_path)
    ckpt.save(state, block=True)
    got = ckpt.restore()
    assert got["step"] == 12 and np.isnan(got["loss"]) and got["best"] == float("-inf")
    assert got["betas"] == (0.9, 0.999) and isinstance(got["betas"], tuple)
    assert got["ids"] == {0: "a", 1: "b", (2, 3): "c"}
    assert got["blob"] == b"\x00\xff" and got["$weird"] == 1
    assert got["dtype"] is torch.bfloat16 and got["size"] == torch.Size([2, 3])
    assert got["np"].dtype == np.int16 and got["np"].tolist() == [0, 1, 2, 3, 4]
    assert got["npscalar"] == 1.5
    # the manifest is JSON, with no pickle anywhere
    man = ckpt.manifest()
    assert all(lf["kind"] != "pickle" for lf in man["shards"][0]["leaves"].values())


class _Opaque:
    def __init__(self) -> None:
        self.x = 1


def test_unsafe_values_refused_unless_pickle_allowed(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "a")
    with pytest.raises(UnsafeValueError, match="extra/obj"):
        ckpt.save({"extra": {"obj": _Opaque()}, "step": 1})
    ck2 = Checkpointer(tmp_path / "b", allow_pickle=True)
    ck2.save({"obj": _Opaque(), "step": 1}, block=True)
    reader = Checkpointer(tmp_path / "b")
    with pytest.raises(UnsafeValueError, match="can run code"):
        reader.restore()
    assert reader.restore(allow_pickle=True)["obj"].x == 1


def test_rng_state_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(3)
    np.random.seed(3)
    random.seed(3)
    ckpt = Checkpointer(tmp_path)
    ckpt.save({"rng": checkpoint.rng_state(), "step": 0}, block=True)
    expect = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(99)
    np.random.seed(99)
    random.seed(99)
    checkpoint.set_rng_state(ckpt.restore()["rng"])
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expect[0], got[0]) and (expect[1] == got[1]).all() and expect[2] == got[2]


def test_deltas_are_smaller_and_full_base_every_n(tmp_path: Path) -> None:
    torch.manual_seed(0)
    w = (torch.randn(300_000) * 0.02).to(torch.bfloat16)
    ckpt = Checkpointer(tmp_path, full_every=3, delta_against="previous")  # chains of deltas
    for step in range(7):
        w = (w.float() + 1e-5 * torch.randn_like(w.float())).to(torch.bfloat16)
        ckpt.save({"w": w, "step": step})
    ckpt.wait()
    lst = ckpt.list()
    assert [c.is_base for c in lst] == [True, False, False, True, False, False, True]
    for c in lst:
        if not c.is_base:
            assert c.new_bytes < 0.5 * [b for b in lst if b.is_base][0].new_bytes
    man = ckpt.manifest(lst[5].id)
    depths = [ch["depth"] for ch in man["shards"][0]["leaves"]["w"]["chunks"]]
    assert max(depths) == 2  # chains never longer than full_every - 1


def test_a_full_base_bounds_what_a_restore_reads(tmp_path: Path) -> None:
    # small changes everywhere (deltas are used, but save only part of the bytes, as in full fp32 training): with
    # max_restore_ratio=3 a base comes as soon as restoring the next delta would read more than 3 fulls;
    # without it, only full_every decides and the chain's bytes keep growing
    reads = {}
    kinds = {}
    for ratio in (3.0, None):
        g = torch.Generator().manual_seed(4)
        w = torch.randn(100_000, generator=g)
        ckpt = Checkpointer(
            tmp_path / str(ratio), full_every=100, max_restore_ratio=ratio, delta_against="previous"
        )
        for step in range(10):
            w = w + torch.randn(100_000, generator=g) * 1e-3 * w.abs()
            ckpt.save({"w": w}, step=step, block=True)
        kinds[ratio] = ["B" if c.is_base else "d" for c in ckpt.list()]
        reads[ratio] = [ckpt.show(c.id).restore["bytes"] for c in ckpt.list()]
        assert torch.equal(Checkpointer(tmp_path / str(ratio)).restore()["w"], w)
    full = reads[3.0][0]
    assert max(reads[None]) > 3 * full, reads  # the test means something: unbounded chains read more
    assert kinds[None] == ["B"] + ["d"] * 9
    assert "B" in kinds[3.0][1:] and "d" in kinds[3.0][1:], kinds
    assert max(reads[3.0]) <= 3 * full * 1.05, reads
    with pytest.raises(ValueError, match="max_restore_ratio"):
        Checkpointer(tmp_path / "x", max_restore_ratio=0.5)


def test_unchanged_tensors_are_never_written_twice(tmp_path: Path) -> None:
    frozen = torch.randn(500_000)
    head = torch.randn(1000)
    ckpt = Checkpointer(tmp_path)
    first = ckpt.save({"frozen": frozen, "head": head, "step": 0}).result()
    head += 1
    second = ckpt.save({"frozen": frozen, "head": head, "tied": frozen, "step": 1}).result()
    assert first is not None and second is not None
    assert second.new_bytes < 10_000 < first.new_bytes  # only the head (and a manifest) is new
    man = ckpt.manifest(second.id)
    lv = man["shards"][0]["leaves"]
    assert lv["frozen"]["chunks"] == lv["tied"]["chunks"]  # tied tensors share their objects
    got = ckpt.restore()
    assert torch.equal(got["tied"], frozen) and torch.equal(got["head"], head)


def test_small_tensors_are_packed(tmp_path: Path) -> None:
    state = {f"b{i}": torch.full((100,), float(i)) + torch.randn(100) for i in range(50)}
    ckpt = Checkpointer(tmp_path)
    info = ckpt.save(state, step=0).result()
    assert info is not None and info.extra["stats"]["new_objects"] == 1
    got = ckpt.restore()
    for k, v in state.items():
        assert torch.equal(got[k], v)


def test_pack_size_follows_the_previous_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a save closes its packs at a share of what the previous save of its kind wrote, so that most packs are
    # uploaded while the encoding goes on and the one uploaded after it is small
    from gpu_notebook.checkpoint.save import plan as ck_mod

    monkeypatch.setattr(ck_mod, "_PACK_MIN", 64 * 1024)
    g = torch.Generator().manual_seed(0)
    state = {
        f"w{i}": torch.randn(64 * 1024, generator=g) for i in range(8)
    }  # 8 x 256 KiB, random: incompressible
    ckpt = Checkpointer(tmp_path, chunk_mb=0.25, pack_kb=1024, threads=2, full_every=100)
    sizes = []
    for step in range(3):
        for v in state.values():
            v.copy_(torch.randn(v.shape, generator=g))  # every byte changes: each delta writes about 2 MiB
        info = ckpt.save(state, step=step).result()
        assert info is not None
        objs = {
            c["obj"] for lf in ckpt.manifest(info.id)["shards"][0]["leaves"].values() for c in lf["chunks"]
        }
        sizes.append(sorted((tmp_path / o).stat().st_size for o in objs))
    assert len(sizes[0]) == 1  # nothing to go by: one pack (of up to pack_max)
    # then packs of about a quarter (2 threads, 2 packs each) of what the previous save of the same kind wrote
    # (the first delta goes by the base)
    for prev, cur in ((sizes[0], sizes[1]), (sizes[1], sizes[2])):
        assert len(cur) >= 3, sizes
        assert max(cur) <= sum(prev) // 4 + 300 * 1024, sizes  # a pack closes at the first frame past it
    got = ckpt.restore()
    for k, v in state.items():
        assert torch.equal(got[k], v)


def test_restore_decodes_chains_as_their_frames_arrive(tmp_path: Path) -> None:
    # reads that complete in any order (the newest objects first here, the oldest last) and a restore with
    # more chains than threads: every chain waits for its next frame, nothing hangs, every byte is right
    g = torch.Generator().manual_seed(3)
    state = {f"w{i}": torch.randn(30_000 + 977 * i, generator=g) for i in range(12)}
    state.update({f"b{i}": torch.randn(i + 1, generator=g) for i in range(20)})
    state["tied"] = state["w0"]  # the same bytes twice: decoded once
    ckpt = Checkpointer(
        tmp_path, chunk_mb=0.05, pack_kb=64, pack_max_mb=0.25, full_every=10, delta_against="previous"
    )
    for step in range(4):
        for k, v in state.items():
            if k != "tied":
                v.add_(torch.randn(v.shape, generator=g) * 1e-4)
        ckpt.save(state, step=step)
    ckpt.wait()

    class SlowOldReads(LocalStore):
        """Reads of objects written by older saves take longer: they arrive last."""

        def get_range(self, key: str, offset: int, length: int) -> bytes | memoryview:
            if key.startswith("objects/"):
                age = time.time() - (self.root / key).stat().st_mtime
                time.sleep(min(0.2, 0.02 + age / 10))  # the scenario: a store's latency, not a wait
            return super().get_range(key, offset, length)

    for threads in (1, 3):
        reader = Checkpointer(SlowOldReads(tmp_path), threads=threads)
        got = reader.restore()
        assert reader.show().restore["max_depth"] == 3
        for k, v in state.items():
            assert torch.equal(got[k].view(torch.int32), v.view(torch.int32)), (threads, k)
        assert got["tied"].data_ptr() != got["w0"].data_ptr()


def test_local_store_maps_big_ranges(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    blob = bytes(random.Random(0).getrandbits(8) for _ in range(1 << 20))
    store.put("objects/a", blob)
    big = store.get_range("objects/a", 1000, 600_000)
    assert isinstance(big, memoryview) and big.readonly and bytes(big) == blob[1000:601_000]
    small = store.get_range("objects/a", 10, 100)
    assert small == blob[10:110]
    with pytest.raises(ObjectMissingError):
        store.get_range("objects/nope", 0, 600_000)
    del big
    store.delete("objects/a")  # a published object is never changed in place; deleting it is fine
    assert not store.exists("objects/a")


def test_many_tiny_tensors_with_big_ones_restore_bit_exact(tmp_path: Path) -> None:
    # tiny chunks are encoded and decoded as one batch, alongside the big ones
    g = torch.Generator().manual_seed(2)
    state = {f"t{i}": torch.randn(i % 7 + 1, generator=g) for i in range(300)}
    state.update({f"big{i}": torch.randn(200_000, generator=g) for i in range(3)})
    ckpt = Checkpointer(tmp_path, threads=2, full_every=3)
    for step in range(4):
        for v in state.values():
            v.add_(torch.randn(v.shape, generator=g) * 1e-3)
        ckpt.save(state, step=step)
    ckpt.wait()
    got = Checkpointer(tmp_path, threads=2).restore()
    for k, v in state.items():
        assert torch.equal(got[k].view(torch.int32), v.view(torch.int32)), k


def test_restore_by_step_and_id_and_prefix(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    for step in (10, 20, 30):
        ckpt.save({"x": torch.tensor([float(step)]), "step": step})
    ckpt.wait()
    ids = [c.id for c in ckpt.list()]
    assert ckpt.restore()["step"] == 30
    assert ckpt.restore(step=20)["x"].item() == 20.0
    assert ckpt.restore(ids[0])["step"] == 10
    assert ckpt.restore(ids[0][:14])["step"] == 10  # a unique prefix
    with pytest.raises(NoCheckpointError, match="step 25"):
        ckpt.restore(step=25)
    assert Checkpointer(tmp_path / "empty").restore(missing_ok=True) is None
    with pytest.raises(NoCheckpointError):
        Checkpointer(tmp_path / "empty").restore()


def _flip_a_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_finding_the_latest_reads_only_the_newest_manifests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a resume must not get slower as checkpoints pile up: ids sort by commit order, so only the newest
    # manifest is read (two writers at that step: the later commit wins, as in list())
    ckpt = Checkpointer(tmp_path)
    for step in range(12):
        ckpt.save({"x": torch.tensor([float(step)]), "step": step})
    ckpt.wait()
    other = Checkpointer(tmp_path)
    other.save({"x": torch.tensor([99.0]), "step": 11}, step=11, block=True)
    reads: list[str] = []
    real = LocalStore.get

    def counting(self: LocalStore, key: str) -> bytes:
        reads.append(key)
        return real(self, key)

    monkeypatch.setattr(LocalStore, "get", counting)
    reader = Checkpointer(tmp_path)
    reads.clear()
    assert reader.restore()["x"].item() == 99.0
    assert len([k for k in reads if k.startswith("manifests/")]) == 1, reads
    assert reader.latest().id == reader.list()[-1].id  # type: ignore[union-attr]
    reads.clear()
    assert reader.restore(step=3)["x"].item() == 3.0
    assert len([k for k in reads if k.startswith("manifests/")]) == 1, reads


def test_corrupted_and_missing_chunks_are_named(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save({"big": torch.randn(200_000), "small": torch.randn(10), "step": 0}, block=True)
    man = ckpt.manifest()
    obj = man["shards"][0]["leaves"]["big"]["chunks"][0]["obj"]
    path = tmp_path / obj
    _flip_a_bit(path)
    with pytest.raises(IntegrityError, match=r"tensor 'big' chunk 0 \(object objects/"):
        ckpt.restore()
    path.unlink()
    # both tensors are in that one pack: the error names whichever was decoded first
    with pytest.raises(ObjectMissingError, match=r"needed by tensor '(big|small)' chunk 0"):
        ckpt.restore()


def test_fallback_restores_the_newest_intact_checkpoint(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, full_every=2)
    for step in range(4):  # base, delta, base, delta
        ckpt.save(
            {"w": torch.full((50_000,), float(step)) + torch.arange(50_000.0), "step": step}, block=True
        )
    ids = [c.id for c in ckpt.list()]

    def objects(cid: str) -> set[str]:
        return {c["obj"] for c in ckpt.manifest(cid)["shards"][0]["leaves"]["w"]["chunks"]}

    # the latest delta loses its own object: without fallback that is an error naming it
    (tmp_path / objects(ids[3]).difference(objects(ids[2])).pop()).unlink()
    with pytest.raises(ObjectMissingError, match="tensor 'w'"):
        Checkpointer(tmp_path).restore()
    reader = Checkpointer(tmp_path)
    with pytest.warns(RuntimeWarning, match=rf"checkpoint {ids[3]} \(step 3\) cannot be restored .*missing"):
        got = reader.restore(fallback=True)
    assert got["step"] == 2 and torch.equal(got["w"], torch.full((50_000,), 2.0) + torch.arange(50_000.0))
    assert reader.last_info is not None and reader.last_info.id == ids[2]
    # an explicit id or step is never swapped for another checkpoint
    with pytest.raises(ObjectMissingError):
        Checkpointer(tmp_path).restore(ids[3], fallback=True)
    # the base under checkpoint 2 is corrupted too: back to the first chain
    _flip_a_bit(tmp_path / objects(ids[2]).pop())
    with pytest.warns(RuntimeWarning) as caught:
        got = Checkpointer(tmp_path).restore(fallback=True)
    assert got["step"] == 1
    assert [ids[3] in str(w.message) for w in caught] == [True, False]
    # nothing intact: the latest checkpoint's error, with a note for each older one tried
    for cid in ids[:2]:
        for o in objects(cid):
            if (tmp_path / o).exists():
                (tmp_path / o).unlink()
    with pytest.warns(RuntimeWarning), pytest.raises(ObjectMissingError) as exc:
        Checkpointer(tmp_path).restore(fallback=True)
    notes = exc.value.__notes__
    assert f"of checkpoint {ids[3]}" in str(exc.value)
    assert [n.split()[2] for n in notes] == [ids[2], ids[1], ids[0]], notes


def test_corrupted_base_of_a_delta_chain_is_named(tmp_path: Path) -> None:
    # only the end of a delta chain is hashed on restore; a corrupted base still fails, naming the base's object
    ckpt = Checkpointer(tmp_path)
    a = torch.randn(200_000)
    ckpt.save({"big": a, "step": 0}, block=True)
    base_obj = ckpt.manifest()["shards"][0]["leaves"]["big"]["chunks"][0]["obj"]
    ckpt.save({"big": a + 1e-3 * torch.randn(200_000), "step": 1}, block=True)
    entry = ckpt.manifest()["shards"][0]["leaves"]["big"]["chunks"][0]
    assert entry["base"]["obj"] == base_obj and entry["obj"] != base_obj
    path = tmp_path / base_obj
    _flip_a_bit(path)
    with pytest.raises(IntegrityError, match=rf"tensor 'big' chunk 0 \(object {base_obj}\)"):
        ckpt.restore()


def test_encoding_choices_are_reused_across_saves_and_stay_bit_exact(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, full_every=4)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(6):
        _train(model, opt, 2)
        ckpt.save({"model": model, "optim": opt, "step": step}, block=True)
    assert ckpt._lineage.hints  # choices made by the first delta were remembered
    got = ckpt.restore()
    for k, v in model.state_dict().items():
        assert torch.equal(got["model"][k].view(torch.uint8), v.view(torch.uint8)), k
    for pid, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            assert torch.equal(got["optim"]["state"][pid][k], v), (pid, k)


def test_newer_format_version_is_refused(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save({"x": torch.ones(3), "step": 0}, block=True)
    key = next((tmp_path / "manifests").iterdir())
    doc = json.loads(key.read_text())
    doc["version"] = 99
    key.write_text(json.dumps(doc))
    with pytest.raises(FormatVersionError, match="version 99"):
        ckpt.restore()
    (tmp_path / "FORMAT").write_text(json.dumps({"format": "gpu_notebook.checkpoint", "version": 7}))
    with pytest.raises(FormatVersionError, match="version 7"):
        Checkpointer(tmp_path)


def test_manifest_records_the_code_that_wrote_it(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    for step in range(2):  # the record is computed once, then reused: both saves carry all of it
        ckpt.save({"x": torch.ones(3), "step": step}, block=True)
        w = ckpt.manifest()["writer"]
        assert w["lib"] == "gpu_notebook.checkpoint" and w["pid"] == os.getpid()
        assert w["torch"] == torch.__version__ and w["python"] == sys.version.split()[0]
        assert "version" in w and w["program"]


def test_list_skips_an_unreadable_manifest_and_latest_skips_to_an_older_step(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, threads=4)
    for step in range(6):
        ckpt.save({"x": torch.tensor([float(step)]), "step": step})
    ckpt.wait()
    ids = [c.id for c in ckpt.list()]
    (tmp_path / "manifests" / f"{ids[5]}.json").write_text("{not json")  # the newest one is garbage
    (tmp_path / "manifests" / f"{ids[2]}.json").write_text("[]")
    reader = Checkpointer(tmp_path, threads=4)
    lst = reader.list()  # read several at a time; same order, the two unreadable ones left out with a warning
    assert [c.id for c in lst] == [ids[0], ids[1], ids[3], ids[4]]
    assert sorted(cid for cid, _ in reader.unreadable) == [ids[2], ids[5]]
    assert reader.restore()["step"] == 4  # the newest readable one
    assert reader.latest().id == ids[4]  # type: ignore[union-attr]


def test_shape_mismatch_names_tensors(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    m = _model(0, width=64)
    ckpt.save({"model": m, "step": 0}, block=True)
    other = _model(0, width=48)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ShapeMismatchError) as ei:
        ckpt.restore(into={"model": other})
    msg = str(ei.value)
    assert "model/0.weight" in msg and "[64, 32]" in msg and "[48, 32]" in msg and "model/2.weight" in msg
    _same_state(before, other.state_dict())  # nothing was half-loaded


def test_restore_into_plain_dict_of_tensors(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    src = {"a": torch.randn(5), "b": {"c": torch.arange(4)}}
    ckpt.save({"state": src, "step": 1}, block=True)
    dst = {"a": torch.zeros(5), "b": {"c": torch.zeros(4, dtype=torch.int64)}}
    ckpt.restore(into={"state": dst})
    assert torch.equal(dst["a"], src["a"]) and torch.equal(dst["b"]["c"], src["b"]["c"])
    with pytest.raises(ShapeMismatchError, match="state/a"):
        ckpt.restore(into={"state": {"a": torch.zeros(6)}})


def test_policy_every_steps_and_minutes(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path / "s", every_steps=5)
    saved = [s for s in range(12) if ckpt.maybe_save({"x": torch.tensor([s]), "step": s}, s) is not None]
    assert saved == [0, 5, 10]
    ck2 = Checkpointer(tmp_path / "m", every_minutes=60)
    assert ck2.maybe_save({"step": 0}, 0) is None  # nothing due yet: the clock starts with the Checkpointer
    assert ck2.maybe_save({"step": 1}, 1, force=True) is not None
    ck2._last_save_time = time.time() - 3601
    assert ck2.maybe_save({"step": 2}, 2) is not None
    ckpt.wait()
    ck2.wait()
    assert [c.step for c in ck2.list()] == [1, 2]


class _SlowStore(LocalStore):
    def __init__(self, root: Path, delay: float) -> None:
        super().__init__(root)
        self.delay = delay
        self.release = threading.Event()

    def put(self, key, data, create_only=True):  # type: ignore[no-untyped-def]
        if key.startswith("manifests/"):
            self.release.wait(self.delay)
        return super().put(key, data, create_only)


def test_one_save_in_flight_wait_or_skip(tmp_path: Path) -> None:
    store = _SlowStore(tmp_path / "skip", delay=30)
    ckpt = Checkpointer(store, on_busy="skip")
    h1 = ckpt.save({"x": torch.ones(3), "step": 1})
    h2 = ckpt.save({"x": torch.ones(3), "step": 2})
    assert h2.skipped and not h1.done()
    store.release.set()
    assert h1.result(30) is not None
    assert [c.step for c in ckpt.list()] == [1]

    store = _SlowStore(tmp_path / "wait", delay=0.3)
    ckpt = Checkpointer(store, on_busy="wait")
    h1 = ckpt.save({"x": torch.ones(3), "step": 1})
    h2 = ckpt.save({"x": torch.ones(3) * 2, "step": 2})
    assert h1.done()  # the second save waited for the first
    ckpt.wait()
    assert h2.done() and [c.step for c in ckpt.list()] == [1, 2]


class _FlakyStore(LocalStore):
    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures
        self.calls = 0

    def put(self, key, data, create_only=True):  # type: ignore[no-untyped-def]
        if key.startswith("objects/"):
            self.calls += 1
            if self.failures > 0:
                self.failures -= 1
                raise OSError("injected write failure")
        return super().put(key, data, create_only)


def test_failed_upload_is_retried(tmp_path: Path) -> None:
    store = _FlakyStore(tmp_path, failures=2)
    ckpt = Checkpointer(store, retries=3, retry_backoff_s=0.01)
    info = ckpt.save({"x": torch.randn(1000), "step": 1}).result()
    assert info is not None and store.calls >= 3
    assert ckpt.restore()["step"] == 1


def test_failed_upload_is_reported_never_dropped(tmp_path: Path) -> None:
    store = _FlakyStore(tmp_path, failures=10**6)
    ckpt = Checkpointer(store, retries=1, retry_backoff_s=0.01)
    with pytest.warns(RuntimeWarning, match="NOT saved"):
        h = ckpt.save({"x": torch.randn(1000), "step": 5})
        with pytest.raises(CheckpointSaveError, match="injected write failure"):
            ckpt.wait()
    assert isinstance(h.exception(), CheckpointSaveError)
    assert ckpt.failures and "step 5" in ckpt.failures[0][1]
    assert ckpt.list() == []


def test_gc_keeps_delta_chain_bases(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, full_every=4)
    w = torch.randn(100_000)
    for step in range(6):  # bases at 0 and 4
        w = w + 1e-3
        ckpt.save({"w": w, "step": step})
    ckpt.wait()
    before = {c.step: ckpt.restore(c.id)["w"] for c in ckpt.list()}
    res = ckpt.gc(keep=2, grace_s=0)  # keeps steps 4 and 5; 5 is a delta on 4
    assert [c.step for c in ckpt.list()] == [4, 5]
    assert len(res.manifests) == 4 and res.objects
    for c in ckpt.list():
        assert torch.equal(ckpt.restore(c.id)["w"], before[c.step])
    res = ckpt.gc(keep=1, grace_s=0)  # keep step 5 only: its base (step 4's chunks) must survive
    assert [c.step for c in ckpt.list()] == [5]
    assert torch.equal(ckpt.restore()["w"], before[5])
    # nothing unreferenced is left
    needed = {e["obj"] for ch in ckpt.manifest()["shards"][0]["leaves"]["w"]["chunks"] for e in _chain(ch)}
    assert {o.key for o in ckpt.store.list("objects/")} == needed


def _chain(e):  # type: ignore[no-untyped-def]
    while e:
        yield e
        e = e.get("base")


def test_gc_grace_window_protects_new_objects(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save({"w": torch.randn(1000), "step": 0}, block=True)
    ckpt.store.put("objects/ff/ff" + "0" * 62, b"in-flight upload")
    held = ckpt.gc(keep=1, grace_s=3600)
    assert held.objects == [] and (held.young, held.young_bytes) == (1, len(b"in-flight upload"))
    # the report says why nothing was freed, and how to free it
    assert "1 unreferenced object(s) (0.0 MB) younger than the grace period (3600 s) kept" in repr(held)
    assert "--grace 0" in repr(held) and "younger than the grace period" in held.dry_run_text()
    freed = ckpt.gc(keep=1, grace_s=0)
    assert freed.objects == ["objects/ff/ff" + "0" * 62] and freed.young == 0
    assert "younger" not in repr(freed)


_KILL_CHILD = textwrap.dedent(
    """
    import os, sys, time, torch
    from gpu_notebook.checkpoint import Checkpointer, LocalStore

    class Store(LocalStore):
        puts = 0
        def put(self, key, data, create_only=True):
            r = super().put(key, data, create_only)
            if key.startswith("objects/") and ARMED:
                Store.puts += 1
                if Store.puts == 2:
                    print("MIDDLE", flush=True)
                    time.sleep(60)
            return r

    ARMED = False
    ck = Checkpointer(Store(sys.argv[1]), chunk_mb=0.25, pack_kb=1, threads=1)
    torch.manual_seed(0)
    w = torch.randn(400_000)
    ck.save({"w": w, "step": 1}, block=True)
    print("COMMITTED", flush=True)
    ARMED = True
    ck.save({"w": torch.randn(400_000), "step": 2}, block=True)
    print("SHOULD NOT GET HERE", flush=True)
    """
)


def test_killed_in_the_middle_of_a_save_leaves_previous_checkpoints_loadable(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILL_CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.strip() == "MIDDLE":
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc.stdout.close()
    assert lines == ["COMMITTED", "MIDDLE"]
    ckpt = Checkpointer(tmp_path)
    assert [c.step for c in ckpt.list()] == [1]  # the half-written save is invisible
    torch.manual_seed(0)
    assert torch.equal(ckpt.restore()["w"], torch.randn(400_000))
    # the killed writer's lease protects what it wrote until it expires (gc cannot tell a dead writer from a
    # slow one); then its objects are orphans
    held = ckpt.gc(keep=1, grace_s=0)
    assert held.leases == 1 and not held.objects
    for lease in (tmp_path / "leases").iterdir():
        doc = json.loads(lease.read_text())
        lease.write_text(json.dumps({**doc, "expires_at": doc["expires_at"] - 1e6}))
    orphans = ckpt.gc(keep=1, grace_s=0).objects
    assert orphans  # the killed save's objects were there, unreferenced
    assert not list((tmp_path / "leases").iterdir())  # and the dead lease is gone
    torch.manual_seed(0)
    assert torch.equal(ckpt.restore()["w"], torch.randn(400_000))


def test_partial_manifest_temp_file_is_ignored(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path)
    ckpt.save({"x": torch.ones(2), "step": 1}, block=True)
    (tmp_path / "manifests" / ".tmp-abc").write_bytes(b'{"format": "gpu_notebook.checkpoint", "ver')
    assert [c.step for c in ckpt.list()] == [1]
    assert ckpt.restore()["step"] == 1


_WRITER = textwrap.dedent(
    """
    import sys, time, torch
    from gpu_notebook.checkpoint import Checkpointer
    root, name, seed, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    while not __import__("os").path.exists(root + "/GO"):  # start both writers together
        time.sleep(0.01)
    ck = Checkpointer(root, full_every=3, chunk_mb=0.1)
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(100_000, generator=g)
    shared = torch.ones(50_000)  # identical bytes in both writers: the same objects
    handles = []
    for step in range(6):
        w = w + 1e-3 * torch.randn(100_000, generator=g)
        handles.append((ck.save({"w": w, "shared": shared, "writer": name, "step": step}), w.clone()))
    ck.wait()
    saved = {h.result().id: w for h, w in handles}  # (a commit's id is its place, taken at commit)
    torch.save(saved, out)
    """
)


def test_two_writers_on_one_prefix(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(store), name, str(seed), str(tmp_path / f"{name}.pt")]
        )
        for name, seed in (("a", 1), ("b", 2))
    ]
    (store / "GO").write_text("")
    for p in procs:
        assert p.wait(120) == 0
    reader = Checkpointer(store)
    lst = reader.list()
    assert len(lst) == 12 and len({c.id for c in lst}) == 12
    for name in ("a", "b"):
        saved = torch.load(tmp_path / f"{name}.pt")
        assert len(saved) == 6
        for ckpt_id, w in saved.items():
            got = reader.restore(ckpt_id)
            assert got["writer"] == name  # each manifest is consistent: its own writer's state only
            assert torch.equal(got["w"], w)
            assert torch.equal(got["shared"], torch.ones(50_000))


def test_save_continues_delta_chain_after_restore(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path, full_every=5)
    w = torch.randn(200_000)
    ck.save({"w": w, "step": 0}, block=True)
    ck2 = Checkpointer(tmp_path, full_every=5)  # a new process after preemption
    got = ck2.restore()
    info = ck2.save({"w": got["w"] + 1e-4, "step": 1}).result()
    assert info is not None and not info.is_base and info.parent == ck.list()[0].id
    assert torch.equal(ck2.restore()["w"], got["w"] + 1e-4)


def test_list_show_diff_displays(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path)
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ck.save({"model": m, "step": 0, "lr": 0.1}, block=True)
    first_objects = sum(f.stat().st_size for f in (tmp_path / "objects").rglob("*") if f.is_file())
    _train(m, opt, 1)
    ck.save({"model": m, "step": 1, "lr": 0.05}, block=True)
    lst = ck.list()
    assert "step" in repr(lst) and "<table>" in lst._repr_html_()
    shown = ck.show(lst[1].id)
    assert "model/0.weight" in shown.tensors and "model/0.weight" in repr(shown)
    # what a restore reads: the delta and its base, every frame once
    base, delta = ck.show(lst[0].id), shown
    assert base.restore["max_depth"] == 0 and delta.restore["max_depth"] == 1
    assert base.restore["bytes"] == first_objects  # the first checkpoint needs every object it wrote
    new = delta.stats["new_bytes"]
    assert new < delta.restore["bytes"] <= base.restore["bytes"] + new
    assert "a restore reads" in repr(delta) and "deep" in repr(delta)
    # ... which list() reports per checkpoint too (its own column)
    assert [c.restore_bytes for c in lst] == [base.restore["bytes"], delta.restore["bytes"]]
    assert "restore reads" in repr(lst) and "<th>restore reads</th>" in lst._repr_html_()
    d = ck.diff(lst[0].id, lst[1].id)
    assert "model/0.weight" in d.changed and d.values["lr"] == (0.1, 0.05) and d.values["step"] == (0, 1)
    assert "model/0.weight" in repr(d)


def test_progress_reports_bytes(tmp_path: Path) -> None:
    seen: list[tuple[str, int, int]] = []
    ck = Checkpointer(
        tmp_path, progress=lambda label, done, total, elapsed: seen.append((label, done, total))
    )
    w = torch.randn(300_000)
    ck.save({"w": w, "step": 0}, block=True)
    ck.restore()
    saves = [s for s in seen if s[0].startswith("checkpoint ")]
    restores = [s for s in seen if s[0].startswith("restore ")]
    assert saves and restores
    assert saves[-1][1] == saves[-1][2] == 1_200_000 and restores[-1][1] == restores[-1][2] == 1_200_000


def test_progress_line_text() -> None:
    from gpu_notebook.checkpoint._progress import describe

    assert describe("restore x", 50_000_000, 100_000_000, 2.0) == (
        "restore x: 50.0 MB / 100.0 MB (50%) at 25.0 MB/s, 2.0 s"
    )


def test_an_optimizer_that_does_not_match_is_refused_before_anything_is_loaded(tmp_path: Path) -> None:
    """The optimizer is checked with the model: other parameter groups (which torch refuses only after the model
    was loaded) or state for parameters of other shapes (which torch loads, and the next step fails on) raise
    ShapeMismatchError naming them, and nothing is modified."""

    def opt_of(m: torch.nn.Module, **kw: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            [{"params": m[0].parameters()}, {"params": m[2].parameters(), "lr": 1e-2}], **kw
        )

    m = _model(0)
    opt = opt_of(m)
    _train(m, opt, 2)
    ckpt = Checkpointer(tmp_path)
    ckpt.save({"model": m, "optim": opt, "step": 2}, block=True)
    # the same model; its optimizer has one parameter group
    m2 = _model(1)
    opt2 = torch.optim.AdamW(m2.parameters())
    before = {k: v.clone() for k, v in m2.state_dict().items()}
    with pytest.raises(ShapeMismatchError) as ei:
        ckpt.restore(into={"model": m2, "optim": opt2})
    assert "optim/param_groups" in str(ei.value) and "2 group(s)" in str(ei.value)
    _same_state(before, m2.state_dict())  # the model was not loaded either
    assert not opt2.state
    # an optimizer (alone) of a model with other shapes, with state
    m3 = _model(0, width=48)
    opt3 = opt_of(m3)
    _train(m3, opt3, 1)
    with pytest.raises(ShapeMismatchError) as ei:
        ckpt.restore(into={"optim": opt3})
    msg = str(ei.value)
    assert "optim/state/0/exp_avg:" in msg and "[64, 32]" in msg and "[48, 32]" in msg
    # ... and a fresh one (no state yet): AdamW's moments have their parameter's shape
    m4 = _model(0, width=48)
    opt4 = opt_of(m4)
    with pytest.raises(ShapeMismatchError, match="optim/state/0/exp_avg_sq"):
        ckpt.restore(into={"optim": opt4})
    assert not opt4.state
    # what matches still loads, bit-exact
    m5 = _model(3)
    opt5 = opt_of(m5, lr=0.5)
    ckpt.restore(into={"model": m5, "optim": opt5})
    _same_state(opt.state_dict()["state"], opt5.state_dict()["state"])
    assert opt5.param_groups[1]["lr"] == 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_rng_state_restored_onto_a_gpu_sets_again(tmp_path: Path) -> None:
    """restore(map_location="cuda") moves the saved RNG states to the GPU too; torch takes them only as CPU byte
    tensors ("RNG state must be a torch.ByteTensor"), so set_rng_state brings them back."""
    torch.cuda.init()
    torch.manual_seed(5)
    ckpt = Checkpointer(tmp_path)
    ckpt.save({"rng": checkpoint.rng_state(), "step": 0}, block=True)
    expect = (torch.rand(3), torch.rand(3, device="cuda"))
    torch.manual_seed(99)
    state = ckpt.restore(map_location="cuda")
    assert state["rng"]["torch"].is_cuda
    checkpoint.set_rng_state(state["rng"])
    got = (torch.rand(3), torch.rand(3, device="cuda"))
    assert torch.equal(expect[0], got[0]) and torch.equal(expect[1], got[1])


def test_cuda_rng_states_of_more_gpus_than_this_process_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint saved on 4 GPUs resumed on 2: torch.cuda.set_rng_state_all raises for a device that does not
    exist, so the first 2 states are set and a warning says the others were dropped. (torch.cuda is faked: no
    GPU here; the fake keeps torch's contract of one state per device index.)"""
    got: list = []

    def set_all(states: list) -> None:
        for i, _ in enumerate(states):
            if i >= 2:
                raise RuntimeError(f"CUDA error: invalid device ordinal {i}")
        got.extend(states)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", set_all)
    state = checkpoint.rng_state()
    state["cuda"] = [torch.full((16,), i, dtype=torch.uint8) for i in range(4)]
    with pytest.warns(RuntimeWarning, match="RNG states of 4 GPUs and this process sees 2"):
        checkpoint.set_rng_state(state)
    assert [int(t[0]) for t in got] == [0, 1]
