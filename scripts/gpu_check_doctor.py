#!/usr/bin/env python
"""Run the gpu_notebook doctor and the all-reduce benchmark on this machine (called by scripts/gpu_check.sh).

Needs only torch and this package (nvidia-ml-py optional; no Ray). On an NVIDIA machine it:

1. prints ``diagnose_local()`` (driver, CUDA build, GPU architecture, ECC, throttling, NCCL, network, disk);
2. starts a local NCCL group with one rank per GPU (at most 2; 1 on a single-GPU machine), prints
   ``diagnose(group)`` and the all-reduce table (8 B .. --max-bytes);
3. on a single-GPU machine, also runs 2 ranks sharing the GPU over gloo, where the doctor must report the
   shared GPU as an error (that is the expected result, it proves the check), and a 2-rank gloo all-reduce;
4. runs the scaling benchmark on the NCCL group.

Without a GPU it runs the CPU path (2 gloo ranks). Exits 1 when a check that must pass on a healthy machine
fails: the doctor reports an error about the software stack (driver/CUDA/arch/versions/ports; findings
about the lent machine itself, such as a small /dev/shm, are printed but do not fail), it does not see the
GPU, the benchmark finds wrong results, or the shared-GPU case goes unnoticed. Exits 0 otherwise.

Usage: python scripts/gpu_check_doctor.py [--max-bytes 128M] [--iters N] [--warmup N] [--steps N]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

#: Errors of these checks fail the run: they are about the software stack the doctor must judge right.
#: Errors of the others (disk, /dev/shm, ECC, ...) describe the lent machine; they are printed, not failed.
STACK_CHECKS = {"cuda-driver", "gpu-arch", "versions", "master-port", "peer-ports", "probe"}


def stack_errors(report: Any, extra: set[str] | None = None) -> list[Any]:
    """The report's errors about the software stack (plus the ``extra`` checks)."""
    return [f for f in report.errors if f.check in STACK_CHECKS | (extra or set())]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from gpu_notebook.doctor import parse_size

    parser.add_argument("--max-bytes", type=parse_size, default=128 * 2**20, help="e.g. 128M (default)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20, help="training steps per worker count (scaling)")
    args = parser.parse_args(argv)

    import torch

    from gpu_notebook.doctor import LocalGroup, bench_allreduce, bench_scaling, diagnose, diagnose_local

    problems: list[str] = []
    t0 = time.perf_counter()
    print("=" * 100)
    print(
        f"torch {torch.__version__}, CUDA build {torch.version.cuda}, cuda available {torch.cuda.is_available()}"
    )
    cuda_was_initialised = torch.cuda.is_initialized()
    local = diagnose_local()
    print(local.text())
    if torch.cuda.is_available():
        probe = (local.facts[0].get("cuda_kernel") or {}) if local.facts else {}
        print(
            f"kernel probe: {probe}; CUDA initialised here after diagnose_local: {torch.cuda.is_initialized()}"
        )
        if probe.get("ok") is not True:
            problems.append(f"diagnose_local's CUDA kernel probe did not run: {probe}")
        if not cuda_was_initialised and torch.cuda.is_initialized():
            problems.append(
                "diagnose_local left a CUDA context in this process (the probe should run in a subprocess)"
            )
    if stack_errors(local):
        problems.append(f"diagnose_local: {len(stack_errors(local))} stack error(s)")

    n_gpu = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n_gpu:
        saw = [f for f in local.by_check("gpu-arch") if "PyTorch has sm_" in f.message]
        nccl = [f for f in local.by_check("nccl") if f.message.startswith("NCCL ")]
        print(f"doctor saw the GPU architecture: {bool(saw)}; NCCL version: {bool(nccl)}")
        if not saw or not nccl:
            problems.append("diagnose_local did not recognise the GPU stack")
    if n_gpu:
        world = min(2, n_gpu)
        print("=" * 100)
        print(f"NCCL group: {world} rank(s) on {n_gpu} GPU(s)")
        with LocalGroup(world, "nccl", env={"NCCL_DEBUG": "WARN"}) as group:
            report = diagnose(group)
            print(report.text())
            if stack_errors(report, {"gpu-assignment"}):
                problems.append(
                    f"diagnose(nccl group): {len(stack_errors(report, {'gpu-assignment'}))} error(s)"
                )
            res = bench_allreduce(
                group, max_bytes=args.max_bytes, iters=args.iters, warmup=args.warmup, links=world > 1
            )
            print(res.table())
            if res.wrong:
                problems.append(f"nccl all-reduce: {res.wrong} wrong elements")
            if world > 1:
                print(bench_scaling(group, steps=args.steps).table())
    if n_gpu < 2:
        print("=" * 100)
        label = "2 gloo ranks sharing the one GPU" if n_gpu == 1 else "2 gloo ranks (no GPU)"
        print(label)
        with LocalGroup(2, "gloo") as group:
            report = diagnose(group)
            print(report.text())
            shared = [
                f for f in report.errors if f.check == "gpu-assignment" and "share one GPU" in f.message
            ]
            if n_gpu == 1:
                print(f"expected: the shared GPU is reported as an error -> {'yes' if shared else 'NO'}")
                if not shared:
                    problems.append("two ranks on one GPU were not reported")
            elif stack_errors(report):
                problems.append(f"diagnose(gloo group): {len(stack_errors(report))} error(s)")
            res = bench_allreduce(
                group, max_bytes=min(args.max_bytes, 16 * 2**20), iters=args.iters, warmup=args.warmup
            )
            print(res.table())
            if res.wrong:
                problems.append(f"gloo all-reduce: {res.wrong} wrong elements")
    print("=" * 100)
    print(
        f"gpu_check_doctor: {time.perf_counter() - t0:.1f} s; "
        + ("; ".join(problems) if problems else "all good")
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
