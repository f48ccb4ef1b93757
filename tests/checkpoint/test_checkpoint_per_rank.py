"""Every rank's own state in replicated DDP: each rank's RNG states and data order (a stateful sampler marked
``PerRank``, and a real torchdata ``StatefulDataLoader``) are saved beside rank 0's shared state and restored to the same rank, bit-exact (real gloo ranks,
torch.multiprocessing spawn, 2 processes seeded differently)."""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gpu_notebook.checkpoint import Checkpointer, CheckpointError, PerRank

SAVE_AT, AFTER = 5, 6  # steps before the save, and after it (recorded, then replayed from the checkpoint)


class ShuffledSampler:
    """A stateful sampler as torchdata's ``StatefulDataLoader`` expects one: a new permutation each epoch from
    its own seed (a different one on every rank), and its position in it."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch, self.pos = n, seed, 0, 0

    def _perm(self) -> list[int]:
        g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def batch(self, size: int) -> list[int]:
        out = []
        for _ in range(size):
            if self.pos == self.n:
                self.epoch, self.pos = self.epoch + 1, 0
            out.append(self._perm()[self.pos])
            self.pos += 1
        return out

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.seed, self.epoch, self.pos = sd["seed"], sd["epoch"], sd["pos"]


def _train(rank: int, world: int, root: str, phase: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{root}/init-{phase}", rank=rank, world_size=world)
    out: dict[str, Any] = {}
    try:
        # every rank seeded differently; the second run seeded otherwise again: only a restore makes it replay
        base = 10 if phase == "first" else 777
        random.seed(base + rank)
        np.random.seed(base + 1 + rank)
        torch.manual_seed(base + 2 + rank)
        with torch.random.fork_rng():
            torch.manual_seed(0)  # the same initial weights on every rank (DDP checks)
            net = torch.nn.Linear(8, 1)
        model = torch.nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sampler = ShuffledSampler(12, seed=(rank + 1) if phase == "first" else 99)
        data = torch.linspace(-1, 1, 12 * 8).reshape(12, 8)
        ckpt = Checkpointer(f"{root}/store", progress=False, preemption=None, commit_timeout_s=60)

        def step() -> dict[str, Any]:
            idx = sampler.batch(5)  # 5 of 12: the epochs roll over between the save and the end
            noise = torch.randn(5, 8) * 0.01  # torch's global RNG
            scale = random.random()  # Python's
            shift = float(np.random.rand())  # numpy's
            loss = (model(data[idx] + noise).squeeze() * scale - shift).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            return {"idx": idx, "noise": noise.numpy().tobytes().hex(), "scale": scale, "shift": shift}

        # and a real torchdata StatefulDataLoader, shuffled by its own generator (seeded per rank), part-way through
        from torchdata.stateful_dataloader import StatefulDataLoader

        gen = torch.Generator().manual_seed((rank + 1) if phase == "first" else 99)
        loader = StatefulDataLoader(list(range(40)), batch_size=3, shuffle=True, generator=gen)
        state = {
            "model": net,
            "optim": opt,
            "sampler": PerRank(sampler),
            "loader": PerRank(loader),
            "step": SAVE_AT,
        }
        if phase == "first":
            batches = iter(loader)
            for _ in range(SAVE_AT):
                step()
                next(batches)
            h = ckpt.save(state, block=True)
            out["saved_id"] = h.id
            out["sampler_at_save"] = sampler.state_dict()
        else:
            got = ckpt.restore(
                into=state, rng=True
            )  # the same dict: the PerRank sampler and loader are loaded too
            out["restored_sampler"] = got["sampler"]
            batches = iter(loader)  # resumes where the saved loader was
        out["records"] = [step() for _ in range(AFTER)]
        out["loader"] = [next(batches).tolist() for _ in range(AFTER)]
        out["weights"] = [p.detach().numpy().tobytes().hex() for p in net.parameters()]
        ckpt.close()
    finally:
        Path(f"{root}/{phase}-{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs() -> str:
    import torch.multiprocessing as mp

    root = tempfile.mkdtemp(prefix="gnb-ckpt-per-rank-")
    mp.spawn(_train, args=(2, root, "first"), nprocs=2, join=True)
    mp.spawn(_train, args=(2, root, "resumed"), nprocs=2, join=True)
    return root


def _res(root: str, phase: str, rank: int) -> dict[str, Any]:
    return json.loads(Path(f"{root}/{phase}-{rank}.json").read_text())


def test_every_rank_resumes_its_own_rng_and_data_order_bit_exact(runs: str) -> None:
    first = [_res(runs, "first", r) for r in range(2)]
    again = [_res(runs, "resumed", r) for r in range(2)]
    # the ranks' draws and batches differ (seeded differently): rank 0's state alone cannot replay rank 1's
    assert first[0]["records"][0]["idx"] != first[1]["records"][0]["idx"]
    assert first[0]["records"][0]["noise"] != first[1]["records"][0]["noise"]
    for r in range(2):
        assert again[r]["restored_sampler"] == first[r]["sampler_at_save"], r
        assert again[r]["records"] == first[r]["records"], r  # every batch and random draw, bit-exact
        assert again[r]["loader"] == first[r]["loader"], r  # the StatefulDataLoader goes on where it was
        assert again[r]["weights"] == first[r]["weights"], r
    assert first[0]["loader"] != first[1]["loader"]  # (each rank's loader shuffles its own way)
    assert first[0]["weights"] == first[1]["weights"]  # (DDP: the same weights on every rank)


def test_the_manifest_holds_one_shared_shard_and_a_section_per_rank(runs: str) -> None:
    ck = Checkpointer(f"{runs}/store", rank=0, world_size=2, preemption=None)
    man = ck.manifest()
    assert len(man["shards"]) == 1 and man["world_size"] == 2
    assert [s["rank"] for s in man["per_rank"]] == [0, 1]
    for s in man["per_rank"]:
        assert all(n.startswith("//rank/") for n in s["leaves"])
        kinds = {lf["dtype"] for lf in s["leaves"].values()}
        assert "uint8" in kinds  # torch's RNG state: a uint8 tensor through the chunk path (no pickle)
        assert all(lf["kind"] != "pickle" for lf in s["leaves"].values())
    shared = man["shards"][0]["leaves"]
    assert not any(n.startswith("//rank/") or n.startswith("sampler") for n in shared)
    # every rank's section is restored from outside the job too, given that rank
    got = Checkpointer(f"{runs}/store", rank=1, world_size=2, preemption=None).restore()
    assert got["sampler"] == _res(runs, "first", 1)["sampler_at_save"]


def test_another_world_size_must_say_what_to_do_with_the_per_rank_sections(runs: str) -> None:
    ck = Checkpointer(f"{runs}/store", rank=0, world_size=1, preemption=None)
    with pytest.raises(CheckpointError, match=r"PerRank values \(loader, sampler\).*2 rank.*per_rank='drop'"):
        ck.restore()
    dropped = ck.restore(per_rank="drop")
    assert "sampler" not in dropped and dropped["step"] == SAVE_AT
    net = torch.nn.Linear(8, 1)
    ck.restore(into={"model": net, "sampler": PerRank(ShuffledSampler(12, 0))}, per_rank="drop")  # left alone
    one = ck.restore(per_rank=1)  # one saved rank's, chosen
    assert one["sampler"] == _res(runs, "first", 1)["sampler_at_save"]
    with pytest.raises(CheckpointError, match="no per-rank section of rank 5"):
        ck.restore(per_rank=5)


def test_a_single_process_saves_rng_when_asked(tmp_path: Path) -> None:
    ck = Checkpointer(tmp_path / "s", rng=True, preemption=None, progress=False)
    torch.manual_seed(3)
    random.seed(3)
    ck.save({"w": torch.ones(4), "step": 1}, block=True)
    want = (torch.rand(3), random.random())
    torch.manual_seed(0)
    random.seed(0)
    ck.restore(rng=True)
    assert torch.equal(torch.rand(3), want[0]) and random.random() == want[1]
    plain = Checkpointer(tmp_path / "p", preemption=None, progress=False)  # default in one process: no RNG
    plain.save({"w": torch.ones(4), "step": 1}, block=True)
    assert "per_rank" not in plain.manifest()
    with pytest.raises(CheckpointError, match="no per-rank sections"):
        plain.restore(rng=True)


def test_per_rank_values_come_back_where_they_were(tmp_path: Path) -> None:
    # anywhere in the state: nested in dicts, in lists and tuples, or the whole state
    ck = Checkpointer(tmp_path / "s", preemption=None, progress=False)
    sampler = ShuffledSampler(12, seed=4)
    sampler.batch(7)
    state = {
        "a": {"b": PerRank(torch.arange(5)), "c": 1},
        "l": [1, PerRank({"pos": 3}), (PerRank("x"), 2)],
        "sampler": PerRank(sampler),
        "step": 2,
    }
    ck.save(state, block=True)
    shared = ck.manifest()["shards"][0]
    assert not any(n.startswith("a/b") for n in shared["leaves"])  # not in the shared state
    got = ck.restore()
    assert torch.equal(got["a"]["b"], torch.arange(5)) and got["a"]["c"] == 1
    assert got["l"] == [1, {"pos": 3}, ("x", 2)]
    fresh = ShuffledSampler(12, seed=0)
    ck.restore(into={"sampler": PerRank(fresh)})
    assert fresh.state_dict() == sampler.state_dict() and fresh.batch(3) == sampler.batch(3)
    whole = Checkpointer(tmp_path / "w", preemption=None, progress=False)
    whole.save(PerRank({"w": torch.ones(3), "step": 1}), step=1, block=True)
    assert torch.equal(whole.restore()["w"], torch.ones(3))
