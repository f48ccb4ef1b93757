"""Execute a notebook headless with nbclient, write the executed copy beside it and print a summary.

Usage: python scripts/run_notebook.py examples/quickstart.ipynb [--timeout SECONDS]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--kernel", default="python3")
    args = parser.parse_args()

    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(args.notebook, as_version=4)
    out_path = args.notebook.with_suffix(".executed.ipynb")
    client = NotebookClient(
        nb,
        timeout=args.timeout,
        kernel_name=args.kernel,
        resources={"metadata": {"path": str(args.notebook.parent)}},
    )
    t0 = time.monotonic()
    failed = None
    try:
        client.execute()
    except CellExecutionError as exc:
        failed = exc
    finally:
        nbformat.write(nb, out_path)
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
