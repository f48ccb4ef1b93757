"""Benchmark of the GPU monitor: what it costs, printed as a table.

Rows:

1. sampler CPU per fast tick (fake NVML with 8 GPUs + host metrics; host metrics only), and that as a share of
   one core at 2 Hz (target < 0.5%), next to a bare polling loop making the same NVML reads on the same fake
   GPUs plus psutil's host counters (what nvidia-smi/gpustat/nvitop-style polling does at the least; ratio).
   The fake NVML is Python, so on a real GPU node the NVML part is cheaper than measured here; where the machine
   has NVIDIA GPUs the sampler's real tick is printed next to an ``nvidia-smi --query-gpu`` poll and an nvitop
   snapshot (each printed as skipped where it is not installed or there is no driver).
2. aggregator cost for 512 simulated GPUs (64 nodes x 8): one pull of one new row per node, plus the queries a
   dashboard and Prometheus make.
3. widget messages per second at 512 GPUs with the UI timer firing at 10 Hz, counted on a fake wire, and the
   CPU time of one refresh.
4. CPU used by the monitor's own threads (in this process, idle), and the round-trip latency of a ``1+1`` cell
   in a real kernel with the dashboard off (before and after) vs live.
5. slowdown of a CPU training loop (a small torch MLP, one thread) with the monitor and its dashboard live vs
   off, in a real Jupyter kernel driven by nbclient, in off/on/on/off (ABBA) blocks: the worst case with the
   loop in the kernel's own main thread (it shares the GIL with the monitor threads), and the user's case with
   the loop in a cluster worker process (``cluster.call``, what ``%%distributed`` runs) while the sampler actor
   and the kernel's pull and dashboard threads run. Besides wall clock, each case reports the training
   thread's extra GIL waits and run-queue waits from ``/proc/thread-self/schedstat``, which other jobs on a
   shared machine do not disturb.

Usage::

    python benchmarks/monitor.py                   # all rows (~9 min on 2 cores; starts a local Ray)
    python benchmarks/monitor.py --quick           # shorter runs
    python benchmarks/monitor.py --only-training   # just the training rows (--no-worker: no Ray)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


class Clock:
    def __init__(self, t: float = 1_764_400_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _bare_poll(nvml: Any, handles: list[Any], psutil: Any) -> None:
    """What a plain polling loop does per refresh (the nvidia-smi / gpustat / nvitop way, minus their
    formatting): the same seven NVML reads per GPU as our fast tick, plus psutil's CPU, memory and network
    counters; nothing is kept."""
    for h in handles:
        nvml.nvmlDeviceGetUtilizationRates(h)
        nvml.nvmlDeviceGetMemoryInfo(h)
        nvml.nvmlDeviceGetPowerUsage(h)
        nvml.nvmlDeviceGetTemperature(h, 0)
        nvml.nvmlDeviceGetClockInfo(h, 1)
        nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        nvml.nvmlDeviceGetTotalEnergyConsumption(h)
    if psutil is not None:
        psutil.cpu_percent(None)
        psutil.virtual_memory()
        psutil.net_io_counters()


def _cpu_per_call(fn: Any, n: int) -> float:
    fn()
    c0 = time.thread_time()
    for _ in range(n):
        fn()
    return (time.thread_time() - c0) / n


def bench_sampler(ticks: int) -> list[tuple[str, str, str]]:
    import psutil

    from gpu_notebook.monitor import NodeSampler
    from gpu_notebook.testing.nvml import FakeNVML

    rows = []
    costs = {}
    for label, kw in (
        ("sampler tick, fake NVML 8 GPUs + host", {"nvml": lambda: FakeNVML(8)}),
        ("sampler tick, host metrics only", {"nvml": None}),
    ):
        s = NodeSampler("bench", **kw)
        per = costs[label] = _cpu_per_call(s.tick, ticks)
        rows.append((label, f"{per * 1e6:.0f} µs CPU", f"{per * 2 * 100:.3f}% of a core at 2 Hz"))
    # the alternatives, interleaved with ours in rounds so machine load hits both alike
    nvml = FakeNVML(8)
    nvml.nvmlInit()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    ours_s = NodeSampler("bench", nvml=lambda: FakeNVML(8))
    ours, bare = [], []
    for _ in range(5):
        ours.append(_cpu_per_call(ours_s.tick, max(1, ticks // 5)))
        bare.append(_cpu_per_call(lambda: _bare_poll(nvml, handles, psutil), max(1, ticks // 5)))
    o, b = statistics.median(ours), statistics.median(bare)
    rows.append(
        (
            "  vs a bare poll loop, same 8 fake GPUs + psutil host",
            f"{b * 1e6:.0f} µs CPU (ours {o / b:.2f}x)",
            "same NVML reads, nothing stored: a floor for nvidia-smi/gpustat/nvitop-style polling; "
            "median of 5 interleaved rounds",
        )
    )
    rows += _bench_real_tools(ticks)
    return rows


def _bench_real_tools(n: int) -> list[tuple[str, str, str]]:
    """nvidia-smi and nvitop polls on this machine's real GPUs, or a 'skipped' row saying why."""
    import resource
    import shutil
    import subprocess

    from gpu_notebook.monitor import NodeSampler

    rows = []
    ours = None
    sampler = NodeSampler("bench-real", nvml="auto")
    if sampler.gpu is None:
        rows.append(
            ("sampler tick, this machine's real GPUs + host", "skipped", "no NVIDIA driver / pynvml here")
        )
    else:
        ours = _cpu_per_call(sampler.tick, max(10, n // 10))
        rows.append(
            (
                "sampler tick, this machine's real GPUs + host",
                f"{ours * 1e6:.0f} µs CPU",
                f"{sampler.gpu.count} GPU(s), real NVML; {ours * 2 * 100:.3f}% of a core at 2 Hz",
            )
        )

    def vs(per: float) -> str:
        return f"{per * 1e6:.0f} µs CPU" + (f" (ours {ours / per:.2f}x)" if ours else "")

    smi = shutil.which("nvidia-smi")
    query = [
        "--query-gpu=utilization.gpu,memory.used,power.draw,temperature.gpu,clocks.sm",
        "--format=csv,noheader",
    ]
    if smi is None:
        rows.append(("nvidia-smi --query-gpu poll (one process per poll)", "skipped", "nvidia-smi not found"))
    else:
        try:
            subprocess.run([smi, *query], capture_output=True, check=True, timeout=30)
            k = max(3, n // 50)
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            for _ in range(k):
                subprocess.run([smi, *query], capture_output=True, check=True, timeout=30)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            per = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / k
            rows.append(
                (
                    "nvidia-smi --query-gpu poll (one process per poll)",
                    vs(per),
                    f"real GPUs of this machine, child CPU over {k} polls; {per * 2 * 100:.3f}% of a core at 2 Hz",
                )
            )
        except (OSError, subprocess.SubprocessError) as exc:
            rows.append(
                ("nvidia-smi --query-gpu poll (one process per poll)", "skipped", f"nvidia-smi failed: {exc}")
            )
    try:
        from nvitop import Device
    except ImportError:
        rows.append(("nvitop Device snapshot poll", "skipped", "nvitop not installed"))
    else:
        try:
            devices = Device.all()
            if not devices:
                raise RuntimeError("no NVIDIA GPU")
            per = _cpu_per_call(lambda: [d.as_snapshot() for d in devices], max(10, n // 10))
            rows.append(
                (
                    "nvitop Device snapshot poll",
                    vs(per),
                    f"real GPUs of this machine ({len(devices)}); {per * 2 * 100:.3f}% of a core at 2 Hz",
                )
            )
        except Exception as exc:  # noqa: BLE001 - no driver, no GPU: report, do not fail the benchmark
            rows.append(("nvitop Device snapshot poll", "skipped", f"no NVML here ({type(exc).__name__})"))
    return rows


def _fake_cluster(clock: Clock, nodes: int = 64, gpus: int = 8) -> tuple[Any, list[Any]]:
    from gpu_notebook.monitor import Monitor, NodeSampler
    from gpu_notebook.testing.nvml import FakeGPU, FakeNVML

    samplers = [
        NodeSampler(
            f"node-{n:02d}",
            nvml=FakeNVML(
                [
                    FakeGPU(util=lambda t, n=n, i=i: (n + i + 5 * t) % 100)  # type: ignore[misc]
                    for i in range(gpus)
                ],
                clock=clock,
            ),
            clock=clock,
            host=False,
        )
        for n in range(nodes)
    ]
    mon = Monitor(samplers=samplers, clock=clock, autopull=False).start()
    return mon, samplers


def bench_aggregator(rounds: int) -> list[tuple[str, str, str]]:
    from gpu_notebook.monitor import utilisation_summary

    clock = Clock()
    mon, samplers = _fake_cluster(clock)
    for _ in range(120):  # a minute of history at 2 Hz
        clock.t += 0.5
        for s in samplers:
            s.tick()
    mon.pull()
    pulls, latest, prom, summ = [], [], [], []
    for _ in range(rounds):
        clock.t += 0.5
        for s in samplers:
            s.tick()
        t0 = time.perf_counter()
        mon.pull()
        pulls.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mon.latest()
        latest.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        mon.prometheus_text()
        prom.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        utilisation_summary(mon, 60)
        summ.append(time.perf_counter() - t0)
    ms = lambda v: f"{statistics.median(v) * 1e3:.2f} ms"  # noqa: E731
    return [
        ("aggregator pull, 64 nodes x 8 GPUs (new rows only)", ms(pulls), "per pull (1-2 Hz)"),
        ("latest() for 512 GPUs", ms(latest), "per call"),
        ("Prometheus text for 512 GPUs", ms(prom), "per scrape"),
        ("utilisation_summary(60 s) for 512 GPUs", ms(summ), "per call (idle stop)"),
    ]


def bench_widget(seconds: int) -> list[tuple[str, str, str]]:
    import comm

    sent: list[float] = []
    clock = Clock()

    class CountingComm(comm.DummyComm):
        def publish_msg(self, msg_type: str, *args: Any, **kwargs: Any) -> None:
            if msg_type == "comm_msg":
                sent.append(clock())

    orig = comm.create_comm
    comm.create_comm = lambda *a, **k: CountingComm(*a, **k)
    try:
        from gpu_notebook.widgets import MonitorWidget

        mon, samplers = _fake_cluster(clock)
        clock.t += 0.5
        for s in samplers:
            s.tick()
        mon.pull()
        w = MonitorWidget(mon, autostart=False, clock=clock)
        start = clock.t
        n0 = len(sent)
        costs = []
        for k in range(seconds * 10):
            clock.t += 0.1
            if k % 5 == 0:
                for s in samplers:
                    s.tick()
            if k % 10 == 0:
                mon.pull()
            c0 = time.thread_time()
            if w.refresh():
                costs.append(time.thread_time() - c0)
        msgs = sent[n0:]
        per_s = [sum(1 for t in msgs if a < t <= a + 1) for a in [start + i for i in range(seconds)]]
    finally:
        comm.create_comm = orig
    return [
        (
            "widget messages/s, 512 GPUs, UI timer at 10 Hz",
            f"mean {len(msgs) / seconds:.1f}, max {max(per_s)}",
            f"cap 5/s; {w.refreshes} refreshes in {seconds} s",
        ),
        ("widget refresh CPU, 512 GPUs", f"{statistics.median(costs) * 1e3:.1f} ms", "per refresh (1 Hz)"),
    ]


def _monitor_threads_cpu() -> float:
    """CPU seconds used so far by this process's gpu_notebook-* threads (via psutil's per-thread times)."""
    import threading

    import psutil

    ids = {t.native_id for t in threading.enumerate() if t.name.startswith("gpu_notebook-")}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


# Code run inside a real Jupyter kernel (through nbclient) for the training rows: what a user's kernel does.
_KERNEL_SETUP = r"""
import functools, json, statistics, time
import torch
from gpu_notebook.monitor import Monitor
from gpu_notebook.testing.nvml import FakeNVML

def _sched():
    # (run, run-queue wait) seconds of this thread so far, from /proc/thread-self/schedstat (Linux)
    try:
        with open("/proc/thread-self/schedstat") as f:
            run, wait = f.read().split()[:2]
        return int(run) / 1e9, int(wait) / 1e9
    except (OSError, ValueError):
        return float("nan"), float("nan")

def _train(steps):
    import time
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(128, 256), torch.randint(0, 10, (128,))
    for _ in range(20):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    s0, t0 = _sched(), time.perf_counter()
    for _ in range(steps):
        opt.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward(); opt.step()
    wall, s1 = time.perf_counter() - t0, _sched()
    # wall = running + runnable-but-not-running (other processes had the CPU) + blocked; this thread does no
    # I/O, so blocked time is time spent waiting for the GIL held by another thread of the same process
    blocked = max(0.0, wall - (s1[0] - s0[0]) - (s1[1] - s0[1]))
    return wall / steps, blocked / wall, (s1[1] - s0[1]) / wall

def _monitor_cpu():
    # CPU seconds of (our monitor threads, every other thread but the main one: IOPub, ZeroMQ I/O, ...)
    import threading
    import psutil
    ids = {t.native_id for t in threading.enumerate() if t.name.startswith("gpu_notebook-")}
    main = threading.main_thread().native_id
    ts = psutil.Process().threads()
    ours = sum(t.user_time + t.system_time for t in ts if t.id in ids)
    return ours, sum(t.user_time + t.system_time for t in ts if t.id != main) - ours

def _block(on, steps, where, busy=3.0, cluster=None):
    mon = w = None
    if on:
        if where == "kernel":
            mon = Monitor.local(nvml=lambda: FakeNVML(8), interval=0.5, pull_interval=1.0).start()
        else:
            mon = Monitor(cluster, nvml=functools.partial(FakeNVML, 8), interval=0.5, pull_interval=1.0).start()
        w = mon.widget(interval=1.0, busy_interval=busy)
        w.show()
        time.sleep(1.5)  # let every thread reach its steady state before timing
    else:
        time.sleep(1.5)  # the same pause in "off" blocks, so both start from the same idle state
    c0, t0 = _monitor_cpu(), time.perf_counter()
    try:
        per, blocked, rq = _train(steps) if where == "kernel" else cluster.call(_train, steps)[0]
        c1, dt = _monitor_cpu(), time.perf_counter() - t0
        share, others = (c1[0] - c0[0]) / dt, (c1[1] - c0[1]) / dt
    finally:
        if on:
            w.stop(snapshot=False)
            mon.stop()
    return {"per": per, "blocked": blocked, "rq": rq, "others": others, "refreshes": w.refreshes if w else 0, "deferred": w.deferred if w else 0, "cpu": share}
"""


def bench_training(block_s: float, pairs: int, worker: bool = True) -> list[tuple[str, str, str]]:
    """Training-step slowdown with the monitor + dashboard live vs off, in a real kernel, paired blocks.

    Blocks of ``block_s`` seconds alternate off/on/on/off (ABBA, so a linear drift in machine load cancels);
    each pair gives one on/off ratio and the rows show their mean ± standard error, on wall-clock step time and
    on step time minus the run-queue wait from ``schedstat`` (time the OS gave the CPU to other processes, the
    main noise on a shared machine). Three cases:

    * the training loop in the kernel's own main thread (worst case: it shares the interpreter and GIL with
      the sampler, pull and dashboard threads), with the default busy back-off, and with it disabled;
    * the training loop in a cluster worker process (where ``%%distributed`` / ``cluster.call`` run it),
      with the sampler as a Ray actor and the pull + dashboard threads in the kernel.
    """
    import json

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    client = NotebookClient(nb, timeout=900, kernel_name="python3")
    rows: list[tuple[str, str, str]] = []

    with client.setup_kernel():

        def run(src: str) -> str:
            cell = nbformat.v4.new_code_cell(src)
            nb.cells.append(cell)
            client.execute_cell(cell, len(nb.cells) - 1)
            return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")

        def block(on: bool, steps: int, where: str, busy: float | None) -> dict[str, float]:
            c0 = time.process_time()
            out = run(
                f"print(json.dumps(_block({on}, {steps}, {where!r}, busy={busy!r}, "
                f"cluster=globals().get('cluster'))))"
            )
            r = json.loads(out.strip().splitlines()[-1])
            r["client"] = time.process_time() - c0  # this process plays the frontend: receives every message
            return r

        def measure(where: str, busy: float | None) -> dict[str, Any]:
            per = block(False, 200, where, busy)["per"]  # calibrate the block length
            steps = max(200, int(block_s / per))
            m: dict[str, Any] = {
                "wall": [],
                "blocked": [],
                "rq": [],
                "offs": [],
                "refreshes": 0.0,
                "deferred": 0.0,
                "cpu": 0.0,
                "others": 0.0,
                "client": 0.0,
            }
            for _ in range(pairs):
                a = block(False, steps, where, busy)
                b = block(True, steps, where, busy)
                c = block(True, steps, where, busy)
                d = block(False, steps, where, busy)
                m["wall"].append((b["per"] + c["per"]) / (a["per"] + d["per"]))
                m["blocked"].append((b["blocked"] + c["blocked"] - a["blocked"] - d["blocked"]) / 2)
                m["rq"].append((b["rq"] + c["rq"] - a["rq"] - d["rq"]) / 2)
                m["others"] += (b["others"] + c["others"] - a["others"] - d["others"]) / (2 * pairs)
                m["client"] += (b["client"] + c["client"] - a["client"] - d["client"]) / (2 * pairs)
                m["offs"] += [a["per"], d["per"]]
                for k in ("refreshes", "deferred", "cpu"):
                    m[k] += (b[k] + c[k]) / (2 * pairs)
            m["base"] = statistics.median(m["offs"])
            return m

        def effect(r: list[float]) -> str:
            q = [(x - 1) * 100 for x in r]
            se = statistics.stdev(q) / len(q) ** 0.5 if len(q) > 1 else float("nan")
            return f"{statistics.mean(q):+.2f}% ± {se:.2f}%"

        def note(m: dict[str, Any]) -> str:
            q = sorted((x - 1) * 100 for x in m["wall"])
            return (
                f"mean ± s.e. of {len(q)} ABBA pairs of {block_s:g} s blocks; wall-clock pairs ranged "
                f"{q[0]:+.1f}..{q[-1]:+.1f}%; monitor threads in the kernel used {m['cpu'] * 100:.2f}% of a core, "
                f"{m['refreshes']:.1f} refreshes ({m['deferred']:.1f} deferred) per block"
            )

        def add(label: str, m: dict[str, Any], target: str = "") -> None:
            rows.append((f"{label}: wall clock", effect(m["wall"]) + " vs off" + target, note(m)))
            g = [x * 100 for x in m["blocked"]]
            se = statistics.stdev(g) / len(g) ** 0.5 if len(g) > 1 else float("nan")
            rows.append(
                (
                    f"{label}: GIL waits",
                    f"{statistics.mean(g):+.2f}% ± {se:.2f}% of step time",
                    "extra time the training thread sat blocked (schedstat: wall - running - run-queue), "
                    "immune to machine load",
                )
            )
            q = [x * 100 for x in m["rq"]]
            rows.append(
                (
                    f"{label}: waiting for a CPU",
                    f"{statistics.mean(q):+.2f}% of step time",
                    f"extra run-queue wait (other processes had both cores); meanwhile the kernel's other "
                    f"threads (IOPub, ZeroMQ) used {m['others'] * 100:+.2f}% of a core more and the nbclient "
                    f"frontend {m['client']:+.3f} s CPU more per block",
                )
            )

        run(_KERNEL_SETUP)
        for busy, label in ((3.0, "default (3 s while busy)"), (None, "back-off off (1 s always)")):
            m = measure("kernel", busy)
            if busy is not None:
                rows.append(
                    (
                        "WORST CASE training loop IN the kernel, monitor off",
                        f"{m['base'] * 1e3:.3f} ms/step",
                        "torch MLP, 1 thread, in the kernel's main thread (shares the GIL with the monitor)",
                    )
                )
            add(f"  + monitor & dashboard live, {label}", m)
        if worker:
            run("from gpu_notebook import Cluster\ncluster = Cluster(workers=1, cpus_per_worker=1.0).start()")
            try:
                m = measure("worker", 3.0)
            finally:
                run("cluster.stop()")
            rows.append(
                (
                    "USER CASE training loop in a cluster worker process, monitor off",
                    f"{m['base'] * 1e3:.3f} ms/step",
                    "cluster.call(train) on a local 1-worker Cluster, as %%distributed runs it",
                )
            )
            add("  + sampler actor, pull & dashboard live", m, " (target < 1%)")
    return rows


def bench_threads(seconds: float) -> list[tuple[str, str, str]]:
    """CPU used by the monitor's own threads (sampler, pull, dashboard) over a few idle seconds."""
    import comm

    from gpu_notebook.monitor import Monitor
    from gpu_notebook.testing.nvml import FakeNVML

    orig = comm.create_comm
    comm.create_comm = lambda *a, **k: comm.DummyComm(*a, **k)
    rows = []
    try:
        from gpu_notebook.widgets import MonitorWidget

        for label, interval in (("2 Hz", 0.5), ("10 Hz", 0.1)):
            mon = Monitor.local(nvml=lambda: FakeNVML(8), interval=interval, pull_interval=1.0).start()
            w = MonitorWidget(mon, interval=1.0)
            time.sleep(1.0)
            c0, w0 = _monitor_threads_cpu(), time.perf_counter()
            time.sleep(seconds)
            frac = (_monitor_threads_cpu() - c0) / (time.perf_counter() - w0)
            w.stop(snapshot=False)
            mon.stop()
            rows.append(
                (
                    f"monitor threads CPU, 8 fake GPUs, sampling {label} + dashboard 1 Hz",
                    f"{frac * 100:.2f}% of a core",
                    f"over {seconds:g} s (psutil per-thread times)",
                )
            )
    finally:
        comm.create_comm = orig
    return rows


def bench_kernel(n: int) -> list[tuple[str, str, str]]:
    """Latency of a trivial cell (``1+1``) in a real kernel, with the dashboard off and then live at 1 Hz."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    client = NotebookClient(nb, timeout=120, kernel_name="python3")
    rows = []
    with client.setup_kernel():

        def run(src: str) -> None:
            cell = nbformat.v4.new_code_cell(src)
            nb.cells.append(cell)
            client.execute_cell(cell, len(nb.cells) - 1)

        def latencies(k: int) -> list[float]:
            out = []
            for _ in range(k):
                t0 = time.perf_counter()
                run("1+1")
                out.append(time.perf_counter() - t0)
            return sorted(out)

        run("1+1")
        off = latencies(n // 2)  # off / on / off, so a drift in machine load does not land on one side
        run(
            "from gpu_notebook.monitor import Monitor\n"
            "from gpu_notebook.testing.nvml import FakeNVML\n"
            "mon = Monitor.local(nvml=lambda: FakeNVML(8), interval=0.5).start()\n"
            "w = mon.widget(interval=1.0); w.show()"
        )
        time.sleep(2)
        on = latencies(n)
        run("w.stop(); mon.stop()")
        time.sleep(2)
        off = sorted(off + latencies(n - n // 2))
    p = lambda v, q: v[min(len(v) - 1, int(q * len(v)))] * 1e3  # noqa: E731
    rows.append(
        (
            "cell '1+1' round trip, dashboard off",
            f"p50 {p(off, 0.5):.1f} ms, p95 {p(off, 0.95):.1f} ms",
            f"{n} cells through nbclient, half before and half after the live block",
        )
    )
    rows.append(
        (
            "cell '1+1' round trip, dashboard live (8 GPUs, 1 Hz)",
            f"p50 {p(on, 0.5):.1f} ms, p95 {p(on, 0.95):.1f} ms",
            f"{(p(on, 0.5) - p(off, 0.5)):+.1f} ms p50 vs off (target: p95 +20 ms at most)",
        )
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description="GPU monitor benchmark")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--no-training", action="store_true", help="skip the training-slowdown rows (minutes)"
    )
    parser.add_argument("--no-worker", action="store_true", help="skip the cluster-worker training rows")
    parser.add_argument("--only-training", action="store_true", help="only the training-slowdown rows")
    args = parser.parse_args()
    q = args.quick
    rows: list[tuple[str, str, str]] = []
    if args.only_training:
        rows += bench_training(1.5 if q else 2.0, 2 if q else 10, worker=not args.no_worker)
        _print(rows)
        return
    rows += bench_sampler(200 if q else 1000)
    rows += bench_aggregator(10 if q else 40)
    rows += bench_widget(15 if q else 60)
    rows += bench_threads(3 if q else 10)
    rows += bench_kernel(20 if q else 60)
    if not args.no_training:
        rows += bench_training(1.5 if q else 2.0, 2 if q else 10, worker=not args.no_worker)
    _print(rows)


def _print(rows: list[tuple[str, str, str]]) -> None:
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    print(f"{'measure':<{w0}} | {'value':<{w1}} | note")
    print(f"{'-' * w0}-|-{'-' * w1}-|-----")
    for a, b, c in rows:
        print(f"{a:<{w0}} | {b:<{w1}} | {c}")


if __name__ == "__main__":
    main()
