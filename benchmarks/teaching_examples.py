"""Benchmark: how long the teaching notebooks take, at their full size (for people) and their small size (the test
suite's), each run headless from kernel start to the last cell with its own local Ray and the default
``%gpu_cluster start``.

Each row is one ``scripts/run_notebook.py`` run in a fresh process (the workshop with ``--solutions``, so every
exercise does its work). Columns: the notebook, the size, seconds, and the ``SUMMARY:`` line it printed. Run it
alone: two local Ray clusters on one machine conflict, and other work on the machine slows every row.

Usage::

    python benchmarks/teaching_examples.py                 # both notebooks, both sizes (about 4 minutes on 2 cores)
    python benchmarks/teaching_examples.py --size small    # the test suite's size only
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {"ddp_training.ipynb": [], "workshop.ipynb": ["--solutions"]}


def run(name: str, size: str, folder: Path) -> tuple[float, str]:
    """Run one notebook at one size; returns its wall time and its summary line (or why it failed)."""
    work = folder / f"{size}-{name}"
    shutil.copy(ROOT / "examples" / name, work)
    options = [*NOTEBOOKS[name], *(["--small"] if size == "small" else [])]
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "GPU_NOTEBOOK_EXAMPLE_SIZE")}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(work), *options],
        capture_output=True,
        text=True,
        env=env,
    )
    elapsed = time.perf_counter() - t0
    lines = [line for line in proc.stdout.splitlines() if line.startswith("SUMMARY:")]
    if proc.returncode:
        return elapsed, "FAILED: " + (proc.stderr.strip().splitlines() or ["?"])[-1]
    return elapsed, lines[-1] if lines else "(no summary)"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", choices=["full", "small", "both"], default="both")
    args = parser.parse_args()
    sizes = ["full", "small"] if args.size == "both" else [args.size]
    print(f"{'notebook':20} {'size':6} {'seconds':>8}  summary")
    failed = False
    with tempfile.TemporaryDirectory(prefix="teaching-") as tmp:
        for name in NOTEBOOKS:
            for size in sizes:
                elapsed, summary = run(name, size, Path(tmp))
                failed |= summary.startswith("FAILED")
                print(f"{name:20} {size:6} {elapsed:8.1f}  {summary}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
