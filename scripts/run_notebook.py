"""Execute a notebook headless with nbclient, write the executed copy beside it and print a summary.

Usage: python scripts/run_notebook.py examples/quickstart.ipynb [--timeout SECONDS] [--small] [--solutions]

``--small`` runs the example at its small size (it sets ``GPU_NOTEBOOK_EXAMPLE_SIZE=small`` for the kernel;
the examples read it in their first code cell), as the test suite does. ``--solutions`` runs every exercise
cell (tagged ``exercise``) with the reference solution kept in its metadata (``solution``), as a teacher's
solved copy.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SIZE_VARIABLE = "GPU_NOTEBOOK_EXAMPLE_SIZE"


def apply_solutions(nb: Any) -> int:
    """Replace each exercise cell's source by its reference solution; returns how many were replaced."""
    n = 0
    for cell in nb.cells:
        solution = cell.get("metadata", {}).get("solution")
        if cell.cell_type == "code" and "exercise" in cell.metadata.get("tags", []) and solution:
            cell.source = solution
            n += 1
    return n


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--kernel", default="python3")
    parser.add_argument(
        "--small", action="store_true", help=f"the example's small size ({SIZE_VARIABLE}=small)"
    )
    parser.add_argument(
        "--solutions", action="store_true", help="run exercise cells with their reference solutions"
    )
    args = parser.parse_args()

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    if args.small:
        os.environ[SIZE_VARIABLE] = "small"  # the kernel inherits this process's environment
    nb = nbformat.read(args.notebook, as_version=4)
    if args.solutions:
        print(f"{apply_solutions(nb)} exercise cell(s) run with their reference solutions")
    out_path = args.notebook.with_suffix(".executed.ipynb")
    client = NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name=args.kernel,
        resources={"metadata": {"path": str(args.notebook.parent)}},
    )
    # the kernel's channels are Unix sockets in a private folder (no TCP ports open to the machine's other users)
    sockets = tempfile.TemporaryDirectory(prefix="gnb-kernel-")
    client.km = client.create_kernel_manager()
    client.km.transport = "ipc"
    client.km.ip = os.path.join(sockets.name, "kernel")
    t0 = time.monotonic()
    failed = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = exc
    finally:
        nbformat.write(nb, out_path)
        sockets.cleanup()
    elapsed = time.monotonic() - t0
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    ran = sum(1 for c in code_cells if c.get("execution_count"))
    summary = []
    for c in code_cells:
        for o in c.get("outputs", []):
            text = o.get("text", "") if o.get("output_type") == "stream" else ""
            summary += [line for line in text.splitlines() if line.startswith("SUMMARY:")]
    print(f"{args.notebook}: {ran}/{len(code_cells)} code cells executed in {elapsed:.1f} s")
    print(f"executed notebook written to {out_path}")
    for line in summary:
        print(line)
    if failed is not None:
        print(
            f"FAILED: {str(failed).strip().splitlines()[-1] if str(failed).strip() else failed}",
            file=sys.stderr,
        )
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
