"""Clusters: a local Ray cluster (the embedded default), an existing one, or cloud nodes, with a persistent
worker group.

The modules: ``_cluster`` (the :class:`Cluster`), ``providers/`` (where its Ray comes from: local, address,
cloud), ``_connect`` (the process's one Ray connection), ``_status`` (what ``status()`` returns), ``_manager``
(the kernel's clusters; the manager itself lives in :mod:`gpu_notebook._registry`), ``options`` (a Cluster's
settings in frozen dataclasses: :class:`Resources`, :class:`Runtime`, :class:`Policies`, :class:`CloudLaunch`),
``_runtime_env`` (what the workers start with: ``--working-dir``, ``--pip``, ``--env``), ``_run`` (a script
run as torchrun would), ``_detached`` and ``_keeper`` (clusters whose workers outlive the kernel, and the actor
that keeps them).
"""

from gpu_notebook import panel as _panel
from gpu_notebook.cluster._cluster import Cluster
from gpu_notebook.cluster._connect import ConnectError
from gpu_notebook.cluster._detached import DetachedCluster, attachable
from gpu_notebook.cluster._detached import records as detached_records
from gpu_notebook.cluster._errors import ClusterError
from gpu_notebook.cluster._manager import ClusterManager, get_manager
from gpu_notebook.cluster._run import run_script
from gpu_notebook.cluster._runtime_env import EnvReport, WorkerSetup, rank_env, worker_setup
from gpu_notebook.cluster._status import ClusterStatus, NodeInfo, WorkerInfo
from gpu_notebook.cluster.options import CloudLaunch, Policies, Resources, Runtime

_panel.listen()  # the JupyterLab panel hears of every cluster this process starts or stops

__all__ = [
    "CloudLaunch",
    "Cluster",
    "ClusterError",
    "ClusterManager",
    "ClusterStatus",
    "ConnectError",
    "DetachedCluster",
    "EnvReport",
    "NodeInfo",
    "Policies",
    "Resources",
    "Runtime",
    "WorkerInfo",
    "WorkerSetup",
    "attachable",
    "detached_records",
    "get_manager",
    "rank_env",
    "run_script",
    "worker_setup",
]
