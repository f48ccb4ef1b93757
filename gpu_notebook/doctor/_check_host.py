"""Checks of the host around the GPUs: free disk, the size of ``/dev/shm``, and probes that could not run.

Too small a ``/dev/shm`` (Docker's default is 64 MiB) kills DataLoader workers with "Bus error"; a full disk
fails the first checkpoint. Neither shows up until training is well under way, so the doctor looks first.
"""

from __future__ import annotations

from .._display import fmt_bytes
from ._findings import Findings
from ._report import ERROR, OK, WARNING, Finding
from ._shapes import Facts

__all__ = ["GiB", "check_storage", "probe_errors"]

GiB = 2**30


def check_storage(facts: Facts, node: str) -> list[Finding]:
    """Free disk space and /dev/shm size (too small a /dev/shm breaks DataLoader workers)."""
    out = Findings("disk", node)
    storage = facts.get("storage") or {}
    if storage:
        path, info = min(storage.items(), key=lambda kv: kv[1]["free"])
        free = info["free"] / GiB
        level = ERROR if free < 5 else WARNING if free < 20 else OK
        fix = (
            "" if level == OK else "free space or attach a bigger volume; keep checkpoints in object storage"
        )
        out.add(
            level, f"{fmt_bytes(info['free'], unit='GiB')} free on {path} (least of the checked paths)", fix
        )
    shm = facts.get("shm")
    if shm is None:
        out.warn("/dev/shm is missing", "mount a tmpfs at /dev/shm (or --ipc=host)", check="shm")
        return out.findings
    total = shm["total"] / GiB
    level = ERROR if total < 0.25 else WARNING if total < 1 else OK
    fix = (
        ""
        if level == OK
        else "docker run --shm-size=16g (or --ipc=host); on Kubernetes mount an emptyDir with medium: Memory"
    )
    msg = f"/dev/shm is {fmt_bytes(shm['total'], unit='GiB', digits=2)} ({fmt_bytes(shm['free'], unit='GiB', digits=2)} free)"
    if level != OK:
        msg += ": DataLoader workers die with 'Bus error' / 'insufficient shared memory'"
    return out.add(level, msg, fix, check="shm").findings


def probe_errors(facts: Facts, node: str) -> list[Finding]:
    """A warning per fact-gathering probe that failed on this rank (its facts are defaults, not measurements)."""
    out = Findings("probe", node, facts.get("rank"))
    for name, err in (facts.get("probe_errors") or {}).items():
        out.warn(f"probe {name} failed: {err}", "")
    return out.findings
