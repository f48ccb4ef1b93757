"""Chains of one and grouped small tensors (issue 16, items 6 and 8): every delta is against the last full base,
so a restore decodes two frames per chunk at most and the manifest does not grow with the number of saves since
the base; a new base comes once the last delta cost at least the average per checkpoint since the base; small
tensors are saved together in one group per dtype. Every restore is checked bit for bit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, IntegrityError
from gpu_notebook.checkpoint.format.tree import GROUP_PREFIX
from gpu_notebook.checkpoint.snapshot import BufferPool


def _ck(root: Path, **kw: object) -> Checkpointer:
    return Checkpointer(root, progress=False, preemption=None, **kw)  # type: ignore[arg-type]


def _chunks(doc: dict) -> list[dict]:
    shard = doc["shards"][0]
    parts = [*shard["leaves"].values(), *(shard.get("groups") or {}).values()]
    return [c for p in parts for c in p["chunks"]]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    flat = (a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(*flat)


def test_every_delta_is_against_the_last_base_and_restores_bit_exact(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300_000, generator=g).to(torch.bfloat16)
    saved = []
    with _ck(tmp_path, chunk_mb=0.1, full_every=100, max_restore_ratio=None) as ck:
        for step in range(6):
            w = (w.float() + 1e-3 * torch.randn(w.shape, generator=g)).to(torch.bfloat16)
            saved.append((ck.save({"w": w}, step, block=True).result(), w.clone()))
    base = saved[0][0]
    assert base is not None and base.is_base and not any(i.is_base for i, _ in saved[1:])  # type: ignore[union-attr]
    reader = _ck(tmp_path)
    base_objs = {c["obj"] for c in _chunks(reader.manifest(base.id))}
    for info, want in saved:
        assert info is not None
        chunks = _chunks(reader.manifest(info.id))
        assert (
            max(c["depth"] for c in chunks) <= 1
        )  # a delta's chunk: its frame on the base's frame, no deeper
        for c in chunks:
            if c["depth"]:
                assert c["base"]["obj"] in base_objs and "base" not in c["base"]
        assert reader.show(info.id).restore["max_depth"] <= 1
        assert _same_bits(reader.restore(info.id)["w"], want)


def test_the_manifest_does_not_grow_with_the_saves_since_the_base(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(1)
    state = {f"w{i}": torch.randn(40_000, generator=g) for i in range(6)}
    sizes = []
    with _ck(tmp_path, chunk_mb=0.02, full_every=100, max_restore_ratio=None) as ck:
        for step in range(10):
            for v in state.values():
                v.add_(torch.randn(v.shape, generator=g) * 1e-4)
            info = ck.save(state, step, block=True).result()
            assert info is not None
            sizes.append((tmp_path / "manifests" / f"{info.id}.json").stat().st_size)
        got = ck.restore()
    assert not any(c.is_base for c in ck.list()[1:])
    # every delta's manifest holds its chunks and their base's once, whatever its place after the base
    assert max(sizes[1:]) - min(sizes[1:]) < 0.01 * sizes[1], sizes
    assert all(_same_bits(got[k], v) for k, v in state.items())


def test_a_new_base_comes_once_a_delta_costs_the_average_since_the_base(tmp_path: Path) -> None:
    # each step changes another 5 % of the elements: a delta against the base grows with every save, so at some
    # point a fresh base lowers the average
    g = torch.Generator().manual_seed(2)
    w = torch.randn(200_000, generator=g)
    with _ck(tmp_path, full_every=100, max_restore_ratio=None) as ck:
        for step in range(12):
            w = w.clone()
            idx = torch.randperm(w.numel(), generator=g)[: w.numel() // 20]
            w[idx] += torch.randn(idx.numel(), generator=g)
            ck.save({"w": w}, step, block=True)
        infos = ck.list()
        got = ck.restore()
    kinds = ["B" if c.is_base else "d" for c in infos]
    assert "B" in kinds[1:], kinds  # a rollup before full_every
    first = kinds.index("B", 1)
    # the rule: the delta before the new base cost at least the average per checkpoint since the base
    since = infos[:first]
    assert since[-1].new_bytes * len(since) >= sum(c.new_bytes for c in since)
    # ... and no earlier delta did
    for k in range(2, first):
        assert infos[k - 1].new_bytes * k < sum(c.new_bytes for c in infos[:k])
    assert _same_bits(got["w"], w)


def test_fine_tuning_keeps_its_base(tmp_path: Path) -> None:
    # a frozen body and a small trained head: every delta costs the same, no rollup before full_every
    g = torch.Generator().manual_seed(3)
    body, head = torch.randn(500_000, generator=g), torch.randn(5_000, generator=g)
    with _ck(tmp_path, full_every=10) as ck:
        for step in range(9):
            head = head - 1e-4 * torch.randn(head.shape, generator=g)
            ck.save({"body": body, "head": head}, step, block=True)
        infos = ck.list()
    assert [c.is_base for c in infos] == [True] + [False] * 8
    assert all(c.new_bytes < 0.05 * infos[0].new_bytes for c in infos[1:])


def test_a_restored_delta_is_no_base_a_restored_base_is(tmp_path: Path) -> None:
    w = torch.randn(100_000)
    with _ck(tmp_path) as ck:
        ck.save({"w": w}, 0, block=True)
        ck.save({"w": w + 1e-3}, 1, block=True)
        base_id, delta_id = (c.id for c in ck.list())
    with _ck(tmp_path) as ck2:  # a new process resumes from the delta
        got = ck2.restore(delta_id)
        info = ck2.save({"w": got["w"] + 1e-3}, 2, block=True).result()
        assert info is not None and info.is_base  # deltas are against a base only: this save is one
    with _ck(tmp_path) as ck3:  # ... and from the base: the next save is a delta against it
        got = ck3.restore(base_id)
        info = ck3.save({"w": got["w"] + 2e-3}, 3, block=True).result()
        assert info is not None and not info.is_base
        assert _same_bits(ck3.restore(info.id)["w"], got["w"] + 2e-3)


def _small_state(g: torch.Generator) -> dict[str, torch.Tensor]:
    state = {f"f{i}": torch.randn(256, generator=g) for i in range(150)}
    state.update({f"i{i}": torch.randint(-(2**40), 2**40, (16,), generator=g) for i in range(30)})
    state.update({f"b{i}": torch.rand(64, generator=g) > 0.5 for i in range(20)})
    state.update({f"h{i}": torch.randn(3, 5, generator=g).to(torch.bfloat16) for i in range(12)})
    state["scalar"] = torch.tensor(3.5)
    state["few"] = torch.randn(7, generator=g).double()  # a dtype with fewer than 8 small tensors: on its own
    state["big"] = torch.randn(100_000, generator=g)
    return state


def test_small_tensors_are_saved_in_one_group_per_dtype(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(4)
    state = _small_state(g)
    with _ck(tmp_path) as ck:
        base = ck.save(state, 0, block=True).result()
        for k in ("f3", "i7", "b2", "h1"):
            state[k] = state[k] + 1 if state[k].dtype != torch.bool else ~state[k]
        delta = ck.save(state, 1, block=True).result()
    assert base is not None and delta is not None and not delta.is_base
    reader = _ck(tmp_path)
    shard = reader.manifest(base.id)["shards"][0]
    assert set(shard["groups"]) == {"float32", "int64", "bool", "bfloat16"}
    leaves = shard["leaves"]
    assert leaves["f0"]["group"] == "float32" and leaves["f0"]["chunks"] == []
    assert "group" not in leaves["big"] and "group" not in leaves["few"]
    assert sum(len(g["chunks"]) for g in shard["groups"].values()) == 4  # 213 tensors: 4 chunks
    for ckpt_id in (base.id, delta.id):
        got = reader.restore(ckpt_id)
        if ckpt_id == delta.id:
            assert all(_same_bits(got[k], v) for k, v in state.items())
    assert base.n_tensors == len(state)


def test_a_snapshot_holds_one_leaf_per_group_not_one_per_member() -> None:
    """The members of a group have no leaf of their own (10,000 small tensors: one leaf to hash, encode and list,
    not 10,001): the group leaf lists their names and shapes in the order of their bytes, and holds those bytes."""
    state: dict[str, torch.Tensor] = {f"t{i}": torch.full((3,), float(i)) for i in range(100)}
    state["big"] = torch.zeros(1 << 15)
    state["t7"] = state["t7"].reshape(1, 3)  # (a 2-D member: after the 1-D ones)
    snap = BufferPool().take(state, 0, False)
    assert sorted(lf.name for lf in snap.leaves) == sorted(["big", GROUP_PREFIX + "float32"])
    group = next(lf for lf in snap.leaves if lf.members is not None)
    order = [i for i in range(100) if i != 7] + [7]
    assert group.members == [(f"t{i}", [3] if i != 7 else [1, 3]) for i in order]
    assert np.array_equal(group.data.view(np.float32), np.repeat(np.array(order, dtype=np.float32), 3))
    assert snap.nbytes == sum(t.nbytes for t in state.values())


def test_a_group_lays_out_its_1d_then_0d_then_other_members_and_restores_each(tmp_path: Path) -> None:
    """Members of every rank interleaved in the state: the group holds the 1-D ones first (one torch.cat of them as
    they are), then the 0-D ones, then the rest, each kind in the state's order; the manifest lists them in that
    order, and a restore (and a delta over it) gives every member back bit-exact, with its shape."""
    g = torch.Generator().manual_seed(8)
    state: dict[str, torch.Tensor] = {}
    for i in range(12):
        state[f"m{i}"] = torch.randn(3, 4, generator=g)  # 2-D
        state[f"v{i}"] = torch.randn(5 + i, generator=g)  # 1-D
        state[f"s{i}"] = torch.tensor(float(i) + 0.25)  # 0-D
        state[f"c{i}"] = torch.randn(2, 2, 2, generator=g)[:, :, :1].contiguous()  # 3-D
    with _ck(tmp_path) as ck:
        base = ck.save(state, 0, block=True).result()
        state["v3"] += 1
        state["s5"] += 1
        state["m7"][0, 0] = 9.0
        delta = ck.save(state, 1, block=True).result()
    assert base is not None and delta is not None
    raw = json.loads((tmp_path / "manifests" / f"{base.id}.json").read_text())
    grp = raw["shards"][0]["groups"]["float32"]
    want = [f"v{i}" for i in range(12)] + [f"s{i}" for i in range(12)]
    want += [n for i in range(12) for n in (f"m{i}", f"c{i}")]
    assert grp["names"] == want
    assert grp["shapes"] == [list(state[n].shape) for n in want]
    reader = _ck(tmp_path)
    got = reader.restore(delta.id)
    assert set(got) == set(state) and all(_same_bits(got[k], v) for k, v in state.items())
    leaves = reader.manifest(base.id)["shards"][0]["leaves"]
    assert leaves["s0"]["goff"] == sum(state[f"v{i}"].nbytes for i in range(12))


def test_a_module_with_many_small_parameters_restores_into_itself(tmp_path: Path) -> None:
    torch.manual_seed(5)
    model = torch.nn.Sequential(*[torch.nn.LayerNorm(32) for _ in range(20)], torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 32)).sum().backward()
    opt.step()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    with _ck(tmp_path) as ck:
        ck.save({"model": model, "optim": opt}, 0, block=True)
        assert ck.manifest()["shards"][0]["groups"]
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
        ck.restore(into={"model": model, "optim": opt})
    assert all(_same_bits(model.state_dict()[k], v) for k, v in want.items())


def _saved_small_manifest(tmp_path: Path) -> tuple[Any, Path, dict[str, Any]]:
    """A checkpoint of ``_small_state``: its info, its manifest's path and the manifest as written."""
    with _ck(tmp_path) as ck:
        info = ck.save(_small_state(torch.Generator().manual_seed(6)), 0, block=True).result()
    assert info is not None
    path = tmp_path / "manifests" / f"{info.id}.json"
    return info, path, json.loads(path.read_text())


@pytest.mark.parametrize("form", ["columnar", "format 4"])
def test_a_member_outside_its_group_is_refused(tmp_path: Path, form: str) -> None:
    from gpu_notebook.checkpoint.format.validate import expand_groups

    info, path, doc = _saved_small_manifest(tmp_path)
    shard = doc["shards"][0]
    members = shard["groups"]["float32"]
    assert "f5" not in shard["leaves"] and "f5" in members["names"]  # format 5: listed in its group
    if form == "columnar":
        members["shapes"][members["names"].index("f5")] = [10**9]
    else:  # the members listed as leaves, as format 4 lists them
        expand_groups(shard, "test")
        doc["version"] = 4
        shard["leaves"]["f5"]["goff"] = 10**9
    path.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError, match="f5.*does not lie within its group 'float32'"):
        _ck(tmp_path).restore(info.id)


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda m: m["shapes"].pop(), "'names' and 'shapes' are not two lists of the same length"),
        (lambda m: m["names"].__setitem__(1, m["names"][0]), "not a new tensor name"),
        (lambda m: m["shapes"].__setitem__(0, [-1]), "has a shape that is not a list"),
        (lambda m: m["shapes"].__setitem__(0, []), "hold .* bytes, not the group's"),
    ],
    ids=["lengths", "duplicate", "negative", "short"],
)
def test_damaged_columnar_members_are_refused(tmp_path: Path, damage: Any, message: str) -> None:
    info, path, doc = _saved_small_manifest(tmp_path)
    damage(doc["shards"][0]["groups"]["float32"])
    path.write_text(json.dumps(doc))
    with pytest.raises(IntegrityError, match=message):
        _ck(tmp_path).restore(info.id)


def test_a_writer_never_makes_a_chain_a_reader_refuses(tmp_path: Path) -> None:
    """Readers refuse delta chains longer than MAX_CHAIN frames (hostile stores): a writer asked for longer ones
    is refused when it is made, not after it has written checkpoints nobody can restore."""
    from gpu_notebook.checkpoint.format.validate import MAX_CHAIN

    with pytest.raises(ValueError, match=f"full_every must be between 1 and {MAX_CHAIN}"):
        Checkpointer(tmp_path, full_every=MAX_CHAIN + 1, delta_against="previous", preemption=None)
    Checkpointer(tmp_path, full_every=MAX_CHAIN, preemption=None, current=False).close()
