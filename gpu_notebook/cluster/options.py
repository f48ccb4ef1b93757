"""The settings of a :class:`~gpu_notebook.cluster.Cluster`, in frozen dataclasses grouped by concern (as Ray's
``ScalingConfig``): how many workers and what each holds (:class:`Resources`), what the workers start with and
how Ray is started (:class:`Runtime`), the cost policies that watch the cluster (:class:`Policies`) and what a
``cloud=`` cluster launches (:class:`CloudLaunch`).

Every field is also a keyword of the Cluster, of the same name, so these two are the same cluster:

>>> from gpu_notebook.cluster import Cluster, Policies, Resources
>>> Cluster(resources=Resources(workers=2, cpus_per_worker=0.5), policies=Policies(idle_stop=30))  # doctest: +SKIP
>>> Cluster(workers=2, cpus_per_worker=0.5, idle_stop=30)                                            # doctest: +SKIP

:func:`gather` maps the keywords onto their groups (by :data:`KEYWORDS`, the one table, made from the fields). A
keyword that names no setting is a ``TypeError`` that names the nearest one; a setting given twice (as a keyword
and in its group's dataclass, which holds every setting of its group) is a ``TypeError`` too. Values are checked
when a dataclass is made, with the ``ValueError`` the Cluster always raised (a magic shows it as a usage error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpu_notebook._options import combine, near_miss
from gpu_notebook.cluster._runtime_env import WorkerSetup
from gpu_notebook.distributed import nccl_needs_gpus

__all__ = ["Resources", "Runtime", "Policies", "CloudLaunch", "ClusterOptions", "KEYWORDS", "gather"]


@dataclass(frozen=True)
class Resources:
    """How many rank workers the cluster has, what each one holds, and how they talk (``docs/distributed.md``)."""

    #: rank workers (None: one per GPU of the cluster, or 2 without GPUs; a cloud cluster: one per GPU of its
    #: worker nodes)
    workers: int | None = None
    #: CPUs each worker holds; fractions let several workers fit on a small laptop (None: 1, or less so that
    #: the workers fit on this machine)
    cpus_per_worker: float | None = None
    #: GPUs each worker holds (None: 1 when the cluster has GPUs, else 0)
    gpus_per_worker: float | None = None
    #: torch.distributed's backend: ``auto`` (NCCL when every worker has a GPU, else gloo), ``gloo`` or ``nccl``
    backend: str = "auto"

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError("--workers must be at least 1")
        # checked before anything starts: a nan or inf would pass every comparison later and fail much later
        for name, value in (("cpus", self.cpus_per_worker), ("gpus", self.gpus_per_worker)):
            if value is not None and not 0 <= value < math.inf:
                raise ValueError(f"--{name}-per-worker must be a finite number >= 0, not {value!r}")
        if self.backend == "nccl" and self.gpus_per_worker == 0:
            raise ValueError(nccl_needs_gpus("--gpus-per-worker 0 gives the workers none"))


@dataclass(frozen=True)
class Runtime:
    """What the workers start with (files, packages, variables, which GPUs they see) and how Ray is started."""

    #: ``node``: each worker sees its node's workers' GPUs, local rank k's GPU as ``cuda:k`` (as under
    #: torchrun); ``own``: each sees only its GPUs, as ``cuda:0``
    gpu_visibility: str = "node"
    #: start Ray's dashboard with a local cluster (off: lighter)
    dashboard: bool = False
    #: the workers' working dir, pip packages and environment variables (``--working-dir``, ``--pip``, ``--env``,
    #: ``--env-file``; see :func:`~gpu_notebook.cluster.worker_setup`); None: none
    worker_setup: WorkerSetup | None = None
    #: a Ray ``runtime_env`` of your own for the workers, merged under :attr:`worker_setup`'s
    runtime_env: Mapping[str, Any] | None = None
    #: send this kernel's gpu_notebook to the nodes of a cluster reached by address or launched in a cloud;
    #: False: the nodes must have the same version already (``docs/cloud.md``)
    ship_package: bool = True
    #: the most a rank's value may take, pickled, to come back from a cell (None: 64 MiB; 0: no limit)
    max_result_bytes: int | None = None
    #: the workers (and a local cluster's Ray, as a daemon) outlive the kernel; any kernel re-binds them with
    #: ``Cluster.attach`` (``docs/guide/detach.md``)
    detach: bool = False
    #: a detached cluster's rank logs are also uploaded in batches to this folder or ``s3://bucket/prefix`` (they
    #: are always kept in rotating files on each node; ``docs/guide/logs-collectors.md``)
    log_to: str | None = None


@dataclass(frozen=True)
class Policies:
    """The cost policies that watch a running cluster, and how its nodes are priced (``docs/cost.md``)."""

    #: stop the cluster after this many minutes without cells or GPU utilisation (None: never)
    idle_stop: float | None = None
    #: stop the cluster once it has cost this many US dollars (None: no cap)
    budget: float | None = None
    #: called (no arguments) before a budget stop, to save a checkpoint
    on_budget_checkpoint: Callable[[], Any] | None = None
    #: how long a budget stop waits for :attr:`on_budget_checkpoint`, seconds (None: the cost layer's 120 s)
    budget_checkpoint_timeout_s: float | None = None
    #: ``node_id -> (cloud, instance_type, region, market)`` as a mapping or callable, for the cost meter (None:
    #: a local cluster's nodes cost $0; a cloud cluster prices what it launched)
    node_pricing: Any = None

    def __post_init__(self) -> None:
        for key, value, what in (
            ("idle-stop", self.idle_stop, "minutes"),
            ("budget", self.budget, "US dollars"),
        ):
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"--{key} must be a positive number of {what}, not {value!r}")


@dataclass(frozen=True)
class CloudLaunch:
    """What a cloud cluster launches through Ray's cluster launcher (``docs/cloud.md``). None (or False) leaves a
    setting to :class:`gpu_notebook.cloud.ClusterSpec`'s default."""

    #: ``aws``, ``gcp``, ``azure`` or ``kubernetes``: launch the cluster there (None: no launch)
    cloud: str | None = None
    #: the cloud region (None: the cloud's default)
    region: str | None = None
    #: the GPUs of each worker node, ``TYPE:COUNT`` (``A100:8``)
    gpu: str | None = None
    #: the worker nodes' instance type, instead of :attr:`gpu`
    instance_type: str | None = None
    #: spot (preemptible) worker nodes
    spot: bool = False
    #: the head node's instance type
    head_instance_type: str | None = None
    #: the nodes' image
    image: str | None = None
    #: each node's disk, GB
    disk_gb: int | None = None
    #: on-demand nodes when spot ones cannot be had
    spot_fallback: bool | None = None
    #: the most worker nodes the autoscaler may run
    max_workers: int | None = None
    #: the GCP project
    project: str | None = None
    #: the Kubernetes namespace
    namespace: str | None = None
    #: how the notebook reaches the head: ``direct``, or None for an SSH tunnel
    connect: str | None = None
    #: a reaper process tears the nodes down if this process dies first (False: off)
    reaper: bool = True


#: the dataclass each group keyword of ``Cluster(...)`` takes
GROUPS: dict[str, type[Any]] = {
    "resources": Resources,
    "runtime": Runtime,
    "policies": Policies,
    "launch": CloudLaunch,
}

#: every flat keyword of ``Cluster(...)`` -> the group keyword whose dataclass holds that setting (the keywords
#: are the fields' names)
KEYWORDS: dict[str, str] = {f.name: group for group, cls in GROUPS.items() for f in fields(cls)}


@dataclass(frozen=True)
class ClusterOptions:
    """Every setting of one Cluster, as given (the Cluster resolves the defaults that depend on the Ray cluster)."""

    resources: Resources
    runtime: Runtime
    policies: Policies
    launch: CloudLaunch

    def flat(self) -> dict[str, Any]:
        """The settings that are not None, by keyword (what the cost layer reads as ``cluster.options``)."""
        out = {}
        for group in GROUPS:
            value = getattr(self, group)
            out.update({f.name: getattr(value, f.name) for f in fields(value)})
        return {k: v for k, v in out.items() if v is not None}


def _unknown(names: list[str]) -> TypeError:
    name = names[0]
    hint = near_miss([*KEYWORDS, *GROUPS], name)
    more = f" (and {', '.join(repr(n) for n in names[1:])})" if names[1:] else ""
    return TypeError(
        f"Cluster() got an unexpected keyword argument {name!r}{hint}{more}: its settings are the fields of "
        f"{', '.join(cls.__name__ for cls in GROUPS.values())}"
    )


def gather(groups: Mapping[str, Any], keywords: Mapping[str, Any]) -> ClusterOptions:
    """Every setting of ``Cluster(**groups, **keywords)``: each group's dataclass as given, else made from the
    flat ``keywords`` of its fields (the defaults for the others).

    Raises
    ------
    TypeError
        A keyword that names no setting; a setting given both as a keyword and in its group's dataclass; a group
        given something other than its dataclass.
    ValueError
        A value out of range (from the dataclasses).
    """
    unknown = [name for name in keywords if name not in KEYWORDS]
    if unknown:
        raise _unknown(unknown)
    flat: dict[str, dict[str, Any]] = {group: {} for group in GROUPS}
    for name, value in keywords.items():
        flat[KEYWORDS[name]][name] = value
    made = combine("Cluster", GROUPS, groups, flat, flat)
    return ClusterOptions(**made)
