"""Entry points of the doctor: ``diagnose(cluster)`` over every rank, ``diagnose_local()`` for this process."""

from __future__ import annotations

from collections.abc import Sequence

from gpu_notebook.doctor._checks import analyze, node_labels
from gpu_notebook.doctor._facts import collect_facts, probe_peers, stop_listener
from gpu_notebook.doctor._report import DoctorReport
from gpu_notebook.doctor._shapes import Endpoint, Facts, PeerProbe, RankCaller

__all__ = ["diagnose", "diagnose_local", "diagnose_facts"]


def _collect_and_listen() -> Facts:
    return collect_facts(listen=True, kernel_probe="here")  # a rank's worker: it uses the GPU anyway


def diagnose_facts(
    facts: Sequence[Facts],
    probes: Sequence[PeerProbe] | None = None,
    title: str = "gpu_notebook doctor",
) -> DoctorReport:
    """Build a report from already gathered per-rank facts (e.g. synthetic ones, or saved ones)."""
    return DoctorReport(analyze(facts, probes), list(facts), title)


def diagnose(cluster: RankCaller, timeout: float | None = 120.0) -> DoctorReport:
    """Check every rank of a cluster and return the findings.

    Runs three calls through ``cluster.call``: each rank gathers its facts and opens a test TCP listener;
    each rank connects to one listener per node; every rank closes its listener.

    Parameters
    ----------
    cluster
        Anything with ``call(fn, *args, timeout=...) -> list`` running ``fn`` in every rank's process, such as
        :class:`gpu_notebook.Cluster` or :class:`gpu_notebook.doctor.LocalGroup`.
    timeout
        Seconds allowed for each of the two calls.

    Examples
    --------
    >>> report = diagnose(cluster)          # doctest: +SKIP
    >>> report.errors                       # doctest: +SKIP
    """
    facts = list(cluster.call(_collect_and_listen, timeout=timeout))
    labels = node_labels(facts)
    endpoints: list[Endpoint] = []
    seen: set[str] = set()
    for i, f in enumerate(facts):
        if labels[i] in seen or not f.get("listen_port") or not f.get("node_ip"):
            continue
        seen.add(labels[i])
        endpoints.append({"node": labels[i], "ip": f["node_ip"], "port": f["listen_port"]})
    try:
        probes = list(cluster.call(probe_peers, endpoints, timeout=timeout))
    finally:
        cluster.call(stop_listener, timeout=timeout)
    name = getattr(cluster, "name", None)
    return diagnose_facts(facts, probes, f"gpu_notebook doctor: {name}" if name else "gpu_notebook doctor")


def diagnose_local() -> DoctorReport:
    """Check this process and its node only (no cluster needed): driver, CUDA, GPUs, network, disk."""
    return diagnose_facts([collect_facts()], None, "gpu_notebook doctor: this process")
