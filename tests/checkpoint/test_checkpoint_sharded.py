"""Sharded and replicated saves from real gloo ranks (torch.multiprocessing spawn, 2 processes)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, CheckpointError


def _rank_main(rank: int, world: int, root: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=world)
    out: dict[str, object] = {}
    try:
        # 1) sharded: every rank has its own tensors
        own = torch.full((50_000,), float(rank)) + torch.arange(50_000) * 1e-3
        ck = Checkpointer(f"{root}/sharded", sharded=True, full_every=3)
        for step in range(3):
            own = own + 1e-4
            ck.save({"shard": own, "rank": rank, "step": step}, block=True)
        dist.barrier()
        got = Checkpointer(f"{root}/sharded", sharded=True).restore()
        out["sharded_ok"] = bool(torch.equal(got["shard"], own)) and got["rank"] == rank
        torch.save(own, f"{root}/own-{rank}.pt")
        # 2) replicated DDP state: only rank 0 writes, every rank restores
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(torch.randn(4, 16)).sum()
        loss.backward()
        opt.step()
        rep = Checkpointer(f"{root}/replicated")
        h = rep.save({"model": model.module, "optim": opt, "step": 7}, block=True)
        out["replicated_wrote"] = h.id is not None
        dist.barrier()
        m2 = torch.nn.Linear(16, 4)
        Checkpointer(f"{root}/replicated").restore(into={"model": m2})
        out["replicated_ok"] = bool(torch.equal(m2.weight, model.module.weight))
        torch.save(model.module.state_dict(), f"{root}/ddp.pt")
        # 3) sharded=True but identical on every rank: marked replicated
        same = Checkpointer(f"{root}/same", sharded=True)
        same.save({"w": torch.ones(1000), "step": 1}, block=True)
        dist.barrier()
        # 4) restore(fallback=True) is agreed: rank 1's part of the latest checkpoint is lost, rank 0's is intact;
        # both ranks go back to the checkpoint before it
        fb = Checkpointer(f"{root}/fallback", sharded=True, full_every=10)
        mine = torch.full((40_000,), float(rank))
        for step in range(3):
            mine = mine + 1.0
            fb.save({"shard": mine, "step": step}, block=True)
        dist.barrier()
        ids = [c.id for c in fb.list()]

        def rank1_objects(cid: str) -> set[str]:
            doc = fb.manifest(cid)
            return {
                c["obj"]
                for sh in doc["shards"]
                if sh["rank"] == 1
                for lf in sh["leaves"].values()
                for c in lf["chunks"]
            }

        if rank == 1:
            for o in rank1_objects(ids[2]) - rank1_objects(ids[1]):
                Path(f"{root}/fallback/{o}").unlink()
        dist.barrier()
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = Checkpointer(f"{root}/fallback", sharded=True).restore(fallback=True)
        out["fallback_step"] = got["step"]
        out["fallback_ok"] = bool(torch.equal(got["shard"], torch.full((40_000,), float(rank) + 2.0)))
        out["fallback_warning"] = [str(w.message) for w in caught if ids[2] in str(w.message)][:1]
        dist.barrier()
        # 5) the ranks agree on what their own clocks and uploads would decide alone: on_busy="skip" where only
        # rank 0's save is still uploading (rank 1's is done), and every_minutes where only rank 0 is due.
        # Decided alone, rank 1 would save what rank 0 skips: their ids drift apart and no later save commits.
        import threading
        import time

        from gpu_notebook.checkpoint import LocalStore

        class Slow(LocalStore):
            gate = threading.Event()

            def put(self, key, data, create_only=True):  # type: ignore[no-untyped-def]
                if key.startswith("objects/"):
                    self.gate.wait(30)
                return super().put(key, data, create_only)

        store = Slow(f"{root}/agree") if rank == 0 else LocalStore(f"{root}/agree")
        if rank != 0:
            Slow.gate.set()
        ag = Checkpointer(
            store, sharded=True, on_busy="skip", every_minutes=1e6, commit_timeout_s=20, preemption=None
        )
        vec = torch.full((10_000,), float(rank))
        first = ag.save({"v": vec, "step": 0})
        while rank == 1 and not Path(f"{root}/agree/shards").exists():
            time.sleep(0.01)  # rank 1's part is written: only rank 0 is still busy
        dist.barrier()
        second = ag.save({"v": vec + 1, "step": 1})
        out["agree_skipped"] = second.skipped
        Slow.gate.set()
        first.result(60)
        if rank == 0:
            ag._last_save_time = time.time() - 1e9  # only rank 0's clock says "due"
        third = ag.maybe_save({"v": vec + 2, "step": 2}, 2)
        out["agree_saved"] = third is not None
        if third is not None:
            third.result(60)
        dist.barrier()
        out["agree_steps"] = [c.step for c in Checkpointer(f"{root}/agree", rank=rank, world_size=2).list()]
    finally:
        Path(f"{root}/result-{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks_dir() -> str:
    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="gnb-ckpt-shard-")
    mp.spawn(_rank_main, args=(2, root), nprocs=2, join=True)
    return root


def test_each_rank_saves_and_restores_its_shard(ranks_dir: str) -> None:
    for r in range(2):
        res = json.loads(Path(f"{ranks_dir}/result-{r}.json").read_text())
        assert res["sharded_ok"] is True
    ck = Checkpointer(f"{ranks_dir}/sharded", rank=0, world_size=2, sharded=True)
    lst = ck.list()
    assert [c.step for c in lst] == [0, 1, 2] and all(c.world_size == 2 for c in lst)
    man = ck.manifest()
    assert sorted(s["rank"] for s in man["shards"]) == [0, 1] and man["replicated"] is False
    assert not man["is_base"]  # shards use deltas too
    # every rank's shard can be restored from outside the job with the same world size
    for r in range(2):
        got = Checkpointer(f"{ranks_dir}/sharded", rank=r, world_size=2, sharded=True).restore()
        assert torch.equal(got["shard"], torch.load(f"{ranks_dir}/own-{r}.pt"))
    assert not list(
        Path(f"{ranks_dir}/sharded").glob("shards/*/*.json")
    )  # shard records folded into the manifest


def test_sharded_state_refuses_a_different_world_size(ranks_dir: str) -> None:
    with pytest.raises(CheckpointError, match="world size 2.*not 1"):
        Checkpointer(f"{ranks_dir}/sharded", rank=0, world_size=1).restore()


def test_replicated_state_restores_onto_another_world_size(ranks_dir: str) -> None:
    for r in range(2):
        res = json.loads(Path(f"{ranks_dir}/result-{r}.json").read_text())
        assert res["replicated_ok"] is True
        assert res["replicated_wrote"] is True  # rank 1 too: its per-rank section (its RNG states)
    ck = Checkpointer(f"{ranks_dir}/replicated", rank=0, world_size=1)
    assert [c.world_size for c in ck.list()] == [2]
    man = ck.manifest()  # the replicated state once (rank 0's), a per-rank section of every rank
    assert len(man["shards"]) == 1 and [s["rank"] for s in man["per_rank"]] == [0, 1]
    m = torch.nn.Linear(16, 4)
    state = ck.restore(into={"model": m})
    assert state["step"] == 7
    ref = torch.load(f"{ranks_dir}/ddp.pt")
    assert torch.equal(m.weight, ref["weight"]) and torch.equal(m.bias, ref["bias"])
    # its per-rank sections hold RNG states only: left out on another world size, unless they are asked for
    with pytest.raises(CheckpointError, match="per-rank RNG states of 2 rank.*per_rank='drop'"):
        ck.restore(rng=True)
    # identical shards are detected as replicated and restore anywhere (world size 3 here)
    same = Checkpointer(f"{ranks_dir}/same", rank=2, world_size=3)
    assert same.manifest()["replicated"] is True
    assert torch.equal(same.restore()["w"], torch.ones(1000))


def test_fallback_is_agreed_across_ranks(ranks_dir: str) -> None:
    # one rank could not restore the latest checkpoint: every rank restores the one before it, together
    for r in range(2):
        res = json.loads(Path(f"{ranks_dir}/result-{r}.json").read_text())
        assert res["fallback_step"] == 1 and res["fallback_ok"] is True, (r, res)
        assert res["fallback_warning"], (r, res)
    r0 = json.loads(Path(f"{ranks_dir}/result-0.json").read_text())
    assert "another rank could not restore its part" in r0["fallback_warning"][0]


def test_ranks_agree_to_skip_and_to_save(ranks_dir: str) -> None:
    # a save skipped on one rank is skipped on every rank; a clock due on one rank saves on every rank: the
    # checkpoints that exist have both shards
    for r in range(2):
        res = json.loads(Path(f"{ranks_dir}/result-{r}.json").read_text())
        assert res["agree_skipped"] is True, (r, res)
        assert res["agree_saved"] is True, (r, res)
        assert res["agree_steps"] == [0, 2], (r, res)
    man = Checkpointer(f"{ranks_dir}/agree", rank=0, world_size=2, sharded=True).manifest()
    assert sorted(s["rank"] for s in man["shards"]) == [0, 1]
