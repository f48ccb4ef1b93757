"""A Lightning ``Trainer(strategy="ddp", devices=2)`` fit, as its docs write it, in a ``%%distributed`` cell.

Under torchrun Lightning sees that the processes were launched for it and joins them; it must do the same here:
no re-launch of the "script" as subprocesses, global rank = the cell's rank, world size 2, its
``DistributedSampler`` giving each rank its own half of the data, and identical weights after the fit.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

N_SAMPLES = 32  # 2 ranks x batch 4 x 4 steps: one epoch, each rank a disjoint half

LIGHTNING_CELL = """%%distributed -o lit
import hashlib
import os

import lightning as L
import torch
import torch.nn.functional as F
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


class LitRegressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def digest(module):
    return hashlib.sha256(b"".join(t.detach().cpu().numpy().tobytes() for t in module.state_dict().values())).hexdigest()


model = LitRegressor()
before = digest(model)
trainer = L.Trainer(
    accelerator="cpu",
    strategy="ddp",
    devices=2,
    max_steps=4,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    default_root_dir={out!r},
)
trainer.fit(model, DataLoader(RandomDataset({n}), batch_size=4))

(trainer.world_size, trainer.global_rank, trainer.local_rank, trainer.num_devices,
 type(trainer.strategy.cluster_environment).__name__, trainer.global_step, sorted(seen), before, digest(model),
 os.getpid())
"""


def test_a_lightning_ddp_fit_joins_the_cells_job(ip, shared, tmp_path):
    res = ip.run_cell(LIGHTNING_CELL.format(out=str(tmp_path / "lit-out"), n=N_SAMPLES))
    assert res.success, res.error_in_exec and "\n".join(res.error_in_exec._render_traceback_())
    r0, r1 = ip.user_ns["lit"]
    (w0, g0, l0, dev0, env0, steps0, seen0, b0, d0, pid0) = r0
    (w1, g1, l1, dev1, env1, steps1, seen1, b1, d1, pid1) = r1
    assert (w0, w1) == (2, 2)  # Lightning's world is the cell's
    assert (g0, g1) == (0, 1) and (l0, l1) == (0, 1)  # its global and local ranks are the cell's
    assert dev0 == dev1 == 2
    # torchrun's rank processes are a TorchElasticEnvironment to Lightning (checked with torchrun on this machine)
    assert env0 == env1 == "TorchElasticEnvironment"
    # it took the "launched externally" path (torchrun's): trained in the rank processes themselves
    assert [pid0, pid1] == [w.pid for w in shared.status().workers]
    assert steps0 == steps1 == 4
    # each rank trained on its own half of the data: disjoint, together the whole dataset
    assert len(seen0) == len(seen1) == N_SAMPLES // 2
    assert set(seen0).isdisjoint(seen1) and set(seen0) | set(seen1) == set(range(N_SAMPLES))
    assert d0 == d1  # DDP kept the two replicas identical
    assert d0 != b0 and d1 != b1  # ...and they did train
