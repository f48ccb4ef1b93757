"""A ``torch.distributed.run``-style training script, pasted unchanged into a ``%%distributed`` cell on 2 ranks.

The script does what a torchrun script does: ``init_process_group("gloo")`` from the environment, a
``DistributedSampler`` to shard the data, ``DistributedDataParallel``, and ``destroy_process_group()`` at the end.
It must join the cell's job (rank and world size from the environment), each rank must train on its own half of
the data, the replicas must stay identical, and the group must still work for the next cell.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

N_SAMPLES = 32  # 2 ranks x batch 4 x 4 steps: one epoch, each rank a disjoint half

SCRIPT = """
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

seen = []  # the indices this rank trained on: the test's window on the sharding
report = None


def digest(module):
    return hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in module.state_dict().values())).hexdigest()


def main():
    global report
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])

    g = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.arange({n}), torch.randn({n}, 8, generator=g), torch.randn({n}, 1, generator=g))
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)

    model = torch.nn.Linear(8, 1)
    before = digest(model)
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    loss_fn = torch.nn.MSELoss()

    steps = 0
    for epoch in range(1):
        sampler.set_epoch(epoch)
        for idx, x, y in loader:
            seen.extend(idx.tolist())
            optimizer.zero_grad()
            loss = loss_fn(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            steps += 1

    report = (world_size, rank, local_rank, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), steps,
              sorted(seen), before, digest(model))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


def test_a_torchrun_training_script_joins_the_cells_job(ip, shared):
    res = ip.run_cell("%%distributed\n" + SCRIPT.format(n=N_SAMPLES))
    assert res.success, res.error_in_exec and "\n".join(res.error_in_exec._render_traceback_())
    res = ip.run_cell("%%distributed -o rep\nreport\n")
    assert res.success, res.error_in_exec
    first, second = ip.user_ns["rep"]
    (w0, r0, l0, er0, ew0, steps0, seen0, b0, d0) = first
    (w1, r1, l1, er1, ew1, steps1, seen1, b1, d1) = second
    assert (w0, w1) == (2, 2) and (ew0, ew1) == (2, 2)  # the script's world is the cell's
    assert (r0, r1) == (0, 1) and (er0, er1) == (0, 1) and (l0, l1) == (0, 1)
    assert steps0 == steps1 == N_SAMPLES // 2 // 4  # the steps were split between the ranks
    # each rank trained on its own half of the data: disjoint, together the whole dataset
    assert len(seen0) == len(seen1) == N_SAMPLES // 2
    assert set(seen0).isdisjoint(seen1) and set(seen0) | set(seen1) == set(range(N_SAMPLES))
    assert d0 == d1  # DDP kept the two replicas identical
    assert d0 != b0 and d1 != b1  # ...and they did train
    # destroy_process_group() ended the script, not the cell's job: the next cell still has its group
    res = ip.run_cell(
        "%%distributed -o after\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); (dist.get_world_size(), t.item())\n"
    )
    assert res.success and list(ip.user_ns["after"]) == [(2, 2.0), (2, 2.0)]
