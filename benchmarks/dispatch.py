"""Dispatch latency and DDP throughput: %%distributed against the tools users run today.

Prints, from one run on this machine, the median time of a trivial distributed cell (an all_reduce of one
tensor on 2 workers) for:
  * gpu_notebook %%distributed, warm (persistent workers; what a notebook user waits for per cell)
  * Ray Train ``TorchTrainer.fit`` with the same function (builds its worker group on every call)
  * accelerate ``notebook_launcher`` (forks 2 processes per call; no state kept)
  * ipyparallel ``%px`` on 2 engines (no process group at all: a floor)
plus the time from ``%gpu_cluster start`` to the first finished cell, and the training throughput of the same
DDP loop under ``%%distributed`` and under ``torchrun --nproc_per_node 2`` (ratio, target within 3%).

Usage: .venv/bin/python benchmarks/dispatch.py [--reps 30] [--skip-ray-train]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

CELL = "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n"


def allreduce_fn(config=None):  # the same body for every tool
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def launcher_fn():
    """notebook_launcher sets the torchrun variables but leaves the group to the function (Accelerator does it)."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        return allreduce_fn()
    finally:
        dist.destroy_process_group()


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def bench_ours(reps: int) -> dict[str, float]:
    from gpu_notebook import Cluster

    t0 = time.perf_counter()
    cluster = Cluster(name="bench", workers=2, cpus_per_worker=0.5).start()
    res = cluster.run(CELL, stream=False)
    assert res.ok and list(res.values) == [2.0, 2.0], res.failures
    start_to_first = time.perf_counter() - t0
    for _ in range(3):
        cluster.run(CELL, stream=False)
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        cluster.run(CELL, stream=False)
        samples.append(time.perf_counter() - t)
    return {"cluster": cluster, "warm_ms": median_ms(samples), "start_to_first_s": start_to_first}


def bench_cold_start() -> float:
    """Seconds from ``%gpu_cluster start`` to the first finished cell in a fresh process (Ray start included)."""
    code = textwrap.dedent(
        f"""
        import time
        t0 = time.perf_counter()
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "gpu_notebook")
        ip.run_line_magic("gpu_cluster", "start --workers 2")
        res = ip.run_cell({("%%distributed --no-stream" + chr(10) + CELL)!r})
        assert res.success
        print("COLD", time.perf_counter() - t0)
        ip.run_line_magic("gpu_cluster", "stop")
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    for line in proc.stdout.splitlines():
        if line.startswith("COLD"):
            return float(line.split()[1])
    raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])


def bench_ray_train(reps: int) -> float:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage = tempfile.mkdtemp(prefix="gnb-bench-train-")
    samples = []
    for i in range(reps):
        trainer = TorchTrainer(
            allreduce_fn,
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name=f"bench{i}", storage_path=storage),
        )
        t = time.perf_counter()
        trainer.fit()
        samples.append(time.perf_counter() - t)
    return median_ms(samples)


def bench_notebook_launcher(reps: int) -> float:
    code = textwrap.dedent(
        f"""
        import time, statistics, sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from accelerate import notebook_launcher
        from dispatch import launcher_fn
        samples = []
        for _ in range({reps}):
            t = time.perf_counter()
            notebook_launcher(launcher_fn, (), num_processes=2, use_port="29533")
            samples.append(time.perf_counter() - t)
        print("MEDIAN", statistics.median(samples) * 1000)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, ACCELERATE_USE_CPU="1", CUDA_VISIBLE_DEVICES=""))
    for line in proc.stdout.splitlines():
        if line.startswith("MEDIAN"):
            return float(line.split()[1])
    raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])


def bench_ipyparallel(reps: int) -> float:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=2, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        view = rc[:]
        view.block = True
        view.execute("import torch; t = torch.ones(1)")
        for _ in range(3):
            view.execute("t.add_(0); x = t.item()")
        samples = []
        for _ in range(reps):
            t = time.perf_counter()
            view.execute("t.add_(0); x = t.item()")  # what %px does
            samples.append(time.perf_counter() - t)
        return median_ms(samples)
    finally:
        cluster.stop_cluster_sync()


TRAIN_SCRIPT = textwrap.dedent(
    """
    import os, time, torch, torch.distributed as dist
    def main(steps=STEPS):
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
            torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x, y = torch.randn(64, 256), torch.randn(64, 1)
        for i in range(steps + 10):
            if i == 10:
                dist.barrier(); t0 = time.perf_counter()
            opt.zero_grad(); torch.nn.functional.mse_loss(model(x), y).backward(); opt.step()
        dist.barrier()
        rate = steps * 64 * dist.get_world_size() / (time.perf_counter() - t0)
        if dist.get_rank() == 0:
            print(f"THROUGHPUT {rate:.1f}")
        dist.destroy_process_group()
        return rate
    if __name__ == "__main__":
        main()
    """
)


def bench_ddp(cluster, steps: int, rounds: int) -> tuple[float, float]:
    script = TRAIN_SCRIPT.replace("STEPS", str(steps))
    path = os.path.join(tempfile.mkdtemp(prefix="gnb-bench-"), "train.py")
    with open(path, "w") as f:
        f.write(script)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    ours, theirs = [], []
    for _ in range(rounds):  # interleave, so load changes on the machine hit both alike
        res = cluster.run(script + "\nmain()\n", stream=False)
        assert res.ok, res.failures
        ours.append(res.values[0])
        proc = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", "29544", path],
                              capture_output=True, text=True, timeout=600)
        rate = [float(ln.split()[1]) for ln in proc.stdout.splitlines() if ln.startswith("THROUGHPUT")]
        if not rate:
            raise RuntimeError(proc.stderr[-2000:])
        theirs.append(rate[0])
    return statistics.median(ours), statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--train-reps", type=int, default=2, help="TorchTrainer.fit calls (each takes ~40 s)")
    parser.add_argument("--skip-ray-train", action="store_true")
    parser.add_argument("--steps", type=int, default=150, help="DDP training steps per throughput round")
    args = parser.parse_args()

    cold = bench_cold_start()
    print(f"  start -> first cell: {cold:.1f} s", flush=True)
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows: list[tuple[str, float]] = []
    ours = bench_ours(args.reps)
    rows.append(("gpu_notebook %%distributed (warm)", ours["warm_ms"]))
    print(f"  ours: {ours['warm_ms']:.2f} ms", flush=True)
    rows.append(("ipyparallel %px (no process group: floor)", bench_ipyparallel(args.reps)))
    print(f"  ipyparallel: {rows[-1][1]:.2f} ms", flush=True)
    rows.append(("accelerate notebook_launcher", bench_notebook_launcher(max(3, args.reps // 6))))
    print(f"  notebook_launcher: {rows[-1][1]:.2f} ms", flush=True)
    if not args.skip_ray_train:
        rows.append(("Ray Train TorchTrainer.fit", bench_ray_train(args.train_reps)))
        print(f"  TorchTrainer.fit: {rows[-1][1]:.0f} ms", flush=True)
    ddp_ours, ddp_torchrun = bench_ddp(ours["cluster"], args.steps, rounds=3)
    ours["cluster"].stop()

    base = rows[0][1]
    print()
    print(f"Trivial distributed cell (all_reduce of one tensor, 2 workers), median of {args.reps}")
    print(f"{'tool':<44} {'median':>12} {'vs %%distributed':>18}")
    for name, ms in rows:
        print(f"{name:<44} {ms:>9.2f} ms {ms / base:>17.1f}x")
    print()
    print(f"%gpu_cluster start -> first finished cell, fresh kernel: {cold:.1f} s (local Ray start included); "
          f"on an already running Ray: {ours['start_to_first_s']:.1f} s")
    print()
    print("DDP training throughput (same loop, 2 CPU workers, gloo; median of 3 interleaved rounds)")
    print(f"{'%%distributed':<20} {ddp_ours:>10.0f} samples/s")
    print(f"{'torchrun':<20} {ddp_torchrun:>10.0f} samples/s")
    print(f"ratio %%distributed / torchrun: {ddp_ours / ddp_torchrun:.3f}")


if __name__ == "__main__":
    main()
