"""Spread saves of a replicated DDP state (real gloo ranks, torch.multiprocessing spawn, 2 processes): the ranks
share the copy and the encoding of the big tensors, rank 0 commits one manifest that holds the same chunks as a
save of rank 0 alone, every rank restores it bit-exact (and so does a single process), the ranks agree on full
bases, and states that differ between the ranks fail the save on every rank with an error that says so."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, CheckpointError
from gpu_notebook.checkpoint.save.spread import SPREAD_MIN, Spread, fill_remote_chunks

STEPS = 5  # saves of each store: base, delta, delta, base (full_every=3), delta


def _model() -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same initial weights on every rank (DDP checks)
        # four weights of 1-2 MiB (spread), their biases and a norm layer (small: rank 0's, in groups)
        return torch.nn.Sequential(
            torch.nn.Linear(512, 1024),
            torch.nn.LayerNorm(1024),
            torch.nn.Linear(1024, 512),
            torch.nn.Linear(512, 512),
            torch.nn.Linear(512, 1024),
        )


def _rank_main(rank: int, world: int, root: str) -> None:
    import torch.distributed as dist

    from gpu_notebook.checkpoint import CheckpointSaveError

    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=world)
    torch.set_num_threads(1)
    out: dict[str, Any] = {"infos": [], "alone": []}
    try:
        model = torch.nn.parallel.DistributedDataParallel(_model())
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        data = torch.randn(16, 512, generator=torch.Generator().manual_seed(1))
        spread = Checkpointer(
            f"{root}/spread", full_every=3, progress=False, preemption=None, commit_timeout_s=60
        )
        alone = Checkpointer(
            f"{root}/alone", full_every=3, progress=False, preemption=None, commit_timeout_s=60, spread=False
        )
        out["spread_on"], out["alone_on"] = spread.spread, alone.spread
        for step in range(STEPS):
            loss = model(data).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            state = {"model": model.module, "optim": opt, "step": step}
            info = spread.save(state, block=True).result()
            out["infos"].append(
                {"id": info.id, "is_base": info.is_base, "new": info.new_bytes, "stats": info.extra["stats"]}
            )
            a = alone.save(state, block=True).result()
            out["alone"].append({"id": a.id, "new": a.new_bytes})
        out["owned"] = sorted(n for n, o in spread._spread.owners.items() if o == rank)
        torch.save(model.module.state_dict(), f"{root}/model-{rank}.pt")
        # every rank restores the spread checkpoint bit-exact
        fresh = _model()
        Checkpointer(f"{root}/spread", progress=False, preemption=None).restore(into={"model": fresh})
        out["restored_ok"] = all(
            torch.equal(a, b)
            for a, b in zip(fresh.state_dict().values(), model.module.state_dict().values(), strict=True)
        )
        # only rank 1 asks for a full base: the ranks agree on one (else rank 0 would commit a delta of chunks
        # that rank 1 encoded as full frames, or the other way round)
        info = spread.save({"model": model.module, "optim": opt, "step": 99}, full=(rank == 1), block=True)
        out["asked_base"] = info.result().is_base
        # without RNG states (nothing of its own on any rank) the save is spread all the same
        norng = Checkpointer(f"{root}/norng", rng=False, progress=False, preemption=None, commit_timeout_s=60)
        got = norng.save({"model": model.module, "step": 0}, block=True).result()
        out["norng_ranks"] = got.extra["stats"]["ranks"]
        dist.barrier()
        # a state that is not the same on every rank: rank 1 holds another big tensor first, so the ranks split
        # the tensors otherwise and some of rank 0's are encoded by no rank
        odd = Checkpointer(f"{root}/odd", progress=False, preemption=None, commit_timeout_s=30, retries=0)
        extra = {"extra": torch.ones(SPREAD_MIN // 4)} if rank == 1 else {}
        try:
            odd.save({**extra, "model": model.module, "step": 0}, block=True)
            out["odd"] = "saved"
        except CheckpointSaveError as e:
            out["odd"] = str(e)
        out["odd_listed"] = [c.id for c in odd.list()]
        # rank 1's first upload fails: the attempt fails on both ranks, and the retry commits both ranks' tensors
        from gpu_notebook.checkpoint import LocalStore, StoreError

        class Flaky(LocalStore):
            failed = False

            def put(self, key, data, create_only=True):  # type: ignore[no-untyped-def]
                if key.startswith("objects/") and not Flaky.failed:
                    Flaky.failed = True
                    raise StoreError("injected: rank 1's first upload fails")
                return super().put(key, data, create_only)

        store = Flaky(f"{root}/flaky") if rank == 1 else LocalStore(f"{root}/flaky")
        flaky = Checkpointer(
            store, retry_backoff_s=0.05, progress=False, preemption=None, commit_timeout_s=60
        )
        got = flaky.save({"model": model.module, "step": 0}, block=True).result()
        out["flaky"] = {"ranks": got.extra["stats"]["ranks"], "failed": Flaky.failed}
        dist.barrier()
        # a local folder that is not shared between the ranks' machines (each rank a folder of its own here): the
        # ranks of a save could never meet in it; every rank is told so when the Checkpointer is made
        from gpu_notebook.checkpoint import CheckpointError

        try:
            Checkpointer(f"{root}/node-{rank}", progress=False, preemption=None)
            out["unshared"] = "made"
        except CheckpointError as e:
            out["unshared"] = str(e)
        out["probes_left"] = sorted(p.name for p in Path(f"{root}/node-0").rglob("probe-*"))
    finally:
        Path(f"{root}/result-{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs() -> str:
    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="gnb-ckpt-spread-")
    mp.spawn(_rank_main, args=(2, root), nprocs=2, join=True)
    return root


def _res(root: str, rank: int) -> dict[str, Any]:
    return json.loads(Path(f"{root}/result-{rank}.json").read_text())


@pytest.mark.timeout(600)
def test_the_ranks_share_the_encoding_and_commit_what_rank_0_alone_would(runs: str) -> None:
    res = [_res(runs, r) for r in range(2)]
    assert res[0]["spread_on"] and res[1]["spread_on"] and not res[0]["alone_on"]
    # the same commits on both ranks, bases where full_every says
    assert [i["id"] for i in res[0]["infos"]] == [i["id"] for i in res[1]["infos"]]
    assert [i["is_base"] for i in res[0]["infos"]] == [True, False, False, True, False]
    # each rank owns about half of the big tensors' bytes (list scheduling: within one tensor of the mean)
    owned = [set(r["owned"]) for r in res]
    assert owned[0] and owned[1] and not owned[0] & owned[1]
    for info in res[0]["infos"]:
        parts = {p["rank"]: p for p in info["stats"]["ranks"]}
        assert set(parts) == {0, 1}
        total = sum(p["raw_bytes"] for p in parts.values())
        assert total == info["stats"]["raw_bytes"]
        assert 0.3 < parts[1]["raw_bytes"] / total < 0.7, parts  # rank 1 copied and encoded its share
        assert parts[1]["cpu_s"] > 0 and parts[1]["stall_s"] > 0
    # the deltas, spread too, are deltas: as small as rank 0's alone (each rank keeps the base of its own tensors)
    infos = res[0]["infos"]
    for info, a in zip(infos, res[0]["alone"], strict=True):
        assert abs(info["new"] - a["new"]) < 0.05 * a["new"], (info, a)
    assert infos[1]["new"] < 0.9 * infos[0]["new"] and infos[4]["new"] < 0.9 * infos[3]["new"]

    # the manifest is what a save of rank 0 alone commits: the same leaves, with chunks of the same bytes
    spread = Checkpointer(f"{runs}/spread", rank=0, world_size=2, preemption=None, progress=False)
    alone = Checkpointer(f"{runs}/alone", rank=0, world_size=2, preemption=None, progress=False)
    for sid, aid in zip([i["id"] for i in infos], [a["id"] for a in res[0]["alone"]], strict=True):
        ms, ma = spread.manifest(sid), alone.manifest(aid)
        assert ms["is_base"] == ma["is_base"] and len(ms["shards"]) == len(ma["shards"]) == 1
        s, a = ms["shards"][0], ma["shards"][0]
        assert s["tree"] == a["tree"] and s.get("groups", {}).keys() == a.get("groups", {}).keys()
        assert {n: [c["raw"] for c in lf["chunks"]] for n, lf in s["leaves"].items()} == {
            n: [c["raw"] for c in lf["chunks"]] for n, lf in a["leaves"].items()
        }
    # what each rank's part took from it, shown by show()
    shown = repr(spread.show(infos[-1]["id"]))
    assert "per rank: 0: " in shown and "; 1: " in shown and "CPU" in shown, shown
    # the chunks of both ranks' tensors are in the one shard: a single process restores it bit-exact
    want = torch.load(f"{runs}/model-0.pt")
    got = Checkpointer(f"{runs}/spread", preemption=None, progress=False).restore(per_rank="drop", step=4)
    assert got["step"] == 4
    for k, v in want.items():
        assert torch.equal(got["model"][k], v), k
    assert res[0]["restored_ok"] and res[1]["restored_ok"]


def test_a_full_base_asked_by_one_rank_is_agreed_by_all(runs: str) -> None:
    assert [_res(runs, r)["asked_base"] for r in range(2)] == [True, True]


def test_a_save_without_rng_states_is_spread_too(runs: str) -> None:
    parts = {p["rank"]: p["raw_bytes"] for p in _res(runs, 0)["norng_ranks"]}
    assert 0.3 < parts[1] / (parts[0] + parts[1]) < 0.7, parts


def test_states_that_differ_between_the_ranks_fail_the_save_on_every_rank(runs: str) -> None:
    for r in range(2):
        res = _res(runs, r)
        assert res["odd"] != "saved" and res["odd_listed"] == [], (r, res["odd"])
    assert "the same on every rank" in _res(runs, 0)["odd"] and "spread=False" in _res(runs, 0)["odd"]
    assert "rank 0 failed" in _res(runs, 1)["odd"]


def test_a_failed_part_is_retried_on_every_rank_and_the_retry_holds_both_ranks_tensors(runs: str) -> None:
    flaky = [_res(runs, r)["flaky"] for r in range(2)]
    assert flaky[1]["failed"] and not flaky[0]["failed"]  # (only rank 1's store failed, once)
    parts = {p["rank"]: p["raw_bytes"] for p in flaky[0]["ranks"]}
    assert parts[1] > 0.3 * (parts[0] + parts[1])
    ck = Checkpointer(f"{runs}/flaky", preemption=None, progress=False)
    assert ck.manifest()["attempt"].endswith("-1")  # the second attempt was committed
    got = ck.restore(per_rank="drop")
    for k, v in torch.load(f"{runs}/model-0.pt").items():
        assert torch.equal(got["model"][k], v), k


def test_a_folder_not_shared_between_the_ranks_is_refused_on_every_rank_at_once(runs: str) -> None:
    for r in range(2):
        msg = _res(runs, r)["unshared"]
        assert "is not shared between the ranks" in msg and "s3://" in msg, (r, msg)
    assert _res(runs, 0)["probes_left"] == []  # rank 0's probe is gone
    # the shared folders of the other checks passed the same check (they saved)
    assert _res(runs, 0)["infos"] and _res(runs, 1)["infos"]


def test_owners_are_sticky_and_balanced_within_one_tensor() -> None:
    sizes = [(f"t{i}", (i * 7919) % 13 * SPREAD_MIN + SPREAD_MIN) for i in range(40)]
    a, b = Spread(0, 3), Spread(2, 3)
    first = [a.owner(n, s) for n, s in sizes]
    assert first == [b.owner(n, s) for n, s in sizes]  # every rank decides alike
    mean = sum(s for _, s in sizes) / 3
    assert max(a.load) <= mean + max(s for _, s in sizes)
    assert first[0] == 2  # ties go to the highest rank: rank 0 also has the small tensors and the commit
    # a tensor keeps its owner (where its delta base lies), whatever comes before it the next time
    assert a.owner("new", 10 * SPREAD_MIN) in range(3)
    assert [a.owner(n, s) for n, s in sizes] == first


def test_rank_0_fills_in_the_other_ranks_chunks_and_refuses_a_gap_or_another_shape() -> None:
    def leaf(chunks: Any = None) -> dict[str, Any]:
        return {"dtype": "float32", "shape": [4, 2], "chunks": chunks}

    shard = {"leaves": {"a": leaf([{"raw": "x"}]), "b": leaf()}, "groups": {}}
    fill_remote_chunks(shard, {1: {"b": leaf([{"raw": "y"}]), "zzz": leaf([{"raw": "z"}])}}, "c1")
    assert shard["leaves"]["b"]["chunks"] == [{"raw": "y"}] and "zzz" not in shard["leaves"]
    with pytest.raises(CheckpointError, match="no rank encoded 1 tensor.*'a'.*the same on every rank"):
        fill_remote_chunks({"leaves": {"a": leaf()}}, {1: {}}, "c2")
    other = {**leaf([{"raw": "y"}]), "shape": [2, 4]}
    with pytest.raises(
        CheckpointError, match=r"'a' .* float32 \[4, 2\] on rank 0 and float32 \[2, 4\] on rank 3"
    ):
        fill_remote_chunks({"leaves": {"a": leaf()}}, {3: {"a": other}}, "c3")
