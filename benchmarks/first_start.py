"""Benchmark: how long a fresh kernel waits for ``%gpu_cluster start --workers 2``, against Ray's own start.

Every measurement runs in a fresh Python process, as in a fresh kernel, and the kinds take turns (interleaved
rounds, the order rotated each round), each round under ``flock /tmp/gnb-ray.lock`` (other Ray users of this
machine take the same lock, so no two local Rays start at once). Rows:

* ``(a) ray.init()``: ``import ray`` and a bare local ``ray.init(address="local", num_cpus=N)`` (N: the CPUs
  our start gives Ray), from before the import until it returns; Ray's defaults otherwise (its dashboard when
  ``ray[default]`` is installed, idle workers prestarted for the first driver);
* ``(b) gpu_notebook``: ``%load_ext gpu_notebook`` and ``%gpu_cluster start --workers 2`` in a real IPython
  ``InteractiveShell`` (made before the clock starts, as a kernel's is), from the ``%load_ext`` until the magic
  returns with the gloo group formed; split by the start's progress lines (before Ray starts, Ray's start, the
  reservation and worker processes, the torch.distributed group), then the first ``%%distributed`` cell done (a
  ``get_world_size``, checked to be 2 on both ranks);
* ``(c) nbdistributed``: ``%load_ext nbdistributed`` and ``%dist_init -n 2``: when the magic returns (after its
  fixed 2 s wait) and when both ranks answer a cell (its first cell is dropped when sent before the workers
  joined, so the cell is retried every 0.5 s); skipped with the reason when it is not installed.

``--baseline-tree DIR`` adds ``(b0)``: the same start from another checkout of the package (a ``git worktree``
of an older commit), interleaved with the others, for a before/after in one sitting; ``--tree DIR`` times
``(b)`` from another checkout too (one that does not change while the benchmark runs).

Usage::

    .venv/bin/python benchmarks/first_start.py               # 3 rounds (about 2 minutes on 2 cores)
    .venv/bin/python benchmarks/first_start.py --quick       # 1 round
    .venv/bin/python benchmarks/first_start.py --baseline-tree /tmp/gnb-old --rounds 5
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

WORKERS = 2
#: the start's progress lines that end one stage and begin the next, in order
MARKS = ("starting a local Ray cluster", "reserving resources", "initialising torch.distributed")
#: the stages between ``%load_ext``, those lines and the start's return
STAGES = ("before Ray starts", "Ray's start", "reserve + worker processes", "torch.distributed group")


class _Lines:
    """A stdout that keeps each line with the time it was written (the start's progress lines)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self._part = ""

    def write(self, text: str) -> int:
        self._part += text
        while "\n" in self._part:
            line, self._part = self._part.split("\n", 1)
            self.lines.append((time.monotonic(), line))
        return len(text)

    def flush(self) -> None:
        pass


@contextlib.contextmanager
def _captured() -> Iterator[_Lines]:
    out, real = _Lines(), sys.stdout
    sys.stdout = out  # type: ignore[assignment]
    try:
        yield out
    finally:
        sys.stdout = real


def child_ray(cpus: int) -> dict[str, Any]:
    t0 = time.monotonic()
    import ray

    t1 = time.monotonic()
    ray.init(address="local", num_cpus=cpus)
    t2 = time.monotonic()
    ray.shutdown()
    return {"ready": t2 - t0, "import ray": t1 - t0, "ray.init": t2 - t1}


def child_ours() -> dict[str, Any]:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    with _captured() as out:
        t0 = time.monotonic()
        shell.run_line_magic("load_ext", "gpu_notebook")
        t_loaded = time.monotonic()
        shell.run_line_magic("gpu_cluster", f"start --workers {WORKERS}")
        t_ready = time.monotonic()
        shell.run_cell_magic(
            "distributed", "", "import torch.distributed as dist\nws = dist.get_world_size()"
        )
        t_cell = time.monotonic()
        from gpu_notebook import get_manager  # loaded by the %load_ext: no cost to the figures above

        world = get_manager().require_current().run("ws", stream=False).values
    row: dict[str, Any] = {"ready": t_ready - t0, "first cell": t_cell - t0, "load_ext": t_loaded - t0}
    marks = [t0, *(next((t for t, ln in out.lines if key in ln), None) for key in MARKS), t_ready]
    for stage, begin, end in zip(STAGES, marks, marks[1:], strict=False):
        if begin is not None and end is not None:
            row[stage] = end - begin
    if not any("ready in" in ln for _, ln in out.lines):
        raise SystemExit("the start printed no 'ready' line:\n" + "\n".join(ln for _, ln in out.lines))
    row["world size"] = list(world)
    shell.run_line_magic("gpu_cluster", "stop")
    return row


def child_nbdistributed() -> dict[str, Any]:
    # its workers are started as "python worker.py": the first python on PATH must be this one
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    with _captured():
        t0 = time.monotonic()
        shell.run_line_magic("load_ext", "nbdistributed")
        shell.run_line_magic("dist_init", f"-n {WORKERS}")
        t_returned = time.monotonic()
        magic = shell.magics_manager.registry["DistributedMagic"]
        try:
            while True:
                try:
                    magic._comm_manager.send_to_all("execute", "rank", timeout=0.5)
                    break
                except TimeoutError:
                    if time.monotonic() - t0 > 120:
                        raise
            t_answer = time.monotonic()
        finally:
            shell.run_line_magic("dist_shutdown", "")
    return {"ready": t_answer - t0, "%dist_init returned": t_returned - t0}


def _child(kind: str, cpus: int) -> dict[str, Any]:
    if kind == "ray":
        return child_ray(cpus)
    if kind == "nbdistributed":
        return child_nbdistributed()
    return child_ours()


@contextlib.contextmanager
def _lock(path: str) -> Iterator[None]:
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure(kind: str, cpus: int, tree: str | None = None) -> dict[str, Any]:
    """One measurement of ``kind`` in a fresh process; ``tree``: the checkout its gpu_notebook comes from."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if tree:
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, __file__, "--child", kind, "--cpus", str(cpus)]
    load = os.getloadavg()[0]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=tree or os.getcwd())
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the {kind} run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    row = dict(json.loads(lines[-1]))
    row["load"] = load
    return row


def _stats(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def table(runs: dict[str, list[dict[str, Any]]], skipped: dict[str, str]) -> str:
    """The markdown table: per row the median [min-max] seconds, and a start's ratio to and excess over (a)."""
    ray_ready = statistics.median(r["ready"] for r in runs["ray"]) if runs.get("ray") else None
    out = [
        "| measurement | seconds, median [min-max] | / (a) | - (a), s |",
        "|---|---|---|---|",
    ]

    def row(label: str, values: list[float], compare: bool = False) -> None:
        ratio = excess = ""
        if compare and ray_ready and values:
            med = statistics.median(values)
            ratio, excess = f"{med / ray_ready:.2f}", f"{med - ray_ready:+.2f}"
        out.append(f"| {label} | {_stats(values)} | {ratio} | {excess} |")

    def col(kind: str, key: str) -> list[float]:
        return [float(r[key]) for r in runs.get(kind, []) if key in r]

    row("(a) ray.init(): import + init", col("ray", "ready"))
    row("    import ray", col("ray", "import ray"))
    row("    ray.init", col("ray", "ray.init"))
    for kind, label in (("old", "(b0) gpu_notebook, baseline tree"), ("ours", "(b) gpu_notebook")):
        if kind not in runs:
            continue
        row(f"{label}: %load_ext to ready", col(kind, "ready"), compare=True)
        for stage in ("load_ext", *STAGES):
            row(f"    {stage}", col(kind, stage))
        row("    then the first %%distributed cell done", col(kind, "first cell"), compare=True)
    if "nbdistributed" in skipped:
        out.append(f"| (c) nbdistributed | not run: {skipped['nbdistributed']} | | |")
    elif runs.get("nbdistributed"):
        row("(c) nbdistributed: %dist_init returned", col("nbdistributed", "%dist_init returned"))
        row("    both ranks answer a cell", col("nbdistributed", "ready"), compare=True)
    return "\n".join(out)


def _nbdistributed_missing() -> str | None:
    try:
        import nbdistributed  # noqa: F401
        import zmq  # noqa: F401
    except ImportError as exc:
        return f"not installed ({exc}); pip install nbdistributed"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one round")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--lock", default="/tmp/gnb-ray.lock", help="flock file per round ('' for none)")
    p.add_argument("--baseline-tree", help="also time the start from this checkout (a worktree of a commit)")
    p.add_argument("--tree", help="time (b) from this checkout instead of the one this script is in")
    p.add_argument("--skip-nbdistributed", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--cpus", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.cpus)), flush=True)
        return
    rounds = 1 if args.quick else args.rounds
    from gpu_notebook.cluster._connect import local_cpus  # not at the top: a child times its own imports

    cpus = local_cpus()
    skipped: dict[str, str] = {}
    kinds = ["ray", "ours"]
    if args.baseline_tree:
        kinds.append("old")
    missing = "skipped (--skip-nbdistributed)" if args.skip_nbdistributed else _nbdistributed_missing()
    if missing:
        skipped["nbdistributed"] = missing
    else:
        kinds.append("nbdistributed")
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(rounds):
        order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        with _lock(args.lock):  # a round at a time: the others' Ray tests wait for one round, not for all
            for kind in order:
                tree = args.baseline_tree if kind == "old" else args.tree if kind == "ours" else None
                row = measure("ours" if kind == "old" else kind, cpus, tree)
                runs[kind].append(row)
                print(f"round {r + 1} {kind}: {row['ready']:.2f} s (load {row['load']:.2f})", file=sys.stderr)
    loads = [row["load"] for rows in runs.values() for row in rows]
    print(
        f"\nFirst start on {cpus} CPUs, {WORKERS} workers, {rounds} round(s) interleaved, a fresh process each; "
        f"1-minute load average before each measurement: {_stats(loads)}"
    )
    print(table(runs, skipped))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpus": cpus, "runs": runs, "skipped": skipped}, f, indent=1)


if __name__ == "__main__":
    main()
