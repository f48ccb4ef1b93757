"""Clusters: a local Ray cluster (the embedded default) or an existing one, with a persistent worker group."""

from gpu_notebook.cluster._cluster import Cluster, ClusterError, ClusterStatus, NodeInfo, WorkerInfo
from gpu_notebook.cluster._connect import ConnectError
from gpu_notebook.cluster._manager import ClusterManager, get_manager

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterManager",
    "ClusterStatus",
    "ConnectError",
    "NodeInfo",
    "WorkerInfo",
    "get_manager",
]
