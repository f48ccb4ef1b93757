"""How many workers a cluster starts, and what each holds, on the connected Ray cluster."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["size_workers"]


def size_workers(cluster: Any) -> tuple[int, float, float]:
    """The workers, CPUs and GPUs each of ``cluster``'s group on the connected Ray: what was asked, else what fits."""
    import ray

    total = ray.cluster_resources()
    cluster_gpus = int(total.get("GPU", 0))
    cluster_cpus = float(total.get("CPU", os.cpu_count() or 1))
    asked = cluster.settings.resources
    gpus = asked.gpus_per_worker if asked.gpus_per_worker is not None else (1 if cluster_gpus else 0)
    ranks = cluster.provider.ranks()
    if ranks:
        workers = ranks
    else:
        workers = asked.workers or (max(1, int(cluster_gpus // gpus)) if gpus else 2)
    if asked.cpus_per_worker is not None:
        cpus = asked.cpus_per_worker
    else:
        # the CPUs free now, so that a second notebook joining this Ray ("use in this notebook" in the panel)
        # fits its workers beside the first one's; when too few are free, the share of the total (the start
        # then waits for them and says who holds them)
        free_cpus = float(ray.available_resources().get("CPU", 0.0))
        share = free_cpus if free_cpus >= 0.1 * workers else cluster_cpus
        cpus = min(1.0, max(0.1, int(share / workers * 10) / 10))
    return workers, cpus, gpus
