#!/usr/bin/env python
"""GPU-machine check of the checkpointer's device path: a model and AdamW state on the GPU are snapshotted into
page-locked host buffers with asynchronous copies, saved (full, then delta), and restored onto the GPU bit for bit.

Usage (from scripts/gpu_check.sh, on a machine with CUDA):

    python scripts/gpu_check_checkpoint.py             # about 100 M parameters, ~1 min
    python scripts/gpu_check_checkpoint.py --cpu       # the same flow on the CPU (no GPU needed)

Prints the training stall of each save next to a plain synchronous ``.cpu()`` copy of the same state, and exits 0
when every restore is bit-identical and the page-locked buffers were used (and recycled) on the GPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on the CPU")
    parser.add_argument(
        "--width", type=int, default=2048, help="hidden size (default 2048: ~100 M parameters)"
    )
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args(argv)
    missing = [m for m in ("zstandard", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        # a bare GPU image (no internet to install from): say so instead of failing the whole GPU check
        print(
            f"SKIP: {', '.join(missing)} not installed for {sys.executable}; "
            f"`pip install {' '.join(missing)} blake3` to run this check"
        )
        return 0
    import torch

    from gpu_notebook.checkpoint import Checkpointer
    from gpu_notebook.checkpoint.format.codec import native_kernels

    dev = torch.device("cpu" if args.cpu else "cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        print("FAIL: CUDA is not available")
        return 1
    print(f"device={dev} native codec kernels={native_kernels()} torch={torch.__version__}")
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [
            torch.nn.Linear(args.width, 4 * args.width),
            torch.nn.GELU(),
            torch.nn.Linear(4 * args.width, args.width),
        ]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n_params = sum(p.numel() for p in model.parameters())

    def step() -> None:
        x = torch.randn(8, args.width, device=dev)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    step()
    sync()
    ok = True
    with tempfile.TemporaryDirectory() as d:
        ck = Checkpointer(d, progress=False)
        state = {"model": model, "optim": opt}
        for i in range(3):
            step()  # queued work: the snapshot must see the state after it, not before
            t0 = time.perf_counter()
            handle = ck.save(state, i)
            stall = time.perf_counter() - t0
            info = handle.result()
            sync()
            t0 = time.perf_counter()
            host = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            for s in opt.state.values():
                for v in s.values():
                    if torch.is_tensor(v):
                        v.to("cpu", copy=True)
            plain = time.perf_counter() - t0
            assert info is not None
            gb = info.raw_bytes / 1e9
            print(
                f"save {i}: {gb:.2f} GB of state, stall {stall * 1e3:.0f} ms ({gb / stall:.1f} GB/s); plain .cpu() copy "
                f"{plain * 1e3:.0f} ms; written {info.new_bytes / 1e6:.0f} MB in {info.extra['stats'].get('persist_s', 0):.2f} s"
            )
            got = ck.restore(info.id, map_location=dev)
            for k, v in model.state_dict().items():
                g = got["model"][k]
                if g.device.type != dev.type or not torch.equal(
                    g.view(torch.uint8), v.detach().view(torch.uint8)
                ):
                    print(f"FAIL: restored {k} differs (or is on {g.device})")
                    ok = False
            del host
        pinned = ck._buffers.n_pinned
        print(f"page-locked snapshot buffers: {pinned} (parameters {n_params / 1e6:.0f} M)")
        if dev.type == "cuda" and pinned == 0:
            print("FAIL: the GPU snapshot did not use page-locked buffers")
            ok = False
        ck.close()
    print("checkpoint device check:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
