"""GPU check for %%distributed: ranks on NCCL, each on its own GPU (run by scripts/gpu_check.sh).

With Ray installed, this starts a local cluster with one worker per GPU (at most 2) and runs a cell through the
real magic. Without Ray (the GPU machine's image may lack it), it drives the same RankWorker code in
torch.multiprocessing processes, so the NCCL path of our worker (CUDA_VISIBLE_DEVICES, set_device, init,
all_reduce) is still exercised. Prints one line per rank and exits non-zero on any failure.
"""

from __future__ import annotations

import socket
import sys

CELL = (
    "import os, torch, torch.distributed as dist\n"
    "t = torch.ones(1, device='cuda') * (dist.get_rank() + 1)\n"
    "dist.all_reduce(t)\n"
    "(dist.get_rank(), dist.get_backend(), os.environ.get('CUDA_VISIBLE_DEVICES'), torch.cuda.current_device(),"
    " torch.cuda.get_device_name(), t.item(), t)\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mp_rank(rank: int, world: int, port: int, queue) -> None:  # type: ignore[no-untyped-def]
    from gpu_notebook.distributed import plan_ranks
    from gpu_notebook.distributed._worker import RankWorker

    # one node, one GPU per rank, node visibility (the default): rank k sees GPUs 0..world-1 and uses cuda:k
    plan = plan_ranks([{"node_id": "n", "ip": "127.0.0.1", "gpu_ids": [str(r)]} for r in range(world)])[rank]
    w = RankWorker("gpucheck")
    w.init_process_group(plan, world, 1, "127.0.0.1", port, "nccl", 120)
    out = w.run_cell(CELL, "gpu-check")
    queue.put((rank, out, w.drain_output()))


def main() -> int:
    import torch

    n = torch.cuda.device_count()
    if n == 0:
        print("gpu_check_distributed: no CUDA device visible; nothing to check")
        return 1
    world = min(2, n)
    try:
        import ray  # noqa: F401

        have_ray = True
    except ImportError:
        have_ray = False
    results = []
    if have_ray:
        from IPython.testing.globalipapp import start_ipython

        ip = start_ipython()
        ip.run_line_magic("load_ext", "gpu_notebook")
        ip.run_line_magic("gpu_cluster", f"start --workers {world} --gpus-per-worker 1")
        res = ip.run_cell("%%distributed -o out\n" + CELL)
        if not res.success:
            return 1
        results = list(ip.user_ns["out"])
        ip.run_line_magic("gpu_cluster", "stop")
    else:
        import torch.multiprocessing as mp

        print(f"(ray not installed here: driving RankWorker directly in {world} processes)")
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        port = _free_port()
        procs = [ctx.Process(target=_mp_rank, args=(r, world, port, q)) for r in range(world)]
        for p in procs:
            p.start()
        outs = [q.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(60)
        for rank, out, _text in sorted(outs, key=lambda o: o[0]):
            if not out["ok"]:
                print(f"rank {rank} FAILED:\n{out['traceback']}")
                return 1
            results.append(out["value"])
    ok = True
    for rank, backend, visible, dev, name, total, tensor in results:
        # a CUDA tensor in a cell's value comes back on the CPU (the notebook host may have no GPU)
        where = getattr(getattr(tensor, "device", None), "type", type(tensor).__name__)
        print(
            f"rank {rank}: backend={backend} CUDA_VISIBLE_DEVICES={visible} device={dev} ({name}) "
            f"all_reduce={total} returned tensor on {where}"
        )
        ok &= backend == "nccl" and total == sum(range(1, world + 1)) and where == "cpu"
    if world > 1:
        ok &= len({r[2] for r in results}) == world  # each rank its own GPU
    print("gpu_check_distributed:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
