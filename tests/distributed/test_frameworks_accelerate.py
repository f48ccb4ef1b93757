"""An accelerate ``Accelerator`` training loop, as its docs write it, in a ``%%distributed`` cell on 2 gloo ranks.

``Accelerator(cpu=True)`` is what a CPU job under ``torchrun`` needs (plain ``Accelerator()`` on a machine without
an accelerator takes the single-process path there too, checked with torchrun on this machine). It must join the
cell's job: 2 processes, process index = rank, the prepared DataLoader giving each rank its own batches, and
identical weights after the loop.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

N_SAMPLES = 32  # 2 ranks x batch 4 x 4 steps: one epoch, each rank a disjoint half

ACCELERATE_CELL = """%%distributed -o acc
import hashlib

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

seen = []  # the indices this rank's DataLoader fetched: the test's window on the sharding


class RandomDataset(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        seen.append(int(i))
        return self.x[i], self.y[i]


def digest(module):
    return hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in module.state_dict().values())).hexdigest()


accelerator = Accelerator(cpu=True)
model = torch.nn.Linear(8, 1)
before = digest(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
training_dataloader = DataLoader(RandomDataset({n}), batch_size=4, shuffle=True)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2)
loss_function = torch.nn.MSELoss()

model, optimizer, training_dataloader, scheduler = accelerator.prepare(
    model, optimizer, training_dataloader, scheduler
)
steps = 0
for batch in training_dataloader:
    optimizer.zero_grad()
    inputs, targets = batch
    outputs = model(inputs)
    loss = loss_function(outputs, targets)
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    steps += 1
accelerator.wait_for_everyone()

(accelerator.num_processes, accelerator.process_index, accelerator.local_process_index,
 str(accelerator.distributed_type), steps, sorted(seen), before, digest(accelerator.unwrap_model(model)))
"""


def test_an_accelerate_loop_joins_the_cells_job(ip, shared):
    res = ip.run_cell(ACCELERATE_CELL.format(n=N_SAMPLES))
    assert res.success, res.error_in_exec and "\n".join(res.error_in_exec._render_traceback_())
    (n0, p0, l0, kind0, steps0, seen0, b0, d0), (n1, p1, l1, kind1, steps1, seen1, b1, d1) = ip.user_ns["acc"]
    assert (n0, n1) == (2, 2)  # accelerate's world is the cell's
    assert (p0, p1) == (0, 1) and (l0, l1) == (0, 1)  # its process indices are the ranks
    assert kind0 == kind1 == "DistributedType.MULTI_CPU"
    assert steps0 == steps1 == N_SAMPLES // 2 // 4  # the batches were split between the ranks
    # each rank trained on its own half of the data: disjoint, together the whole dataset
    assert len(seen0) == len(seen1) == N_SAMPLES // 2
    assert set(seen0).isdisjoint(seen1) and set(seen0) | set(seen1) == set(range(N_SAMPLES))
    assert d0 == d1  # DDP kept the two replicas identical
    assert d0 != b0 and d1 != b1  # ...and they did train
