#!/usr/bin/env python
"""How restore scales with threads, on the machine it runs on (run by scripts/gpu_check.sh on the GPU machine's
16 cores; our CI machine has 2).

The benchmark's 3.3M-parameter GPT (fp32 and bf16, AdamW) is trained on the CPU; checkpoints every 10 steps
(a full base, then two deltas); the newest one (a 3-level delta chain) and the base are restored with 1, 2, 4, 8
and 16 decoding threads from the local store (page cache warm), against ``torch.load`` of ``torch.save``'s file
(single-threaded, as it is). Prints one table: best of 5 times and the ratio to ``torch.load`` (below 1: faster).
The decoding of a chain parallelises over chunks; ``torch.load`` does not: this is the measurement behind the
question whether delta restores keep up with ``torch.load`` on the multi-core machines GPUs come in.

    python scripts/gpu_check_restore.py [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _bits(t):  # type: ignore[no-untyped-def]
    return t.detach().contiguous().reshape(-1).view(__import__("torch").uint8)


def _best(fn, n: int = 5) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer training steps and threads (a smoke run)")
    args = ap.parse_args(argv)
    missing = [m for m in ("zstandard", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        print(
            f"SKIP: {', '.join(missing)} not installed for {sys.executable} (scripts/gpu_wheels.sh carries them)"
        )
        return 0
    import checkpoint as bench  # benchmarks/checkpoint.py: the model, corpus and training loop
    import torch

    from gpu_notebook.checkpoint import Checkpointer
    from gpu_notebook.checkpoint.format.codec import native_kernels

    cores = os.cpu_count() or 1
    threads = [t for t in (1, 2, 4, 8, 16) if t <= max(2, cores)]
    if args.quick:
        threads = threads[:2]
    torch.set_num_threads(min(4, cores))
    print(f"{cores} CPUs, torch {torch.__version__}, C kernels: {native_kernels()}")
    print("| state | restore of | MB | threads | ours s | torch.load s | ours / torch.load |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    data = bench.corpus()
    ok = True
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        model = bench.TinyGPT().to(dtype)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
        bench.train(model, opt, data, 5 if args.quick else 30, g)
        with tempfile.TemporaryDirectory(prefix="gnb-restore-") as tmp:
            ck = Checkpointer(Path(tmp) / "store", full_every=10, preemption=None, progress=False)
            ids = []
            for step in range(3):
                state = {"model": model, "optim": opt, "step": step * 10}
                ids.append(ck.save(state, step * 10, block=True).id)
                if step < 2:
                    bench.train(model, opt, data, 10, g)
            ck.close()
            ref = {k: v.clone() for k, v in model.state_dict().items()}
            path = Path(tmp) / "ts.pt"
            torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 20}, path)
            mb = path.stat().st_size / 1e6
            t_load = _best(lambda: torch.load(path, weights_only=True))  # noqa: B023
            for label, cid in (("delta chain (3 levels)", ids[2]), ("full base", ids[0])):
                for n in threads:
                    reader = Checkpointer(Path(tmp) / "store", threads=n, read_only=True, progress=False)
                    got = reader.restore(cid)
                    if cid == ids[2]:  # the newest checkpoint: bit for bit the model as it is now
                        ok &= all(torch.equal(_bits(got["model"][k]), _bits(v)) for k, v in ref.items())
                    t = _best(lambda: reader.restore(cid))  # noqa: B023
                    name = "fp32" if dtype == torch.float32 else "bf16"
                    print(
                        f"| {name} | {label} | {mb:.1f} | {n} | {t:.4f} | {t_load:.4f} | {t / t_load:.2f} |"
                    )
                    reader.close()
    print("restore bit-exact:", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
