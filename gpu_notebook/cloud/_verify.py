"""Ask the cloud API, independently of Ray, what is still alive and tagged with a cluster's name.

Used after teardown ("nothing is left") and by ``status``. Each function returns a list of
``{"kind", "id", "state", ...}`` dicts; an empty list means nothing billable carries the cluster's tag.
"""

from __future__ import annotations

from typing import Any

from gpu_notebook.errors import GpuNotebookError

from ._ray_compat import TAG_CLUSTER_NAME

#: EC2 states that still exist (``shutting-down`` is on its way out but is reported too).
AWS_ALIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]


class VerificationUnavailable(GpuNotebookError, RuntimeError):
    """The cloud's SDK is missing here, so leftovers could not be listed."""


def aws_leftovers(
    name: str, region: str, aws_credentials: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """EC2 instances (any live state) and unattached EBS volumes tagged ``ray-cluster-name=<name>``."""
    import boto3

    ec2 = boto3.client("ec2", region_name=region, **(aws_credentials or {}))
    out: list[dict[str, Any]] = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{TAG_CLUSTER_NAME}", "Values": [name]},
            {"Name": "instance-state-name", "Values": AWS_ALIVE_STATES},
        ]
    )
    for page in pages:
        for res in page.get("Reservations", []):
            for inst in res.get("Instances", []):
                out.append(
                    {
                        "kind": "instance",
                        "id": inst["InstanceId"],
                        "state": inst["State"]["Name"],
                        "type": inst.get("InstanceType"),
                        "spot": inst.get("InstanceLifecycle") == "spot",
                    }
                )
    vols = ec2.describe_volumes(Filters=[{"Name": f"tag:{TAG_CLUSTER_NAME}", "Values": [name]}])
    for vol in vols.get("Volumes", []):
        if vol.get("State") not in ("deleted", "deleting"):
            out.append({"kind": "volume", "id": vol["VolumeId"], "state": vol.get("State")})
    return out


def gcp_leftovers(name: str, project: str, zone: str) -> list[dict[str, Any]]:
    """GCE instances labelled ``ray-cluster-name=<name>`` in ``zone``."""
    try:
        import googleapiclient.discovery as discovery
    except ImportError:
        raise VerificationUnavailable("pip install google-api-python-client to verify GCP teardown") from None
    compute = discovery.build("compute", "v1", cache_discovery=False)
    req = compute.instances().list(project=project, zone=zone, filter=f"labels.{TAG_CLUSTER_NAME} = {name}")
    out = []
    while req is not None:
        resp = req.execute()
        for inst in resp.get("items", []):
            if inst.get("status") != "TERMINATED" or inst.get("disks"):
                out.append({"kind": "instance", "id": inst["name"], "state": inst.get("status")})
        req = compute.instances().list_next(previous_request=req, previous_response=resp)
    return out


def azure_leftovers(
    name: str, resource_group: str, subscription_id: str | None = None
) -> list[dict[str, Any]]:
    """Azure VMs tagged ``ray-cluster-name=<name>`` in the resource group."""
    try:
        from azure.identity import DefaultAzureCredential
        from azure.mgmt.compute import ComputeManagementClient
    except ImportError:
        raise VerificationUnavailable(
            "pip install azure-identity azure-mgmt-compute to verify Azure teardown"
        ) from None
    import os

    sub = subscription_id or os.environ.get("AZURE_SUBSCRIPTION_ID")
    if not sub:
        raise VerificationUnavailable("set AZURE_SUBSCRIPTION_ID to verify Azure teardown")
    client = ComputeManagementClient(DefaultAzureCredential(), sub)
    out = []
    for vm in client.virtual_machines.list(resource_group):
        if (vm.tags or {}).get(TAG_CLUSTER_NAME) == name:
            out.append({"kind": "vm", "id": vm.name, "state": getattr(vm, "provisioning_state", None)})
    return out


def leftovers_for(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Leftovers for a rendered/bootstrapped Ray launcher config, dispatched on ``provider.type``."""
    prov = config.get("provider", {})
    name = config["cluster_name"]
    kind = prov.get("type")
    if kind == "aws":
        return aws_leftovers(name, prov["region"], prov.get("aws_credentials"))
    if kind == "gcp":
        return gcp_leftovers(name, prov.get("project_id"), prov.get("availability_zone"))
    if kind == "azure":
        return azure_leftovers(name, prov.get("resource_group"), prov.get("subscription_id"))
    raise VerificationUnavailable(f"no leftover check for provider type {kind!r}")
