"""A save that several ranks write succeeds on every rank or fails on every rank (real gloo ranks,
torch.multiprocessing spawn, 2 processes): a rank's failed part fails the others, a failed commit fails the
ranks that wait for it (and none makes the failed save the base of its next delta), a stale record of a crashed
attempt is never committed, and a rank that dies at commit fails the others within ``commit_timeout_s``."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, LocalStore, StoreError
from gpu_notebook.checkpoint.format.manifest import manifest_objects, walk_chunks


class Faulty(LocalStore):
    """A local store whose writes fail (or whose process dies) on demand, for this process only."""

    fail: str | None = None  # writes of keys with this prefix raise
    die: str | None = None  # a write of a key with this prefix ends the process
    stale: dict[str, Any] | None = None  # planted before this rank's first record (see below)

    def put(self, key: str, data: bytes | memoryview, create_only: bool = True) -> bool:
        if self.die and key.startswith(self.die):
            os._exit(17)
        if self.fail and key.startswith(self.fail):
            raise StoreError(f"injected failure writing {key}")
        if self.stale is not None and key.startswith("shards/") and key.endswith("rank-00001.json"):
            # a record left by a crashed attempt of an earlier run that used the same id: under the key of
            # each layout (one id level; one level per attempt, of another save)
            rec, self.stale = self.stale, None
            ckpt_id = key.split("/")[1]
            old = json.dumps(rec).encode()
            super().put(f"shards/{ckpt_id}/rank-00001.json", old, True)
            other = json.dumps({**rec, "attempt": "00000000deadbeef-0", "rank": 1}).encode()
            super().put(f"shards/{ckpt_id}/00000000deadbeef-0/rank-00001.json", other, True)
        return super().put(key, data, create_only)


def _outcome(ck: Checkpointer, h: Any) -> str:
    """What a save said on this rank (its failure, raised once, is taken here: the next save starts clean)."""
    try:
        h.result(120)
    except Exception as e:  # noqa: BLE001 - the test records what each rank's save said
        try:
            ck.wait()
        except Exception:  # noqa: BLE001 - the same failure, raised again once by wait()
            pass
        return f"failed: {e}"
    return "ok"


def _agree_main(rank: int, world: int, root: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=world)
    out: dict[str, Any] = {}
    try:
        opts = {"sharded": True, "retries": 1, "retry_backoff_s": 0.05, "commit_timeout_s": 8}
        own = torch.full((30_000,), float(rank)) + torch.arange(30_000) * 1e-3

        # 1) rank 1's part cannot be written: the save fails on both ranks; the next one works
        s1 = Faulty(f"{root}/one")
        ck = Checkpointer(s1, preemption=None, progress=False, **opts)
        ck.save({"own": own, "step": 0}, block=True)
        own = own + 0.5
        Faulty.fail = "objects/" if rank == 1 else None
        out["one_failed"] = _outcome(ck, ck.save({"own": own, "step": 1}))
        Faulty.fail = None
        dist.barrier()
        out["one_steps"] = [c.step for c in ck.list()]
        own = own + 0.25
        out["one_next"] = _outcome(ck, ck.save({"own": own, "step": 2}))
        dist.barrier()
        got = Checkpointer(f"{root}/one", preemption=None, progress=False, sharded=True).restore()
        out["one_restored"] = bool(torch.equal(got["own"], own)) and got["step"] == 2

        # 2) rank 0's manifest cannot be written: rank 1's save fails too, and its next save is no delta against
        # the one that was never committed (here a full base: it would have become the base of the next delta)
        s2 = Faulty(f"{root}/two")
        ck2 = Checkpointer(s2, preemption=None, progress=False, **{**opts, "retries": 0})
        ck2.save({"own": own, "step": 0}, block=True)
        dist.barrier()
        Faulty.fail = "manifests/" if rank == 0 else None
        own = own + 0.5
        out["two_failed"] = _outcome(ck2, ck2.save({"own": own, "step": 1}, full=True))
        Faulty.fail = None
        dist.barrier()
        out["two_steps"] = [c.step for c in ck2.list()]
        own = own + 0.25
        out["two_next"] = _outcome(ck2, ck2.save({"own": own, "step": 2}))
        dist.barrier()
        got = Checkpointer(f"{root}/two", preemption=None, progress=False, sharded=True).restore()
        out["two_restored"] = bool(torch.equal(got["own"], own))

        # 3) a stale record of this id, left by a crashed attempt (rank 1's part of an older state), is never
        # committed: rank 0 takes only the records of this attempt of this save
        s3 = Faulty(f"{root}/three")
        ck3 = Checkpointer(s3, preemption=None, progress=False, **opts)
        ck3.save({"own": own, "step": 0}, block=True)
        dist.barrier()
        if rank == 1:
            man = ck3.manifest()
            shard = next(s for s in man["shards"] if s["rank"] == 1)
            Faulty.stale = {"shard": shard, "stats": man["stats"]}
        own = own + 0.5
        out["three"] = _outcome(ck3, ck3.save({"own": own, "step": 1}))
        Faulty.stale = None
        dist.barrier()
        got = Checkpointer(f"{root}/three", preemption=None, progress=False, sharded=True).restore()
        out["three_restored"] = bool(torch.equal(got["own"], own))
        torch.save(own, f"{root}/own-{rank}.pt")
    finally:
        Path(f"{root}/agree-{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def agree_dir() -> str:
    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="gnb-ckpt-agree-")
    mp.spawn(_agree_main, args=(2, root), nprocs=2, join=True)
    return root


def _res(root: str, rank: int, name: str = "agree") -> dict[str, Any]:
    return json.loads(Path(f"{root}/{name}-{rank}.json").read_text())


def test_a_failed_part_fails_the_save_on_every_rank(agree_dir: str) -> None:
    r0, r1 = _res(agree_dir, 0), _res(agree_dir, 1)
    assert "injected failure" in r1["one_failed"], r1
    assert "rank 1 failed" in r0["one_failed"] and "injected failure" in r0["one_failed"], r0
    assert r0["one_steps"] == r1["one_steps"] == [0]  # no manifest of the failed save
    for r in (r0, r1):  # the next save works and restores bit-exact on every rank
        assert r["one_next"] == "ok" and r["one_restored"] is True, r


def test_a_failed_commit_fails_the_waiting_rank_and_is_no_delta_base(agree_dir: str) -> None:
    r0, r1 = _res(agree_dir, 0), _res(agree_dir, 1)
    assert "injected failure" in r0["two_failed"], r0
    assert r1["two_failed"].startswith("failed:") and "rank 0 failed" in r1["two_failed"], r1
    assert r0["two_steps"] == r1["two_steps"] == [0]
    for r in (r0, r1):
        assert r["two_next"] == "ok" and r["two_restored"] is True, r
    # rank 1's part of the next checkpoint is a delta against what was committed (step 0), not against the
    # full base it wrote for the save that failed
    ck = Checkpointer(f"{agree_dir}/two", rank=1, world_size=2, sharded=True, preemption=None)
    docs = {c.step: ck.manifest(c.id) for c in ck.list()}
    committed0 = manifest_objects(docs[0])
    shard = next(s for s in docs[2]["shards"] if s["rank"] == 1)
    bases = {e["obj"] for lf in shard["leaves"].values() for c in lf["chunks"] for e in walk_chunks(c)[1:]}
    assert bases and bases <= committed0
    written_by_failed = (
        {
            str(p.relative_to(f"{agree_dir}/two"))
            for p in Path(f"{agree_dir}/two/objects").rglob("*")
            if p.is_file()
        }
        - committed0
        - manifest_objects(docs[2])
    )
    assert written_by_failed  # (the failed save did write objects: they are just not used)


def test_a_stale_record_of_a_crashed_attempt_is_never_committed(agree_dir: str) -> None:
    for r in range(2):
        res = _res(agree_dir, r)
        assert res["three"] == "ok" and res["three_restored"] is True, (r, res)
        got = Checkpointer(f"{agree_dir}/three", rank=r, world_size=2, sharded=True).restore()
        assert torch.equal(got["own"], torch.load(f"{agree_dir}/own-{r}.pt"))


def _die_main(rank: int, world: int, root: str, who: int, where: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=world)
    out: dict[str, Any] = {}
    try:
        ck = Checkpointer(
            Faulty(f"{root}/store"),
            sharded=True,
            commit_timeout_s=4,
            retries=2,
            preemption=None,
            progress=False,
        )
        ck.save({"v": torch.full((1000,), float(rank)), "step": 0}, block=True)
        dist.barrier()
        Faulty.die = where if rank == who else None
        t0 = time.monotonic()
        h = ck.save({"v": torch.full((1000,), rank + 1.0), "step": 1})
        out["id"] = h.id
        out["outcome"] = _outcome(ck, h)
        out["took_s"] = round(time.monotonic() - t0, 2)  # (reported, not asserted)
        out["steps"] = [c.step for c in ck.list()]
    finally:
        Path(f"{root}/die-{rank}.json").write_text(json.dumps(out))


@pytest.mark.parametrize(
    ("who", "where", "says"),
    [
        (0, "manifests/", "rank 0 did not commit it within 4 s"),
        (1, "shards/", "rank 1 did not save its part"),
    ],
    ids=["rank0-dies-before-its-manifest", "rank1-dies-before-its-record"],
)
def test_a_rank_that_dies_at_commit_fails_the_other_within_the_timeout(
    who: int, where: str, says: str
) -> None:
    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="gnb-ckpt-die-")
    ctx = mp.start_processes(
        _die_main, args=(2, root, who, where), nprocs=2, join=False, start_method="spawn"
    )
    for p in ctx.processes:
        p.join(120)
    codes = [p.exitcode for p in ctx.processes]
    assert codes[who] == 17 and codes[1 - who] == 0, codes
    res = _res(root, 1 - who, "die")
    assert res["outcome"].startswith("failed:") and says in res["outcome"], res
    assert res["steps"] == [0], res  # (and no retry after the deadline: it fails once, within it)


def _restart_main(rank: int, world: int, root: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{root}/init-again", rank=rank, world_size=world)
    out: dict[str, Any] = {}
    try:
        ck = Checkpointer(f"{root}/store", sharded=True, commit_timeout_s=20, preemption=None, progress=False)
        out["resumed_step"] = ck.restore()["step"]
        v = torch.full((1000,), rank + 7.0)
        h = ck.save({"v": v, "step": 1}, block=True)
        out["id"] = h.id
        dist.barrier()
        got = Checkpointer(f"{root}/store", sharded=True, preemption=None, progress=False).restore()
        out["restored_ok"] = bool(torch.equal(got["v"], v))
    finally:
        Path(f"{root}/again-{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


def test_a_job_restarted_after_a_crash_at_commit_never_commits_the_crashed_records() -> None:
    """Rank 0 dies before its manifest: rank 1's record of that save stays in the store. The restarted job's
    next save takes the same place in the commit order (the same id), and must commit its own records."""
    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="gnb-ckpt-restart-")
    ctx = mp.start_processes(
        _die_main, args=(2, root, 0, "manifests/"), nprocs=2, join=False, start_method="spawn"
    )
    for p in ctx.processes:
        p.join(120)
    crashed = _res(root, 1, "die")
    assert list(Path(f"{root}/store/shards").rglob("rank-00001.json"))  # the crashed attempt's record
    mp.spawn(_restart_main, args=(2, root), nprocs=2, join=True)
    for r in range(2):
        res = _res(root, r, "again")
        assert res["resumed_step"] == 0 and res["id"] == crashed["id"], (r, res, crashed)
        assert res["restored_ok"] is True, (r, res)
