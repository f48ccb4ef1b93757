"""Rank debugger latency: from a pdb command typed at the ``(Pdb rank 1)`` prompt to its answer, next to the round
trips it is made of.

On 2 local gloo workers, rank 1 of a background cell pauses at a ``breakpoint()``; the notebook's side then sends
pdb commands the way the prompt does (:class:`gpu_notebook.distributed._debug.Console`, one control call of the
worker per command) and times each to its answer. For comparison, in the same run:

- the same pdb command on a pdb driven the same way in this process (no Ray, no worker: what the rank itself spends);
- a plain control call of a worker (``ping``): Ray's round trip to the actor, the floor of any remote command;
- ``Cluster.call`` of a function returning 1 on one rank: what a cell's round trip costs, before the pause;
- ``all p rank`` with both ranks paused (two control calls at once).

Run: ``python benchmarks/debugger.py [--repeat N]`` (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from collections.abc import Callable


def _times(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


def _row(name: str, ms: list[float]) -> str:
    ms = sorted(ms)
    p90 = ms[int(0.9 * (len(ms) - 1))]
    return f"| {name} | {statistics.median(ms):.2f} | {p90:.2f} | {ms[-1]:.2f} |"


def _local_session() -> tuple[object, threading.Thread]:
    """A pdb paused in a thread of this process, driven through the same session as a rank's."""
    from gpu_notebook.distributed._debugger import RankDebugger

    dbg = RankDebugger(lambda text: None)
    dbg.install()

    def paused() -> None:
        rank = 1  # noqa: F841 - what "p rank" prints
        breakpoint()

    t = threading.Thread(target=paused, daemon=True)
    t.start()
    while not dbg.is_paused():
        time.sleep(0.01)
    dbg.command(None)
    return dbg, t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200, help="commands timed per row (default 200)")
    n = parser.parse_args().repeat

    from gpu_notebook import Cluster
    from gpu_notebook.distributed._debug import Console

    rows = []
    dbg, thread = _local_session()
    rows.append(
        _row(
            "`p rank` on a pdb in this process (same session, no Ray)",
            _times(lambda: dbg.command("p rank"), n),
        )
    )  # type: ignore[attr-defined]
    dbg.command("c")  # type: ignore[attr-defined]
    thread.join(5)
    sys.breakpointhook = sys.__breakpointhook__

    with Cluster(workers=2, cpus_per_worker=0.5) as c:
        assert c.group is not None
        w = c.group.workers
        import ray

        rows.append(
            _row(
                "a worker's control call (`ping`), Ray's round trip",
                _times(lambda: ray.get(w[1].actor.ping.remote()), n),
            )
        )
        rows.append(
            _row(
                "`Cluster.call(f, ranks=[1])`, a cell's round trip",
                _times(lambda: c.call(lambda: 1, ranks=[1]), max(20, n // 5)),
            )
        )
        bg = c.run("if rank == 1:\n    breakpoint()\n", block=False)
        console = Console(w, [0, 1], write=lambda text: None)
        while not console.paused:
            console.refresh()
            time.sleep(0.05)
        console.send(1, None)
        rows.append(
            _row(
                "**`p rank` typed at `(Pdb rank 1)`** (the prompt's command)",
                _times(lambda: console.send(1, "p rank"), n),
            )
        )
        rows.append(_row("`l` at `(Pdb rank 1)` (11 lines back)", _times(lambda: console.send(1, "l ."), n)))
        console.send(1, "c")
        bg.get(timeout=30)
        bg = c.run("import torch.distributed as dist\ndist.barrier()\nbreakpoint()\n", block=False)
        while len(console.paused) < 2:
            assert not bg.ready(), bg.get()
            console.refresh()
            time.sleep(0.05)
        for r in (0, 1):
            console.send(r, None)
        rows.append(_row("`all p rank`, 2 ranks paused", _times(lambda: console.send_all("p rank"), n)))
        console.send_all("c")
        bg.get(timeout=30)

    print(f"Rank debugger: command to answer, ms over {n} commands (2 local gloo workers)\n")
    print("| what | median | p90 | max |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print(row)


if __name__ == "__main__":
    main()
