#!/usr/bin/env python
"""GPU-machine check of the monitor: run the node sampler against real NVML for a few seconds, print samples.

Usage (from scripts/gpu_check.sh, on a machine with an NVIDIA driver):

    python scripts/gpu_check_monitor.py            # real NVML (nvidia-ml-py), ~5 s
    python scripts/gpu_check_monitor.py --fake 2   # the same path against the fake NVML (no GPU needed)

Exit status 0 when every GPU produced utilisation, memory and power readings; 1 otherwise (including "no NVML").
"""

from __future__ import annotations

import argparse
import math
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to sample (default 5)")
    parser.add_argument("--interval", type=float, default=0.5, help="fast-tier period (default 0.5 s)")
    parser.add_argument(
        "--fake", type=int, metavar="N", help="use the fake NVML with N GPUs instead of real NVML"
    )
    parser.add_argument("--load", action="store_true", help="run a torch matmul loop on GPU 0 meanwhile")
    args = parser.parse_args(argv)

    import importlib.util

    if args.fake is None and importlib.util.find_spec("pynvml") is None:
        print(
            f"FAIL: nvidia-ml-py (module pynvml) is not installed for {sys.executable}; "
            "`pip install nvidia-ml-py` to check the real NVML path"
        )
        return 1

    from gpu_notebook.monitor import GPU_METRICS, Monitor, NodeSampler
    from gpu_notebook.testing.nvml import FakeGPU, FakeNVML

    nvml = (
        "auto"
        if args.fake is None
        else FakeNVML([FakeGPU(util=lambda t: 50 + 40 * math.sin(t)) for _ in range(args.fake)])
    )
    sampler = NodeSampler("check", nvml=nvml, interval=args.interval, host=True)
    info = sampler.info()
    print(f"nvml={info['nvml']} driver={info['driver'] or '-'} gpus={len(info['gpus'])}")
    for g in info["gpus"]:
        print(
            f"  gpu{g['index']}: {g['name']} {g['uuid']} {g['mem_total_mib']:.0f} MiB, "
            f"power limit {g['power_limit_w']:.0f} W"
        )
    if not info["has_gpu"]:
        print("FAIL: no GPU visible through NVML (is the NVIDIA driver loaded? is nvidia-ml-py installed?)")
        return 1

    stop_load = None
    if args.load:
        import threading

        import torch

        stop = threading.Event()

        def burn() -> None:
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
            while not stop.is_set():
                for _ in range(20):
                    a @ a
                torch.cuda.synchronize()

        threading.Thread(target=burn, daemon=True).start()
        stop_load = stop

    mon = Monitor(samplers=[sampler], interval=args.interval, pull_interval=0.5).start()
    sampler.start()
    t0 = time.perf_counter()
    slow = sampler.slow_tick()
    slow_s = time.perf_counter() - t0
    time.sleep(args.seconds)
    if stop_load is not None:
        stop_load.set()
    sampler.stop()
    mon.pull()

    cols = info["columns"]
    hdr = f"{'t':>6} {'gpu':>3} " + " ".join(f"{m:>13}" for m in GPU_METRICS)
    print(hdr)
    t, data = sampler.buffer.window(0.0)
    ok = True
    for k in range(len(t)):
        for g in info["gpus"]:
            vals = [data[k, cols.index(f"gpu{g['index']}.{m}")] for m in GPU_METRICS]
            print(f"{t[k] - t[0]:6.1f} {g['index']:>3} " + " ".join(f"{v:13.2f}" for v in vals))
    latest = mon.latest()["gpus"]
    for r in latest:
        for m in ("util_gpu", "mem_used_mib", "mem_total_mib", "power_w", "temp_c"):
            if math.isnan(r[m]):
                print(f"FAIL: gpu{r['index']} has no {m}")
                ok = False
    st = sampler.stats()
    print(
        f"fast ticks={st['ticks']:.0f} mean tick={st['mean_tick_s'] * 1e3:.2f} ms "
        f"({st['mean_tick_s'] / args.interval * 100:.3f}% of a core at {1 / args.interval:g} Hz); "
        f"slow tick={slow_s * 1e3:.1f} ms"
    )
    for s in slow:
        print(
            f"  slow gpu{s['index']}: {len(s['processes'])} processes, PCIe tx {s['pcie_tx_kBps']} "
            f"rx {s['pcie_rx_kBps']} kB/s"
        )
    sm = [r["sm_active"] for r in latest if not math.isnan(r["sm_active"])]
    print(f"GPM SM activity: {'available ' + str([round(v, 3) for v in sm]) if sm else 'not available'}")
    print("prometheus excerpt:")
    print(
        "\n".join(
            ln
            for ln in mon.prometheus_text().splitlines()
            if ln.startswith("gpu_notebook_gpu_utilization_percent{")
        )
    )
    print("csv excerpt:")
    print("\n".join(mon.to_csv().splitlines()[:4]))
    mon.stop()
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
