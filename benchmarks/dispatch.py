"""Dispatch latency and DDP throughput: %%distributed against the tools users run today.

Prints, from one run on this machine, the median time of a trivial distributed cell (an all_reduce of one
tensor on 2 workers, gloo) for:
  * gpu_notebook ``%%distributed``, warm (persistent workers; what a notebook user waits for per cell)
  * ipyparallel ``%%px`` on 2 engines of an already started ``ipp.Cluster``, blocking view (its defaults), with a
    gloo process group formed on the engines once, so it runs the very same cell
  * accelerate ``notebook_launcher`` (forks 2 processes per call and forms the group in them: its real cost)
  * Ray Train ``TorchTrainer.fit`` with the same function (builds its worker group on every call)
``%%distributed`` and ``%%px`` run as notebook cells through the same IPython shell (magic parsing and output
display included on both sides, output captured), interleaved; every tool gets untimed warm-up calls first.
Alternatives that are not installed are printed as skipped. Also printed: the time from ``%gpu_cluster start`` to
the first finished cell, and the training throughput of the same DDP loop under ``%%distributed`` and under
``torchrun --nproc_per_node 2`` (interleaved rounds, ratio; target within 3%).

With ``--sizes 2,4,8`` it prints instead, per world size, the warm ``%%distributed`` cell, the same cell as
``%%px`` on as many engines, a bare Ray actor round trip to as many actors (``ray.get`` of one trivial call to
each) and the all_reduce itself (timed on the ranks): medians of interleaved runs with their spread (the 10th
to 90th percentile), and the targets (8 workers within 3x round trip + all_reduce; at least 1.8x faster than
``%%px`` at every size). ``--profile`` adds where the driver's time goes in a warm cell at the largest size.

Usage: .venv/bin/python benchmarks/dispatch.py [--quick] [--reps 30] [--skip-ray-train]
       .venv/bin/python benchmarks/dispatch.py --sizes 2,4,8 [--reps 20] [--profile]
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


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _timed_cell(ip, src: str, check: bool = False, world: int = 2) -> float:
    """Run one notebook cell through the shell, output captured (not printed), and return its wall time.

    ``check``: also require that the ranks' value (``world``.0, the all_reduce of ones) was displayed.
    """
    from IPython.utils.capture import capture_output

    with capture_output() as out:
        t = time.perf_counter()
        res = ip.run_cell(src)
        dt = time.perf_counter() - t
    if not res.success:
        raise RuntimeError(
            f"cell failed: {src.splitlines()[0]}: {res.error_before_exec or res.error_in_exec}"
        )
    if check and f"{world}.0" not in out.stdout + "".join(str(o.data) for o in out.outputs):
        raise RuntimeError(
            f"{src.splitlines()[0]} did not show the all_reduce result {world}.0: {out.stdout!r}"
        )
    return dt


def start_ours(ip):
    """``%gpu_cluster start`` (2 workers) on the Ray already running here; returns (cluster, s to first cell)."""
    from gpu_notebook.cluster import get_manager

    ip.run_line_magic("load_ext", "gpu_notebook")
    t0 = time.perf_counter()
    ip.run_line_magic("gpu_cluster", "start --workers 2 --cpus-per-worker 0.5")
    _timed_cell(ip, "%%distributed\n" + CELL)
    return get_manager().require_current(), time.perf_counter() - t0


def start_ipyparallel(ip, n: int = 2):
    """An ipyparallel cluster of ``n`` engines started once (as its docs recommend), ``%px`` magics activated on
    a blocking view of all engines, and a gloo process group formed on the engines so ``%%px`` runs the same
    cell as ``%%distributed``. Returns (ipp.Cluster, client)."""
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=n, log_level=40)
    rc = cluster.start_and_connect_sync()
    rc.wait_for_engines(n, timeout=300)
    port = _free_port()
    ars = [
        rc[i].execute(
            f"import torch.distributed as dist\ndist.init_process_group('gloo', "
            f"init_method='tcp://127.0.0.1:{port}', rank={i}, world_size={n})",
            block=False,
        )
        for i in range(n)
    ]
    for ar in ars:
        ar.get(timeout=300)
    view = rc[:]
    view.block = True
    view.activate()  # registers %px / %%px on this shell, as the docs show
    return cluster, rc


def bench_cells(ip, cluster, rc, reps: int) -> dict[str, float]:
    """Median wall time of the same cell through ``%%distributed`` and ``%%px`` in the same shell, and through
    the Python calls under them (``Cluster.run`` and ``DirectView.execute(silent=False, block=True)``, the call
    ``%%px`` makes), all interleaved in rounds (alternating the order), after 3 untimed warm-up calls each."""

    def api(fn) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def ours_api() -> None:
        res = cluster.run(CELL, stream=False)
        assert res.ok and list(res.values) == [2.0, 2.0], res.failures

    calls = {
        "ours": lambda check=False: _timed_cell(ip, "%%distributed\n" + CELL, check),
        "ours_api": lambda check=False: api(ours_api),
    }
    if rc is not None:
        view = rc[:]

        def ipp_api() -> None:
            ar = view.execute(CELL, silent=False, block=True)
            assert [r["data"]["text/plain"] for r in ar.execute_result] == ["2.0", "2.0"]

        calls["px"] = lambda check=False: _timed_cell(ip, "%%px\n" + CELL, check)
        calls["ipp_api"] = lambda check=False: api(ipp_api)
    for i in range(3):
        for call in calls.values():
            call(check=i == 0)
    samples: dict[str, list[float]] = {k: [] for k in calls}
    order = list(calls)
    for _ in range(reps):
        for key in order:
            samples[key].append(calls[key]())
        order.reverse()
    return {k: median_ms(v) for k, v in samples.items()}


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
    """Median of ``reps`` TorchTrainer.fit calls after one untimed warm-up fit (imports, first worker start)."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    storage = tempfile.mkdtemp(prefix="gnb-bench-train-")
    samples = []
    for i in range(reps + 1):
        trainer = TorchTrainer(
            allreduce_fn,
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 0.5}),
            run_config=RunConfig(name=f"bench{i}", storage_path=storage),
        )
        t = time.perf_counter()
        trainer.fit()
        if i:
            samples.append(time.perf_counter() - t)
    return median_ms(samples)


def bench_notebook_launcher(reps: int) -> float:
    """Median of ``reps`` notebook_launcher calls after one untimed warm-up call, in a fresh process (no Ray)."""
    code = textwrap.dedent(
        f"""
        import contextlib, io, time, statistics, sys
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from accelerate import notebook_launcher
        from dispatch import launcher_fn
        samples = []
        for i in range({reps} + 1):
            t = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):  # its "Launching training on 2 CPUs." line
                notebook_launcher(launcher_fn, (), num_processes=2, use_port="{_free_port()}")
            if i:
                samples.append(time.perf_counter() - t)
        print("MEDIAN", statistics.median(samples) * 1000)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, ACCELERATE_USE_CPU="1", CUDA_VISIBLE_DEVICES=""),
    )
    for line in proc.stdout.splitlines():
        if line.startswith("MEDIAN"):
            return float(line.split()[1])
    raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-2000:])


def installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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


def bench_ddp(cluster, steps: int, rounds: int) -> tuple[float, float, list[float]]:
    script = TRAIN_SCRIPT.replace("STEPS", str(steps))
    path = os.path.join(tempfile.mkdtemp(prefix="gnb-bench-"), "train.py")
    with open(path, "w") as f:
        f.write(script)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    ours, theirs = [], []

    def run_ours() -> None:
        res = cluster.run(script + "\nmain()\n", stream=False)
        assert res.ok, res.failures
        ours.append(res.values[0])

    def run_torchrun() -> None:
        proc = subprocess.run(
            [torchrun, "--nproc_per_node", "2", "--master_port", str(_free_port()), path],
            capture_output=True,
            text=True,
            timeout=600,
        )
        rate = [float(ln.split()[1]) for ln in proc.stdout.splitlines() if ln.startswith("THROUGHPUT")]
        if not rate:
            raise RuntimeError(proc.stderr[-2000:])
        theirs.append(rate[0])

    for i in range(rounds):  # interleave, alternating which goes first, so load changes hit both alike
        for run in (run_ours, run_torchrun) if i % 2 == 0 else (run_torchrun, run_ours):
            run()
    return (
        statistics.median(ours),
        statistics.median(theirs),
        [a / b for a, b in zip(ours, theirs, strict=True)],
    )


def _spread(samples: list[float]) -> str:
    """The 10th..90th percentile of ``samples`` (seconds), in ms."""
    q = statistics.quantiles(samples, n=10) if len(samples) > 1 else samples * 9
    return f"{q[0] * 1000:.1f}..{q[-1] * 1000:.1f}"


class Echo:
    """A bare Ray actor: the round trip that every per-rank call pays at least."""

    def ping(self) -> int:
        return 1


def _allreduce_alone_s(cluster, n: int = 200) -> float:
    """The all_reduce itself, timed on the ranks (the slowest rank's median of ``n``), in seconds."""
    code = (
        "import statistics, time, torch, torch.distributed as dist\n_t = torch.ones(1)\n_s = []\n"
        f"for _ in range({n}):\n    _a = time.perf_counter(); dist.all_reduce(_t); "
        "_s.append(time.perf_counter() - _a)\nstatistics.median(_s)\n"
    )
    res = cluster.run(code, stream=False)
    assert res.ok, res.failures
    return max(res.values[r] for r in res.ranks)


def bench_size(ip, n: int, reps: int, profile: bool) -> dict[str, list[float]]:
    """Interleaved samples (seconds) at ``n`` workers: ``%%distributed``, ``%%px``, a bare Ray round trip to
    ``n`` actors; plus "allreduce" (one value, timed on the ranks)."""
    import ray

    from gpu_notebook.cluster import get_manager

    ip.run_line_magic("gpu_cluster", f"start --name bench{n} --workers {n} --cpus-per-worker 0.5")
    cluster = get_manager().require_current()
    actors = [ray.remote(num_cpus=0)(Echo).remote() for _ in range(n)]
    ray.get([a.ping.remote() for a in actors])
    ipp_cluster = None
    try:
        calls = {"ours": lambda check=False: _timed_cell(ip, "%%distributed\n" + CELL, check, n)}

        def ray_rt(check: bool = False) -> float:
            t = time.perf_counter()
            ray.get([a.ping.remote() for a in actors])
            return time.perf_counter() - t

        calls["ray"] = ray_rt
        if installed("ipyparallel"):
            ipp_cluster, _rc = start_ipyparallel(ip, n)
            calls["px"] = lambda check=False: _timed_cell(ip, "%%px\n" + CELL, check, n)
        for i in range(3):
            for call in calls.values():
                call(check=i == 0)
        samples: dict[str, list[float]] = {k: [] for k in calls}
        order = list(calls)
        for _ in range(reps):
            for key in order:
                samples[key].append(calls[key]())
            order.reverse()
        samples["allreduce"] = [_allreduce_alone_s(cluster)]
        if profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            for _ in range(reps):
                _timed_cell(ip, "%%distributed\n" + CELL)
            prof.disable()
            print(f"\nwhere the driver's time goes: {reps} warm cells at {n} workers (cumulative, top 25)")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    finally:
        if ipp_cluster is not None:
            ipp_cluster.stop_cluster_sync()
        for a in actors:
            ray.kill(a)
        ip.run_line_magic("gpu_cluster", f"stop bench{n}")
    return samples


def main_sizes(sizes: list[int], reps: int, profile: bool) -> None:
    import ray
    from IPython.testing.globalipapp import start_ipython

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    ip = start_ipython()
    ip.run_line_magic("load_ext", "gpu_notebook")
    results = {}
    for n in sizes:
        results[n] = bench_size(ip, n, reps, profile and n == max(sizes))
        print(f"  {n} workers done", flush=True)
    print()
    print(
        f"Warm all_reduce cell by world size (gloo, CPU workers; medians of {reps} interleaved runs, "
        f"10th..90th percentile in brackets; this machine has {os.cpu_count()} cores)"
    )
    head = f"{'workers':>7} {'%%distributed':>22} {'%%px':>22} {'Ray round trip':>20} {'all_reduce':>10}"
    print(head + f" {'vs %%px':>8} {'vs 3x(rt+ar)':>13}")
    for n, s in results.items():
        ours, rt, ar = median_ms(s["ours"]), median_ms(s["ray"]), s["allreduce"][0] * 1000
        px = f"{median_ms(s['px']):7.2f} ms [{_spread(s['px'])}]" if "px" in s else "skipped"
        speedup = f"{median_ms(s['px']) / ours:7.2f}x" if "px" in s else "-"
        print(
            f"{n:>7} {ours:7.2f} ms [{_spread(s['ours'])}] {px:>22} {rt:6.2f} ms [{_spread(s['ray'])}] "
            f"{ar:7.3f} ms {speedup:>8} {ours / (3 * (rt + ar)):12.2f}x"
        )
    print(
        "targets: %%distributed at least 1.8x faster than %%px at every size; at 8 workers within 3x "
        "(Ray round trip + all_reduce), i.e. the last column at most 1.00"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer repeats (about 3 minutes on 2 cores)")
    parser.add_argument("--reps", type=int, help="timed cells per tool (default 30; --quick 10)")
    parser.add_argument(
        "--train-reps",
        type=int,
        help="timed TorchTrainer.fit calls after one warm-up fit (default 2; --quick 1)",
    )
    parser.add_argument("--skip-ray-train", action="store_true")
    parser.add_argument("--steps", type=int, help="DDP training steps per throughput round (default 150)")
    parser.add_argument("--rounds", type=int, help="interleaved DDP throughput rounds (default 5; --quick 3)")
    parser.add_argument("--sizes", help="comma-separated world sizes: the dispatch table by size only")
    parser.add_argument("--profile", action="store_true", help="--sizes: profile the driver at the largest")
    args = parser.parse_args()
    if args.sizes:
        main_sizes(
            [int(x) for x in args.sizes.split(",")], args.reps or (10 if args.quick else 20), args.profile
        )
        return
    reps = args.reps or (10 if args.quick else 30)
    train_reps = args.train_reps or (1 if args.quick else 2)
    steps = args.steps or 150
    rounds = args.rounds or (3 if args.quick else 5)
    launcher_reps = max(3, reps // 3)

    cold = bench_cold_start()
    print(f"  start -> first cell: {cold:.1f} s", flush=True)
    import ray
    from IPython.testing.globalipapp import start_ipython

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    ip = start_ipython()
    cluster, start_to_first = start_ours(ip)
    skipped: dict[str, str] = {}
    ipp_cluster = rc = None
    if installed("ipyparallel"):
        ipp_cluster, rc = start_ipyparallel(ip)
    else:
        skipped["ipyparallel %%px"] = "ipyparallel not installed"
    try:
        cells = bench_cells(ip, cluster, rc, reps)
    finally:
        if ipp_cluster is not None:
            ipp_cluster.stop_cluster_sync()
    rows: list[tuple[str, float, str]] = [
        ("gpu_notebook %%distributed (warm)", cells["ours"], f"median of {reps}")
    ]
    print(f"  ours: {cells['ours']:.2f} ms", flush=True)
    if "px" in cells:
        rows.append(("ipyparallel %%px (warm, same cell)", cells["px"], f"median of {reps}"))
        print(f"  ipyparallel: {cells['px']:.2f} ms", flush=True)
    api_rows = [("Cluster.run(cell) (under %%distributed)", cells["ours_api"])]
    if "ipp_api" in cells:
        api_rows.append(("DirectView.execute(cell) (under %%px)", cells["ipp_api"]))
    if installed("accelerate"):
        rows.append(
            (
                "accelerate notebook_launcher",
                bench_notebook_launcher(launcher_reps),
                f"median of {launcher_reps}",
            )
        )
        print(f"  notebook_launcher: {rows[-1][1]:.2f} ms", flush=True)
    else:
        skipped["accelerate notebook_launcher"] = "accelerate not installed"
    if args.skip_ray_train:
        skipped["Ray Train TorchTrainer.fit"] = "--skip-ray-train"
    elif not installed("ray.train") or not installed("ray.train.torch"):
        skipped["Ray Train TorchTrainer.fit"] = "ray[train] not installed"
    else:
        rows.append(("Ray Train TorchTrainer.fit", bench_ray_train(train_reps), f"median of {train_reps}"))
        print(f"  TorchTrainer.fit: {rows[-1][1]:.0f} ms", flush=True)
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    ddp = bench_ddp(cluster, steps, rounds) if os.path.exists(torchrun) else None
    ip.run_line_magic("gpu_cluster", "stop")

    base = rows[0][1]
    print()
    print(
        "Trivial distributed cell (all_reduce of one tensor, 2 workers, gloo), run as a notebook cell in one "
        "IPython shell; warm-up excluded for every tool"
    )
    print(f"{'tool':<40} {'median':>12} {'vs %%distributed':>18}  repeats")
    for name, ms, note in rows:
        print(f"{name:<40} {ms:>9.2f} ms {ms / base:>17.1f}x  {note}")
    for name, why in skipped.items():
        print(f"{name:<40} {'skipped':>12} {'-':>18}  {why}")
    print()
    print(
        "The same cell through the Python calls under the magics (no magic parsing or output display), "
        "interleaved with the rows above"
    )
    for name, ms in api_rows:
        print(f"{name:<40} {ms:>9.2f} ms {ms / api_rows[0][1]:>17.1f}x  median of {reps}")
    print()
    print(
        f"%gpu_cluster start -> first finished cell, fresh kernel: {cold:.1f} s (local Ray start included); "
        f"on an already running Ray: {start_to_first:.1f} s"
    )
    print()
    if ddp is None:
        print("DDP training throughput: skipped (torchrun not found next to this Python)")
        return
    ddp_ours, ddp_torchrun, ratios = ddp
    print(f"DDP training throughput (same loop, 2 CPU workers, gloo; medians of {rounds} interleaved rounds)")
    print(f"{'%%distributed':<20} {ddp_ours:>10.0f} samples/s")
    print(f"{'torchrun':<20} {ddp_torchrun:>10.0f} samples/s")
    print(
        f"ratio %%distributed / torchrun: median {statistics.median(ratios):.3f} "
        f"(per round {min(ratios):.3f}..{max(ratios):.3f})"
    )


if __name__ == "__main__":
    main()
