"""Judge gathered facts: pure functions from per-rank facts (:class:`~._shapes.Facts`) to :class:`Finding` lists.

Nothing here touches a GPU or the network; every check can be tested with synthetic facts (the dicts that
:func:`gpu_notebook.doctor.collect_facts` returns). The checks live by topic: the CUDA stack
(:mod:`._check_cuda`), the GPUs and who uses them (:mod:`._check_gpu`), the network (:mod:`._check_network`),
disk and ``/dev/shm`` (:mod:`._check_host`), versions across ranks (:mod:`._check_versions`). :func:`analyze`
runs them: node-wide checks once per node (on its lowest rank), rank checks once per rank, and cross-node
checks (versions, GPU sharing, reachability) once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ._check_cuda import check_cuda_stack, check_gpu_arch
from ._check_gpu import THROTTLE_REASONS, check_gpu_assignment, check_gpu_health, decode_throttle
from ._check_host import check_storage, probe_errors
from ._check_network import check_network, check_rdma, check_reachability, nccl_select_interfaces
from ._check_versions import VERSION_KEYS, compare_versions
from ._findings import node_labels
from ._report import Finding
from ._shapes import Facts, PeerProbe

__all__ = [
    "THROTTLE_REASONS",
    "VERSION_KEYS",
    "decode_throttle",
    "nccl_select_interfaces",
    "node_labels",
    "check_cuda_stack",
    "check_gpu_arch",
    "check_gpu_health",
    "check_gpu_assignment",
    "check_network",
    "check_rdma",
    "check_storage",
    "check_reachability",
    "compare_versions",
    "analyze",
]


def analyze(facts: Sequence[Facts], probes: Iterable[PeerProbe] | None = None) -> list[Finding]:
    """All findings for a set of per-rank facts (one dict per rank, any order) and optional peer probes."""
    facts = sorted(facts, key=lambda f: (f.get("rank") is None, f.get("rank") or 0))
    labels = node_labels(facts)
    first_of_node: dict[str, int] = {}
    for i in range(len(facts)):
        first_of_node.setdefault(labels[i], i)
    multi_node = len(first_of_node) > 1
    findings: list[Finding] = []
    for node, i in first_of_node.items():
        f = facts[i]
        findings += check_cuda_stack(f, node)
        findings += check_gpu_arch(f, node)
        findings += check_gpu_health(f, node)
        findings += check_network(f, node, multi_node)
        findings += check_rdma(f, node, multi_node)
        findings += check_storage(f, node)
    findings += check_gpu_assignment(facts, labels)
    findings += check_reachability(facts, labels, list(probes or []))
    findings += compare_versions(facts, labels)
    for i, f in enumerate(facts):
        findings += probe_errors(f, labels[i])
    return findings
