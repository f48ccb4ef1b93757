"""Head-node idle auto-stop: tear the whole cluster down after N idle minutes.

Ray's ``idle_timeout_minutes`` only removes idle *workers*; the head (and ``min_workers``) keep billing
forever. The launcher starts this module on the head after ``ray start``::

    python -m gpu_notebook.cloud._idle_watch --minutes 60 --config ~/ray_bootstrap_config.yaml

It polls Ray's resource usage; the cluster is idle while no CPU or GPU is in use (no task or actor holds
resources, so no notebook worker group is alive). After ``minutes`` of continuous idleness it runs Ray's
teardown with the head's bootstrap config, which terminates every node including the head.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from . import _ray_compat


@dataclass
class IdleTracker:
    """Decides when the cluster has been idle long enough (pure logic, tested without Ray)."""

    minutes: float
    idle_since: float | None = None

    def update(self, busy: bool, now: float) -> bool:
        """Record one observation; True once idle for ``minutes`` without a busy observation."""
        if busy:
            self.idle_since = None
            return False
        if self.idle_since is None:
            self.idle_since = now
        return now - self.idle_since >= self.minutes * 60.0


def ray_busy() -> bool:
    """True when any CPU or GPU of the (already connected) Ray cluster is in use."""
    import ray

    total = ray.cluster_resources()
    avail = ray.available_resources()
    return any(avail.get(k, 0.0) < total.get(k, 0.0) - 1e-6 for k in ("CPU", "GPU"))


def run(
    minutes: float,
    config_path: str,
    busy: Callable[[], bool],
    teardown: Callable[[str], None],
    poll_s: float = 30.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    max_polls: int | None = None,
) -> bool:
    """Poll ``busy`` until idle for ``minutes``, then ``teardown(config_path)``; True if it tore down."""
    tracker = IdleTracker(minutes)
    polls = 0
    while max_polls is None or polls < max_polls:
        polls += 1
        try:
            is_busy = busy()
        # can't tell (Ray restarting, GCS busy, anything): never stop a cluster on an error
        except Exception:  # noqa: BLE001
            is_busy = True
        if tracker.update(is_busy, clock()):
            print(f"idle for {minutes:g} min: tearing the cluster down", flush=True)
            teardown(config_path)
            return True
        sleep(poll_s)
    return False


def _teardown(config_path: str) -> None:
    import os

    import yaml

    with open(os.path.expanduser(config_path)) as f:
        config = yaml.safe_load(f)
    _ray_compat.teardown_cluster(config)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--config", default="~/ray_bootstrap_config.yaml")
    parser.add_argument("--poll", type=float, default=30.0)
    args = parser.parse_args(argv)
    import ray

    ray.init(address="auto", log_to_driver=False)
    run(args.minutes, args.config, ray_busy, _teardown, poll_s=args.poll)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
