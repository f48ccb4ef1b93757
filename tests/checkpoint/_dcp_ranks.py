"""Real gloo ranks for tests/checkpoint/test_dcp.py: FSDP2 (``fully_shard``) states saved with ``dcp.save`` and
``dcp.async_save`` through DCPWriter at one world size, loaded with ``dcp.load`` through DCPReader at another.

``python _dcp_ranks.py save|load WORLD STORE WORKDIR``: torch is imported once here, then the ranks are forked
(each joins a gloo group through a file store in WORKDIR). ``save`` writes WORKDIR/ref{1,2}.pt (the full weights
of each save, from rank 0, before sharding) and WORKDIR/save.json (the bytes each commit wrote); ``load`` checks
every weight bit-exact against them, for the latest commit and for the first one. ``single`` loads the latest
commit into a plain (unsharded) model in one process, ``no_dist=True``.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from gpu_notebook.checkpoint.dcp import DCPReader, DCPWriter


def model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(48, 96), nn.ReLU(), nn.Linear(96, 96), nn.ReLU(), nn.Linear(96, 7))


def sharded(seed: int, world: int) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    m = model(seed)
    mesh = init_device_mesh("cpu", (world,))
    for layer in m:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    return m


def bump(m: nn.Module) -> None:
    """The second save's change: the first layer's weight only, elementwise (the same on any sharding)."""
    with torch.no_grad():
        w = m[0].weight
        (w.to_local() if hasattr(w, "to_local") else w).mul_(1.001)


def save(rank: int, world: int, store: str, work: str) -> None:
    full = model(0)
    if rank == 0:
        torch.save({k: v.clone() for k, v in full.state_dict().items()}, os.path.join(work, "ref1.pt"))
        bump(full)
        torch.save({k: v.clone() for k, v in full.state_dict().items()}, os.path.join(work, "ref2.pt"))
    m = sharded(0, world)
    assert type(m[0].weight).__name__ == "DTensor"
    writer = DCPWriter(store)  # kept across saves: the second one is a delta
    state = {"model": m.state_dict(), "step": 3, "extra": torch.arange(10.0)}
    dcp.save(state, storage_writer=writer, checkpoint_id="first")
    first = writer.last_commit
    bump(m)
    state = {"model": m.state_dict(), "step": 4, "extra": torch.arange(10.0)}
    dcp.async_save(state, storage_writer=writer, checkpoint_id="second").result()
    second = writer.last_commit
    if rank == 0:
        assert first is not None and second is not None
        with open(os.path.join(work, "save.json"), "w") as f:
            json.dump(
                {
                    "first": [first.seq, first.written_bytes, first.logical_bytes],
                    "second": [second.seq, second.written_bytes, second.logical_bytes],
                },
                f,
            )


def check(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor], what: str) -> None:
    assert sorted(got) == sorted(ref), (what, sorted(got), sorted(ref))
    for k, v in ref.items():
        assert got[k].dtype == v.dtype and torch.equal(got[k], v), f"{what}: {k} differs"


def load(rank: int, world: int, store: str, work: str) -> None:
    for label, ref_file, step in (("second", "ref2.pt", 4), ("first", "ref1.pt", 3)):
        m = sharded(1, world)  # other weights: everything must come from the checkpoint
        state = {"model": m.state_dict(), "step": 0, "extra": torch.zeros(10)}
        dcp.load(state, storage_reader=DCPReader(store, label=label))
        m.load_state_dict(state["model"])
        full = {k: v.full_tensor() for k, v in m.state_dict().items()}  # an all-gather: every rank takes part
        assert state["step"] == step and torch.equal(state["extra"], torch.arange(10.0)), state
        if rank == 0:
            check(full, torch.load(os.path.join(work, ref_file)), f"{label} at world size {world}")


def single(store: str, work: str) -> None:
    m = model(2)
    state = {"model": m.state_dict(), "step": 0, "extra": torch.zeros(10)}
    dcp.load(state, storage_reader=DCPReader(store), no_dist=True)
    m.load_state_dict(state["model"])
    check(m.state_dict(), torch.load(os.path.join(work, "ref2.pt")), "one process, no_dist")
    assert state["step"] == 4


def _rank(fn: str, rank: int, world: int, store: str, work: str) -> None:
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{os.path.join(work, 'rdzv-' + fn)}", rank=rank, world_size=world
        )
        globals()[fn](rank, world, store, work)
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the rank reports whatever failed, then exits non-zero
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
    os._exit(0)


def main() -> int:
    fn, world, store, work = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if fn == "single":
        single(store, work)
        print("single ok")
        return 0
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_rank, args=(fn, r, world, store, work)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    print(f"{fn} at world size {world}: exit codes {codes}")
    return 0 if codes == [0] * world else 1


if __name__ == "__main__":
    sys.exit(main())
