"""Placing a group's workers: one resource bundle per worker, reserved together in a Ray placement group.

The group reserves every worker's resources before it starts any worker, so a group that does not fit fails
in one clear message (what was asked, what is free, what to change) instead of leaving some ranks waiting.
"""

from __future__ import annotations

from typing import Any

from gpu_notebook._display import Progress

__all__ = ["available_text", "fmt_bundle", "placement_error", "wait_until_placed", "worker_bundle"]


def worker_bundle(cpus: float, gpus: float) -> dict[str, float]:
    """The resources of one worker, as a placement-group bundle.

    Ray refuses an empty bundle, so a worker asking for nothing reserves a sliver of a CPU.

    >>> worker_bundle(1, 0), worker_bundle(0, 1), worker_bundle(0, 0)
    ({'CPU': 1}, {'GPU': 1}, {'CPU': 0.001})
    """
    bundle: dict[str, float] = {"CPU": cpus}
    if gpus:
        bundle["GPU"] = gpus
    if not cpus:
        bundle = {k: v for k, v in bundle.items() if v} or {"CPU": 0.001}
    return bundle


def fmt_bundle(bundle: dict[str, float]) -> str:
    """``"0.5 CPU, 1 GPU"``."""
    return ", ".join(f"{v:g} {k}" for k, v in bundle.items())


def wait_until_placed(pg: Any, timeout: float, say: Progress) -> bool:
    """Wait for the placement group's resources; False when ``timeout`` seconds passed first.

    Says what is free every 5 seconds of waiting (an autoscaler may be adding nodes).
    """
    import time

    import ray

    deadline = time.monotonic() + timeout
    waited_msg = 0.0
    while True:
        ready, _ = ray.wait([pg.ready()], timeout=1.0)
        if ready:
            return True
        now = time.monotonic()
        if now > deadline:
            return False
        if now - waited_msg > 5:
            waited_msg = now
            say(f"waiting for resources ({available_text()})")


def available_text() -> str:
    """``"free 2/4 CPU, 0/0 GPU"``: what the cluster has left, for a message."""
    import ray

    try:
        avail = ray.available_resources()
        total = ray.cluster_resources()
    except Exception:  # noqa: BLE001 - only a hint in a message: Ray's state API must not fail the start
        return "cluster resources unknown"
    return (
        f"free {avail.get('CPU', 0):g}/{total.get('CPU', 0):g} CPU, "
        f"{avail.get('GPU', 0):g}/{total.get('GPU', 0):g} GPU"
    )


def placement_error(size: int, bundle: dict[str, float], timeout: float) -> str:
    """Why ``size`` workers of ``bundle`` could not be placed, and what to ask for instead."""
    return (
        f"could not place {size} worker(s) of {fmt_bundle(bundle)} each within "
        f"{timeout:g} s ({available_text()}). Ask for fewer workers, fewer CPUs per "
        f"worker (fractions such as --cpus-per-worker 0.5 are allowed) or fewer GPUs, or add nodes."
    )
