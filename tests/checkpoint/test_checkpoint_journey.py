"""A checkpointed DDP run the way a notebook user runs it: ``%load_ext gpu_notebook``, the shared 2-rank cluster,
``Checkpointer`` on its default options inside ``%%distributed`` cells, and the joins where features meet: a
rewind (restore an older step and train on) followed by a spot preemption notice (the fake metadata service), then
a resume in a fresh ``Checkpointer``, and ``%gpu_checkpoint list`` / ``gc`` from the notebook.

The resume must continue the live branch (the steps trained after the rewind, up to the preemption save), never the
abandoned steps it rewound from; every rank must get back its own random state; and gc must keep the live branch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

SETUP = """%%distributed
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from gpu_notebook.checkpoint import Checkpointer, PreemptionWatcher

torch.manual_seed(0)  # the same weights on every rank
# a weight of 2 MiB and its two AdamW moments: big enough to be spread, each rank saving its share
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 1024), torch.nn.Linear(1024, 512)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(100 + rank)  # then each rank its own random stream (dropout masks, augmentation...)


def train_step():
    x = torch.randn(16, 8)  # this rank's own draw
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


def weights():
    return [p.detach().clone() for p in model.module.parameters()]
"""

FIRST_RUN = """%%distributed
ck = Checkpointer({store!r})
for step in range(1, 7):  # steps 1-6: the run that is rewound from
    train_step()
    ck.save({{"model": model.module, "optim": opt, "step": step}}, step, block=True)
ck.close()
"""

REWIND = """%%distributed -o rewound
import time

watcher = PreemptionWatcher("aws", url={url!r}, interval_s=0.05)
ck = Checkpointer({store!r}, preemption=watcher)
state = ck.restore(step=3, into={{"model": model.module, "optim": opt}})
assert state["step"] == 3
train_step()
ck.save({{"model": model.module, "optim": opt, "step": 4}}, 4, block=True)
train_step()
deadline = time.monotonic() + 60
while watcher.notice is None and time.monotonic() < deadline:  # this node's watcher saw it
    time.sleep(0.05)
saved = ck.maybe_save({{"model": model.module, "optim": opt, "step": 5}}, 5)  # no policy: the notice saves
ck.close()
after = torch.rand(3)  # what each rank draws next: a resume must draw the same
(saved is not None, ck.preempted is not None, weights(), after)
"""

RESUME = """%%distributed -o resumed
torch.manual_seed(12345)  # a fresh process would start from anywhere: the checkpoint must set it
ck = Checkpointer({store!r})
state = ck.restore(into={{"model": model.module, "optim": opt}}, rng=True)  # and this rank's own RNG states
(state["step"], weights(), torch.rand(3))
"""


def _ok(res: Any) -> None:
    assert res.success, res.error_in_exec and "\n".join(res.error_in_exec._render_traceback_())


def test_rewind_then_preemption_then_resume(ip: Any, shared: Any, tmp_path: Path, capsys: Any) -> None:
    import torch

    from gpu_notebook.testing.cloud_metadata import FakeMetadataServer

    store = str(tmp_path / "ckpt")
    _ok(ip.run_cell(SETUP))
    _ok(ip.run_cell(FIRST_RUN.format(store=store)))
    from gpu_notebook.checkpoint import Checkpointer

    first = Checkpointer(store, rank=0, world_size=2, preemption=None, current=False).manifest()
    shares = {p["rank"]: p["raw_bytes"] for p in first["stats"]["ranks"]}
    assert shares[1] > 2**20, shares  # the default save is spread: rank 1 copied and encoded its share
    with FakeMetadataServer("aws") as md:
        md.preempt()  # the notice is there when the rewound run reaches step 5: it saves then and stops
        _ok(ip.run_cell(REWIND.format(store=store, url=md.url)))
    rewound = ip.user_ns["rewound"]
    assert [r[:2] for r in rewound] == [(True, True), (True, True)]
    _ok(ip.run_cell(RESUME.format(store=store)))
    resumed = ip.user_ns["resumed"]
    for rank in (0, 1):
        step, w, nxt = resumed[rank]
        assert step == 5  # the live branch's preemption save, not the abandoned step 6 it rewound from
        assert all(torch.equal(a, b) for a, b in zip(w, rewound[rank][2], strict=True))
        assert torch.equal(nxt, rewound[rank][3]), f"rank {rank} did not get its own random state back"
    assert not torch.equal(resumed[0][2], resumed[1][2])  # the ranks' streams differ
    capsys.readouterr()
    _ok(ip.run_cell(f"%gpu_checkpoint list --store {store}"))
    listing = capsys.readouterr().out
    assert "abandoned" in listing and "live" in listing, (
        listing
    )  # the steps rewound from, and the live branch
    _ok(ip.run_cell(f"%gpu_checkpoint gc --store {store} --keep 2 --grace 0"))
    again = ip.run_cell(RESUME.format(store=store))
    _ok(again)
    assert [r[0] for r in ip.user_ns["resumed"]] == [5, 5]
