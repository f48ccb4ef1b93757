"""Benchmark: time from ``%gpu_monitor`` to the first sample of every node, on a machine with 1 and 2 CPUs.

Each row runs in a fresh process whose CPU affinity mask allows only that many CPUs (what ``taskset``, a
container's cpuset or a small Binder pod gives), so its local Ray declares that many CPUs and the default
``%gpu_cluster start --workers 2`` gives the two workers all of them (0.5 CPU each on one CPU, 1 each on
two). The monitor's sampler actors must start on that full node. Columns:

* ``start``: ``Cluster(workers=2).start()`` with default options, seconds (Ray, the workers, gloo);
* ``cpu/worker``: the CPUs each worker got by default;
* ``monitor start``: ``monitor_for(cluster)`` returning (what ``%gpu_monitor`` waits for), seconds;
* ``first sample``: from the call until the aggregator holds a row from every node, seconds ("never" when none
  came within ``--deadline``);
* ``nodes``: nodes sampled / nodes in the cluster, and how many were reported down.

Usage::

    python benchmarks/first_sample.py              # 1 and 2 CPUs (about a minute on 2 cores)
    python benchmarks/first_sample.py --cpus 1     # one row
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def child(deadline: float) -> dict[str, object]:
    """One measurement in this process (its affinity mask already set)."""
    from gpu_notebook import Cluster
    from gpu_notebook.monitor import monitor_for

    t0 = time.monotonic()
    cluster = Cluster(workers=2).start()
    started = time.monotonic() - t0
    try:
        nodes = {n["NodeID"] for n in cluster.ray_nodes()}
        cpus = sum(float(n["Resources"].get("CPU", 0)) for n in cluster.ray_nodes())
        t1 = time.monotonic()
        mon = monitor_for(cluster)
        returned = time.monotonic() - t1
        first: float | None = None
        while time.monotonic() - t1 < deadline:
            have = {node for node, st in mon.aggregator.states() if len(st.buffer)}
            if nodes <= have:
                first = time.monotonic() - t1
                break
            time.sleep(0.02)
        return {
            "cpus": cpus,
            "start_s": started,
            "cpu_per_worker": cluster.group.cpus_per_worker if cluster.group else None,
            "monitor_start_s": returned,
            "first_sample_s": first,
            "sampled": len(set(mon.nodes) & nodes),
            "nodes": len(nodes),
            "down": len(mon.failed_nodes),
        }
    finally:
        cluster.stop()


def run_row(cpus: int, deadline: float) -> dict[str, object]:
    allowed = sorted(os.sched_getaffinity(0))[:cpus]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [sys.executable, __file__, "--child", "--deadline", str(deadline)],
        capture_output=True,
        text=True,
        env=env,
        timeout=deadline + 240,
        preexec_fn=lambda: os.sched_setaffinity(0, allowed),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"the {cpus}-CPU run failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return dict(json.loads(lines[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpus", type=int, action="append", help="CPUs of the simulated machine (repeatable)"
    )
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds to wait for the first sample")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.deadline)), flush=True)
        return 0
    have = len(os.sched_getaffinity(0))
    rows = []
    for cpus in args.cpus or [1, 2]:
        if cpus > have:
            print(f"skipped {cpus} CPUs: this process may use {have}")
            continue
        rows.append(run_row(cpus, args.deadline))

    def s(v: object) -> str:
        return "never" if v is None else f"{float(v):.2f}"  # type: ignore[arg-type]

    print()
    print("| CPUs | start (s) | CPU/worker | monitor start (s) | first sample (s) | nodes sampled / down |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {float(r['cpus']):g} | {s(r['start_s'])} | {r['cpu_per_worker']} | {s(r['monitor_start_s'])} "  # type: ignore[arg-type]
            f"| {s(r['first_sample_s'])} | {r['sampled']}/{r['nodes']} / {r['down']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
