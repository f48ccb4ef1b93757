"""Commit order: the latest checkpoint is the newest commit (not the highest step), each commit records the one
it continues, ``list`` shows which are on the live branch, and ``gc`` keeps the live branch. Old (format 3)
ids in the same store sort before every new one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, LocalStore

pytestmark = pytest.mark.timeout(120)

GOLDEN = Path(__file__).parent / "golden" / "v3" / "blake3"


def _ck(store: Any, **kw: Any) -> Checkpointer:
    return Checkpointer(store, preemption=None, current=False, progress=False, **kw)


def _w(step: int, branch: float = 0.0) -> torch.Tensor:
    return torch.arange(5000, dtype=torch.float32) * 1e-3 + step + branch


def _rewound(root: Path) -> tuple[list[str], str]:
    """Steps 1-5 by one writer; then a new one restores step 3 and saves step 4 (training went on from 3)."""
    a = _ck(root)
    ids = [
        a.save({"w": _w(s), "frozen": torch.ones(3000), "step": s}, block=True).result().id
        for s in range(1, 6)
    ]
    a.close()
    b = _ck(root)
    got = b.restore(step=3)
    assert got["step"] == 3 and torch.equal(got["w"], _w(3))
    b4 = b.save({"w": _w(4, branch=0.5), "frozen": got["frozen"], "step": 4}, block=True).result()
    b.close()
    return ids, b4.id


def test_latest_is_the_newest_commit_not_the_highest_step(tmp_path: Path) -> None:
    ids, b4 = _rewound(tmp_path)
    ck = _ck(tmp_path)
    got = ck.restore()
    assert got["step"] == 4 and torch.equal(got["w"], _w(4, branch=0.5))  # not the abandoned step 5
    assert ck.latest().id == b4 and ck.last_info.id == b4
    assert ck.manifest(b4)["parent"] == ids[2]  # it continues the restored step 3
    lst = ck.list()
    assert [c.id for c in lst] == [*ids, b4]  # commit order
    assert {c.id: c.branch for c in lst} == {
        ids[0]: "live",
        ids[1]: "live",
        ids[2]: "live",
        ids[3]: "abandoned",
        ids[4]: "abandoned",
        b4: "live",
    }
    assert "abandoned" in repr(lst) and "branch" in repr(lst)
    # a step names the newest commit at it on the live branch; the abandoned one is still there by step
    assert torch.equal(ck.restore(step=4)["w"], _w(4, branch=0.5))
    assert torch.equal(ck.restore(step=5)["w"], _w(5))
    assert torch.equal(ck.restore(ids[3])["w"], _w(4))


def test_a_fallback_goes_back_along_the_live_branch(tmp_path: Path) -> None:
    ids, b4 = _rewound(tmp_path)
    ck = _ck(tmp_path)
    for o in {e["obj"] for lf in ck.manifest(b4)["shards"][0]["leaves"].values() for e in lf["chunks"]}:
        (tmp_path / o).unlink()  # the newest commit's own objects are lost (its base's are not)
    with pytest.warns(RuntimeWarning, match=f"restoring the one before it, {ids[2]}"):
        got = ck.restore(fallback=True)
    assert got["step"] == 3 and torch.equal(got["w"], _w(3))  # what it continued, not the abandoned step 5


def test_gc_keeps_the_live_branch_and_deletes_the_abandoned_one(tmp_path: Path) -> None:
    ids, b4 = _rewound(tmp_path)
    ck = _ck(tmp_path)
    dry = ck.gc(keep=2, grace_s=0, dry_run=True)
    res = ck.gc(keep=2, grace_s=0)
    assert res.kept == [ids[2], b4] == dry.kept
    assert sorted(res.manifests) == sorted([ids[0], ids[1], ids[3], ids[4]])
    assert [c.id for c in ck.list()] == [ids[2], b4]
    assert torch.equal(ck.restore()["w"], _w(4, branch=0.5))
    assert torch.equal(ck.restore(ids[2])["w"], _w(3))


def test_gc_can_keep_abandoned_branches(tmp_path: Path) -> None:
    ids, b4 = _rewound(tmp_path)
    ck = _ck(tmp_path)
    res = ck.gc(keep=1, grace_s=0, keep_abandoned=True)
    assert sorted(res.manifests) == sorted(ids[:3])  # the live branch's older commits only
    assert [c.id for c in ck.list()] == [ids[3], ids[4], b4]
    assert torch.equal(ck.restore(ids[4])["w"], _w(5)) and torch.equal(ck.restore()["w"], _w(4, branch=0.5))


def test_a_save_without_a_step_comes_after_the_newest_commit(tmp_path: Path) -> None:
    _ids, _b4 = _rewound(tmp_path)
    ck = _ck(tmp_path)
    assert ck.save({"w": _w(9)}, block=True).result().step == 5  # after B's step 4, the newest commit
    ck2 = _ck(tmp_path)
    ck2.restore(step=2)
    assert ck2.save({"w": _w(9)}, block=True).result().step == 3  # after what it continues


def test_a_new_writer_that_does_not_restore_starts_a_new_root(tmp_path: Path) -> None:
    a = _ck(tmp_path)
    old = [a.save({"w": _w(s), "step": s}, block=True).result().id for s in range(3)]
    fresh = _ck(tmp_path).save({"w": _w(0, 7.0), "step": 0}, block=True).result()
    ck = _ck(tmp_path)
    assert ck.manifest(fresh.id)["parent"] is None
    assert ck.latest().id == fresh.id
    assert [c.branch for c in ck.list()] == ["abandoned"] * 3 + ["live"]
    # the first writer goes on after the other's commit (with a warning): its own chain is live again
    with pytest.warns(RuntimeWarning, match="another writer"):
        nxt = a.save({"w": _w(3), "step": 3}, block=True).result()
    assert ck.manifest(nxt.id)["parent"] == old[-1]
    assert [c.branch for c in ck.list()] == ["live"] * 3 + ["abandoned", "live"]


def test_two_writers_racing_for_one_place_never_both_take_it(tmp_path: Path) -> None:
    """Two notebooks on one prefix: a commit whose place another writer took meanwhile moves to the next one,
    with a warning; every commit keeps its own place in the order."""
    a = _ck(tmp_path)
    a.save({"w": _w(0), "step": 0}, block=True)

    class Racing(LocalStore):
        raced = False

        def put(self, key: str, data: Any, create_only: bool = True) -> bool:
            if key.startswith("manifests/") and not Racing.raced:
                Racing.raced = True  # the other writer commits first, after this one chose its place
                a.save({"w": _w(1), "step": 1}, block=True)
            return super().put(key, data, create_only)

    b = _ck(Racing(tmp_path))
    with pytest.warns(RuntimeWarning, match="another writer"):
        got = b.save({"w": _w(10), "step": 10}, block=True).result()
    ck = _ck(tmp_path)
    lst = ck.list()
    assert [c.step for c in lst] == [0, 1, 10] and len({c.seq for c in lst}) == 3
    assert ck.latest().id == got.id and ck.manifest(got.id)["seq"] > ck.manifest(lst[1].id)["seq"]
    # the writer that fell behind catches up at its next commit, with a warning too
    with pytest.warns(RuntimeWarning, match="another writer"):
        nxt = a.save({"w": _w(2), "step": 2}, block=True).result()
    assert ck.latest().id == nxt.id and [c.step for c in ck.list()] == [0, 1, 10, 2]


def test_a_golden_store_and_new_commits_in_it_order_right(tmp_path: Path) -> None:
    """Format-3 ids sort before every new one, by step as before; new commits after them by commit order."""
    dst = tmp_path / "store"
    shutil.copytree(GOLDEN, dst, ignore=shutil.ignore_patterns("expected.json"))
    expected = json.loads((GOLDEN / "expected.json").read_text())
    old = [c["id"] for c in expected["checkpoints"]]
    ck = _ck(dst, chunk_mb=0.01)
    assert [c.id for c in ck.list()] == old and all(c.branch == "live" for c in ck.list())
    state = ck.restore(step=1)
    assert state["step"] == 1
    state["t"]["f32"] += 1.0
    new = ck.save({**state, "step": 2}, block=True).result()
    assert new.id not in old and new.step == 2
    again = _ck(dst)
    lst = again.list()
    assert [c.id for c in lst] == [*old, new.id]
    assert [c.branch for c in lst] == ["live", "live", "abandoned", "abandoned", "live"]
    assert again.latest().id == new.id and again.restore(step=2)["step"] == 2
    assert torch.equal(again.restore()["t"]["f32"], state["t"]["f32"])
    for cid in old:  # the old ids still resolve (whole, and by a unique prefix) and restore
        assert again.restore(cid)["step"] == int(cid[:12])
        assert again.manifest(cid[:14])["id"] == cid
    assert again.restore(step=3)["step"] == 3  # an abandoned old step is still found by step


def test_the_magic_lists_branches_and_gc_keeps_abandoned_ones_when_asked(
    ip: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ids, b4 = _rewound(tmp_path)
    ip.run_line_magic("gpu_checkpoint", f"list --store {tmp_path}")
    rows = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows == {
        ids[0]: "live",
        ids[1]: "live",
        ids[2]: "live",
        ids[3]: "abandoned",
        ids[4]: "abandoned",
        b4: "live",
    }
    ip.run_line_magic("gpu_checkpoint", f"gc --keep 1 --grace 0 --keep-abandoned --store {tmp_path}")
    assert "deleted 3 checkpoint(s)" in capsys.readouterr().out
    ip.run_line_magic("gpu_checkpoint", f"gc --keep 1 --grace 0 --store {tmp_path}")
    assert "deleted 2 checkpoint(s)" in capsys.readouterr().out
    assert [c.id for c in _ck(tmp_path).list()] == [b4]


def _sharded_rank(rank: int, world: int, root: str) -> None:
    """One gloo rank of a sharded job whose commit's place another writer takes first (see the test)."""
    import torch.distributed as dist

    from gpu_notebook.checkpoint import CheckpointSaveError

    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=world)
    out: dict[str, Any] = {}

    class Racing(LocalStore):
        raced = False

        def put(self, key: str, data: Any, create_only: bool = True) -> bool:
            if key.startswith("manifests/") and not Racing.raced:
                Racing.raced = True  # a notebook on the same store commits first, at the same place
                other = _ck(f"{root}/store", rank=0, world_size=1)
                other.save({"z": torch.zeros(10), "step": 50}, block=True)
            return super().put(key, data, create_only)

    try:
        store = Racing(f"{root}/store") if rank == 0 else LocalStore(f"{root}/store")
        ck = _ck(store, sharded=True, commit_timeout_s=30, retries=1, retry_backoff_s=0.01)
        mine = torch.full((1000,), float(rank))
        with pytest.warns(RuntimeWarning, match="NOT saved"):
            ck.save({"v": mine, "step": 1})
            try:
                ck.wait()
            except CheckpointSaveError as e:
                out["failed"] = str(e)
        dist.barrier()
        info = ck.save({"v": mine + 1, "step": 2}, block=True).result()
        dist.barrier()
        got = _ck(f"{root}/store", sharded=True).restore()
        out.update(id=info.id if info else None, ok=bool(torch.equal(got["v"], mine + 1)), step=got["step"])
    finally:
        Path(f"{root}/result-{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


def test_a_sharded_save_whose_place_was_taken_fails_on_every_rank_and_the_next_goes_after(
    tmp_path: Path,
) -> None:
    """The ranks above 0 wait for the manifest under the agreed id, so a sharded commit cannot move: it fails
    on every rank, and the next save proposes a place after the store's highest."""
    import torch.multiprocessing as mp

    mp.spawn(_sharded_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    res = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(2)]
    for r in res:
        assert "another writer took its place" in r["failed"] or "rank 0 failed" in r["failed"], res
        assert r["ok"] and r["step"] == 2, res
    assert res[0]["id"] == res[1]["id"] == "c0000000001", res  # after the other writer's c0000000000
