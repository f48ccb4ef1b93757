"""Tear a cluster down and prove it through the cloud API; the one cleanup routine for a failed launch.

Teardown never trusts Ray alone: after ``ray down`` (or deleting the RayCluster) it asks the cloud API what
still carries the cluster's tag (:mod:`._verify`) until nothing does or ``verify_timeout_s`` passes, and on AWS
terminates live stragglers directly once. The result is a :class:`TeardownReport`; a teardown reports
failures in it and never raises, because it runs on error paths (a failed launch, a dying kernel's reaper).

:func:`cleanup_failed_launch` is what every failed launch (VM clouds and Kubernetes alike) runs: close the
tunnel, tear down what was created, and keep the saved state only when something may be left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from html import escape
from typing import Any

from . import _kube, _ray_compat
from ._progress import Stages
from ._state import ClusterState, delete_state
from ._tunnels import close_tunnel
from ._verify import VerificationUnavailable, leftovers_for

__all__ = [
    "TeardownReport",
    "cleanup_failed_launch",
    "force_terminate_aws",
    "leftovers",
    "teardown_kube",
    "teardown_resources",
    "teardown_vms",
]

#: ``(CustomObjectsApi, CoreV1Api)`` of the kubernetes client, or stand-ins with the same methods.
KubeClients = tuple[Any, Any]


@dataclass
class TeardownReport:
    """What teardown did and what the cloud API says is left."""

    name: str
    cloud: str
    found_before: list[dict[str, Any]] = field(default_factory=list)
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    verified: bool = False
    errors: list[str] = field(default_factory=list)
    forced: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Verified through the cloud API and nothing left."""
        return self.verified and not self.leftovers

    def message(self) -> str:
        kinds: dict[str, int] = {}
        for item in self.found_before:
            kinds[item["kind"]] = kinds.get(item["kind"], 0) + 1
        found = ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in kinds.items())
        text = f"Cluster {self.name}: " + (f"found {found}; " if found else "")
        if self.forced:
            text += f"terminated {len(self.forced)} straggler(s) directly; "
        if self.clean:
            return (
                text
                + f"terminated. Verified: nothing tagged ray-cluster-name={self.name} is left on {self.cloud}."
            )
        if not self.verified:
            why = "; ".join(self.errors) or "unknown"
            return text + (
                f"teardown requested, but it could NOT be verified through the {self.cloud} API ({why}). "
                "Check the cloud console."
            )
        left = ", ".join(f"{i['kind']} {i['id']} ({i.get('state')})" for i in self.leftovers)
        return text + f"STILL LEFT on {self.cloud}: {left}. Terminate them in the console."

    def __repr__(self) -> str:
        return f"TeardownReport({self.name!r}, clean={self.clean}, leftovers={len(self.leftovers)})"

    def __str__(self) -> str:
        return self.message()

    def _repr_html_(self) -> str:
        color = "green" if self.clean else "red"
        return f"<p style='color:{color}'>{escape(self.message())}</p>"


def leftovers(config: dict[str, Any], report: TeardownReport) -> list[dict[str, Any]] | None:
    """What the cloud API lists under the cluster's tag, or None (the reason added to ``report.errors``)."""
    try:
        return leftovers_for(config)
    except VerificationUnavailable as exc:
        report.errors.append(str(exc))
    # any SDK or API failure (credentials, network, permissions) means "not verified", said in the report
    except Exception as exc:  # noqa: BLE001
        report.errors.append(f"{type(exc).__name__}: {exc}")
    return None


def teardown_vms(
    config: dict[str, Any], stages: Stages, verify_timeout_s: float = 300.0, poll_s: float = 5.0
) -> TeardownReport:
    """``ray down`` for a VM cluster's launcher config, then verify through the cloud API until nothing is left.

    On AWS, instances still live at the first check after ``ray down`` are terminated directly (once).
    """
    name = config["cluster_name"]
    report = TeardownReport(name=name, cloud=config["provider"]["type"])
    report.found_before = leftovers(config, report) or []
    stages("stopping Ray and terminating nodes (ray down)")
    try:
        _ray_compat.teardown_cluster(config)
    # Ray's launcher aborts with ClickException or sys.exit; verification below says what is left
    except (SystemExit, Exception) as exc:  # noqa: BLE001
        report.errors.append(f"teardown_cluster: {type(exc).__name__}: {exc}")
    stages("verifying through the cloud API")
    deadline = time.monotonic() + verify_timeout_s
    forced_once = False
    while True:
        left = leftovers(config, report)
        if left is None:
            report.verified = False
            break
        report.verified = True
        report.leftovers = left
        if not left or time.monotonic() >= deadline:
            break
        live = [i for i in left if i["kind"] == "instance" and i["state"] != "shutting-down"]
        if live and not forced_once and report.cloud == "aws":
            forced_once = True
            report.forced = force_terminate_aws(config, [i["id"] for i in live], report)
        time.sleep(poll_s)
    return report


def force_terminate_aws(config: dict[str, Any], ids: list[str], report: TeardownReport) -> list[str]:
    """``TerminateInstances`` for stragglers ``ray down`` left; the ids terminated (errors go to ``report``)."""
    import boto3
    import botocore.exceptions as bexc

    prov = config["provider"]
    try:
        ec2 = boto3.client("ec2", region_name=prov["region"], **(prov.get("aws_credentials") or {}))
        ec2.terminate_instances(InstanceIds=ids)
        return ids
    except (bexc.BotoCoreError, bexc.ClientError) as exc:
        report.errors.append(f"terminate_instances: {type(exc).__name__}: {exc}")
        return []


def teardown_kube(
    state: ClusterState,
    clients: KubeClients | None = None,
    stages: Stages | None = None,
    verify_timeout_s: float = 300.0,
    poll_s: float = 5.0,
) -> TeardownReport:
    """Delete the cluster's RayCluster, then wait until it and its pods are gone (or ``verify_timeout_s``)."""
    api, core = clients or _kube.make_clients()
    stages = stages or Stages(None)
    ns = state.spec.get("namespace", "default")
    report = TeardownReport(name=state.name, cloud="kubernetes")
    if _kube.get_raycluster(state.name, ns, api) is not None:
        report.found_before.append({"kind": "raycluster", "id": f"{ns}/{state.name}"})
    stages("deleting RayCluster")
    try:
        _kube.delete_raycluster(state.name, ns, api)
    # any API failure is recorded; the listing below says what is left
    except Exception as exc:  # noqa: BLE001
        report.errors.append(f"delete: {type(exc).__name__}: {exc}")
    deadline = time.monotonic() + verify_timeout_s
    while True:
        left: list[dict[str, Any]] = []
        if _kube.get_raycluster(state.name, ns, api) is not None:
            left.append({"kind": "raycluster", "id": f"{ns}/{state.name}", "state": "deleting"})
        left += [
            {"kind": "pod", "id": p, "state": "terminating"} for p in _kube.cluster_pods(state.name, ns, core)
        ]
        report.verified, report.leftovers = True, left
        if not left or time.monotonic() >= deadline:
            return report
        time.sleep(poll_s)


def teardown_resources(
    state: ClusterState,
    stages: Stages,
    kube_clients: KubeClients | None = None,
    verify_timeout_s: float = 300.0,
    poll_s: float = 5.0,
) -> TeardownReport:
    """Tear down whatever ``state`` describes: the RayCluster on Kubernetes, the launcher config's VMs elsewhere."""
    if state.cloud == "kubernetes":
        return teardown_kube(state, kube_clients, stages, verify_timeout_s, poll_s)
    return teardown_vms(state.config, stages, verify_timeout_s, poll_s)


def cleanup_failed_launch(
    state: ClusterState,
    error: str,
    stages: Stages,
    kube_clients: KubeClients | None = None,
    poll_s: float = 5.0,
) -> TeardownReport:
    """Undo a failed launch (VM or Kubernetes): close the tunnel, tear down and verify, record the failure.

    The saved state is deleted when the cloud API confirms nothing is left; otherwise it stays, with status
    ``failed`` and ``error``, so ``%gpu_cluster list`` keeps showing what may still cost money.
    """
    what = "deleting the RayCluster" if state.cloud == "kubernetes" else "cleaning up what was created"
    stages(f"launch failed: {what}")
    close_tunnel(state)
    report = teardown_resources(state, stages, kube_clients, poll_s=poll_s)
    state.status, state.error = "failed", error
    if report.clean:
        delete_state(state.name)
    else:
        state.save()
    return report
