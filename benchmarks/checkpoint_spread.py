"""Replicated DDP saves, rank 0 alone against spread over the ranks: what a save takes from each rank.

Two real gloo ranks (torch.multiprocessing spawn, one torch thread each, as torchrun's ``OMP_NUM_THREADS=1``)
train the same MLP with AdamW under DistributedDataParallel. At every round both Checkpointers save the same
state into their own stores, in alternating order (interleaved: the two modes see the same disturbances):
``spread=False`` (rank 0 copies and encodes the whole state, the other ranks only their RNG states) and the
default, spread (each rank copies and encodes its share of the big tensors; rank 0 commits). From each manifest's
per-rank stats: the training stall of the save (the slowest rank's: at the next collective every rank waits for
it), set against one plain host copy of the whole state (``clone()`` of every tensor); the CPU time of rank 0's
save and of the busiest rank's; the time from ``save()`` to the commit; and the bytes written (the same in both).

Run: ``python benchmarks/checkpoint_spread.py`` (about a minute on 2 cores); ``--quick`` for a smoke run,
``--width`` for the state's size, ``--json`` to also write the measurements. Numbers are wall-clock on whatever
machine runs it; rerun before quoting them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _checkpoint_runs import host_copy_s, med, ratios, spread  # noqa: E402

MODES = ("rank 0 alone", "spread")


def _model(width: int) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(0)  # the same weights on every rank
        return torch.nn.Sequential(
            torch.nn.Linear(width, 2 * width),
            torch.nn.GELU(),
            torch.nn.LayerNorm(2 * width),
            torch.nn.Linear(2 * width, width),
            torch.nn.Linear(width, 2 * width),
            torch.nn.GELU(),
            torch.nn.Linear(2 * width, width),
        )


def _rank(rank: int, world: int, root: str, width: int, rounds: int) -> None:
    import torch.distributed as dist

    from gpu_notebook.checkpoint import Checkpointer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/init", rank=rank, world_size=world)
    try:
        model = torch.nn.parallel.DistributedDataParallel(_model(width))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(rank)
        opts = {"progress": False, "preemption": None, "full_every": 10}
        cks = {
            "rank 0 alone": Checkpointer(f"{root}/alone", spread=False, **opts),
            "spread": Checkpointer(f"{root}/spread", **opts),
        }
        out: dict[str, Any] = {m: [] for m in MODES}
        for i in range(rounds):
            loss = model(torch.randn(8, width, generator=gen)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            state = {"model": model.module, "optim": opt, "step": i}
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                t0 = time.perf_counter()
                info = cks[mode].save(state, block=True).result()
                took = time.perf_counter() - t0
                if rank == 0 and info is not None:
                    st = info.extra["stats"]
                    out[mode].append({"commit_s": took, "new": info.new_bytes, "base": info.is_base, **st})
            dist.barrier()
        if rank == 0:
            tensors = [t for t in model.module.state_dict().values()]
            tensors += [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
            out["state_bytes"] = sum(t.numel() * t.element_size() for t in tensors)
            out["host_copy_s"] = host_copy_s(tensors, 5)
            Path(f"{root}/out.json").write_text(json.dumps(out))
        for ck in cks.values():
            ck.close()
    finally:
        dist.destroy_process_group()


def measure(width: int, rounds: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gnb-bench-spread-") as root:
        mp.spawn(_rank, args=(2, root, width, rounds), nprocs=2, join=True)
        return json.loads(Path(f"{root}/out.json").read_text())


def _per_save(saves: list[dict[str, Any]], key: str, how: Any) -> list[float]:
    """Per save (deltas only: bases are rarer, and larger), ``how`` over the ranks' ``key``."""
    return [how(r[key] for r in s["ranks"]) for s in saves if not s["base"]]


def _first(xs: Any) -> float:
    return float(next(iter(xs)))  # (rank 0's: the ranks' stats are listed rank 0 first)


def table(res: dict[str, Any]) -> str:
    a, s = res["rank 0 alone"], res["spread"]
    rows = [
        ("training stall per save (the slowest rank's)", "stall_s", max),
        ("CPU time of rank 0's save", "cpu_s", _first),
        ("CPU time of the busiest rank's save", "cpu_s", max),
        ("CPU time of the save, all ranks", "cpu_s", sum),
    ]
    out = [
        f"| 2 gloo ranks, replicated state of {res['state_bytes'] / 1e6:.0f} MB, a delta save | rank 0 alone | "
        "spread | spread / alone |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, key, how in rows:
        xa, xs = _per_save(a, key, how), _per_save(s, key, how)
        out.append(f"| {name} | {_ms(xa)} | {_ms(xs)} | {spread(ratios(xs, xa), '{:.2f}', 'x')} |")
    xa, xs = ([x["commit_s"] for x in m if not x["base"]] for m in (a, s))
    out.append(
        f"| time from save() to the commit | {_ms(xa)} | {_ms(xs)} | {spread(ratios(xs, xa), '{:.2f}', 'x')} |"
    )
    out.append(f"| one host copy of the whole state (`clone()`) | {_ms(res['host_copy_s'])} | | |")
    ba, bs = ([x["new"] for x in m if not x["base"]] for m in (a, s))
    out.append(
        f"| bytes written per delta save | {med(ba) / 1e6:.2f} MB | {med(bs) / 1e6:.2f} MB | "
        f"{med(bs) / med(ba):.3f}x |"
    )
    return "\n".join(out)


def _ms(xs: list[float]) -> str:
    return spread([1e3 * x for x in xs], "{:.1f}", " ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller state, fewer saves (smoke run)")
    ap.add_argument("--width", type=int, default=1024, help="the MLP's width (1024: a state of about 100 MB)")
    ap.add_argument("--json", help="also write the measurements to this JSON file")
    args = ap.parse_args()
    width, rounds = (512, 4) if args.quick else (args.width, 15)
    t0 = time.time()
    res = measure(width, rounds)
    print(table(res))
    print(f"\n1 torch thread per rank, {os.cpu_count()} CPUs, {time.time() - t0:.0f} s total")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
