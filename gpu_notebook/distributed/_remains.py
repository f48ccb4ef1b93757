"""What a dead rank left behind: the output the driver had not drained yet, and faulthandler's report.

A rank keeps what it wrote since the driver's last drain in a file on its node (:meth:`._capture.Capture.spool`)
and has ``faulthandler`` write the stack of a fatal signal (a segfault, an abort) into a second one. The files
outlive the process: when the driver sees the worker die, it reads both (:func:`fetch`), locally when the
files are on this machine, else with a small Ray task pinned to the dead worker's node, and removes them.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any

__all__ = ["Remains", "fault_summary", "fetch", "read", "remove", "spool_paths"]

_DIR = "gpu_notebook-output"
_MAX_BYTES = 1_000_000  # the tail of a spool file read back (a rank that printed more before dying)


def spool_paths(group_id: str, pid: int) -> tuple[str, str]:
    """The output file and the fault file of the worker process ``pid`` of group ``group_id`` on its node."""
    base = os.path.join(tempfile.gettempdir(), _DIR, f"{group_id}-{pid}")
    return base + ".out", base + ".fault"


@dataclass(frozen=True)
class Remains:
    """What a dead rank left: output not drained yet, and faulthandler's report ("" for none)."""

    output: str = ""
    fault: str = ""


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - _MAX_BYTES))
            return f.read().decode("utf-8", "replace")
    except OSError:  # never written, or already read
        return ""


def remove(paths: tuple[str, str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:  # already gone
            pass


def read(paths: tuple[str, str]) -> Remains:
    """Read both files (on this machine) and remove them."""
    out, fault = _tail(paths[0]), _tail(paths[1])
    remove(paths)
    return Remains(out, fault)


def fetch(meta: Any, group_id: str, timeout: float = 15.0) -> Remains:
    """What the dead worker described by ``meta`` (its :class:`~._worker.WorkerMeta`) left on its node.

    The files are read here when they are on this machine; otherwise a task on the worker's node (no CPU
    reserved, so it runs even on a full node) reads them. Nothing comes back when that fails.
    """
    pid = meta.get("pid")
    if not isinstance(pid, int):
        return Remains()
    paths = spool_paths(group_id, pid)
    if any(os.path.exists(p) for p in paths):
        return read(paths)
    node_id = meta.get("node_id")
    if not node_id:
        return Remains()
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0, max_retries=0)(read)
        ref = task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        ).remote(paths)
        got = ray.get(ref, timeout=timeout)
    except Exception:  # noqa: BLE001 - the node is gone too, or Ray is going away: the report goes without
        return Remains()
    return got if isinstance(got, Remains) else Remains()


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+)(?: in (?P<func>.+))?$')


def fault_summary(fault: str, cell_file_prefix: str = "<") -> str:
    """One line from faulthandler's report: the fatal error and where the cell was when it happened.

    >>> text = (
    ...     "Fatal Python error: Segmentation fault\\n\\nCurrent thread 0x1 (most recent call first):\\n"
    ...     '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\\n'
    ...     '  File "<cell In[4]>", line 5 in <module>\\n'
    ... )
    >>> fault_summary(text)
    'Fatal Python error: Segmentation fault in string_at, at cell line 5'
    >>> fault_summary("")
    ''
    """
    lines = fault.strip().splitlines()
    head = next((ln.strip() for ln in lines if ln.startswith("Fatal Python error")), "")
    if not head:
        return ""
    frames = [m for ln in lines if (m := _FRAME.match(ln))]
    where = []
    if frames and frames[0].group("func"):
        where.append(f"in {frames[0].group('func')}")
    cell = next(
        (
            m
            for m in frames
            if m.group("file").startswith(cell_file_prefix) and not m.group("file").startswith("<frozen")
        ),
        None,
    )
    if cell is not None:
        where.append(f"at cell line {cell.group('line')}")
    return head + (" " + ", ".join(where) if where else "")
