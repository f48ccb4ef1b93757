"""Teardown verification against each cloud's API: AWS through moto, GCP and Azure through SDK fakes.

``ray down`` is never trusted alone: after it, the cloud API is asked what still carries the cluster's tag.
Here Ray's teardown is replaced by what a real one may do (remove everything, abort half-way, leave
stragglers), and the verification, the AWS straggler termination and the report are checked against:

- AWS: moto's in-process EC2 (instances in every state, tagged EBS volumes left unattached);
- GCP: :class:`~gpu_notebook.testing.cloud.FakeGCE` under the real google-api-python-client (its request
  building and paging run for real);
- Azure: :class:`~gpu_notebook.testing.cloud.FakeAzureCompute`, whose recorded calls are bound to the real
  ``ComputeManagementClient`` signatures.
"""

from __future__ import annotations

import inspect

import pytest

from gpu_notebook.cloud import TeardownReport, _ray_compat
from gpu_notebook.cloud._progress import Stages
from gpu_notebook.cloud._teardown import force_terminate_aws, teardown_vms
from gpu_notebook.cloud._verify import TAG_CLUSTER_NAME, aws_leftovers, azure_leftovers, gcp_leftovers
from gpu_notebook.testing.cloud import FakeAzureCompute, FakeGCE

REGION = "us-east-1"
NAME = "gnb-verify"
MOTO_AMI = "ami-12c6146b"  # one of the images moto knows in every region


def _aws_config(name: str = NAME) -> dict:
    return {"cluster_name": name, "provider": {"type": "aws", "region": REGION}}


@pytest.fixture
def ec2(monkeypatch):
    """moto's in-process EC2 with fake credentials; nothing leaves this process."""
    moto = pytest.importorskip("moto")
    boto3 = pytest.importorskip("boto3")
    for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(key, raising=False)
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def _tags(name: str, resource: str = "instance") -> list[dict]:
    return [{"ResourceType": resource, "Tags": [{"Key": TAG_CLUSTER_NAME, "Value": name}]}]


def _run(ec2, name: str, n: int = 1) -> list[str]:
    resp = ec2.run_instances(
        ImageId=MOTO_AMI, InstanceType="g5.xlarge", MinCount=n, MaxCount=n, TagSpecifications=_tags(name)
    )
    return [i["InstanceId"] for i in resp["Instances"]]


def test_aws_leftovers_are_live_instances_and_unattached_volumes_of_this_cluster_only(ec2):
    mine = _run(ec2, NAME, 2)
    stopped = _run(ec2, NAME)[0]
    ec2.stop_instances(InstanceIds=[stopped])  # a stopped instance still bills its disks
    gone = _run(ec2, NAME)[0]
    ec2.terminate_instances(InstanceIds=[gone])
    other = _run(ec2, "someone-else")[0]
    volume = ec2.create_volume(
        AvailabilityZone=f"{REGION}a", Size=100, TagSpecifications=_tags(NAME, "volume")
    )
    deleted = ec2.create_volume(
        AvailabilityZone=f"{REGION}a", Size=8, TagSpecifications=_tags(NAME, "volume")
    )
    ec2.delete_volume(VolumeId=deleted["VolumeId"])

    left = aws_leftovers(NAME, REGION)
    instances = {i["id"]: i["state"] for i in left if i["kind"] == "instance"}
    assert set(instances) == {*mine, stopped} and other not in instances and gone not in instances
    assert instances[stopped] in ("stopping", "stopped")
    volumes = [i for i in left if i["kind"] == "volume"]
    assert volumes == [{"kind": "volume", "id": volume["VolumeId"], "state": "available"}]


def test_stragglers_ray_left_are_terminated_directly_and_the_report_is_clean(ec2, monkeypatch):
    ids = _run(ec2, NAME, 2)
    calls = []

    def ray_down_that_aborts(config):
        calls.append(config["cluster_name"])
        raise SystemExit(1)  # Ray's launcher aborts with sys.exit; it terminated nothing

    monkeypatch.setattr(_ray_compat, "teardown_cluster", ray_down_that_aborts)
    seen: list[str] = []
    report = teardown_vms(_aws_config(), Stages(seen.append), verify_timeout_s=30, poll_s=0.01)
    assert calls == [NAME]
    assert sorted(report.forced) == sorted(ids)
    assert report.verified and report.clean, report.message()
    assert [i["kind"] for i in report.found_before] == ["instance", "instance"]
    assert any("teardown_cluster: SystemExit" in e for e in report.errors)
    assert "terminated 2 straggler(s) directly" in report.message() and "Verified: nothing tagged" in str(
        report
    )
    states = {
        i["InstanceId"]: i["State"]["Name"]
        for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
        for i in r["Instances"]
    }
    assert set(states.values()) <= {"shutting-down", "terminated"}
    assert any("verifying through the cloud API" in line for line in seen)


def test_an_unattached_volume_keeps_the_report_dirty_and_is_named(ec2, monkeypatch):
    _run(ec2, NAME)
    vol = ec2.create_volume(AvailabilityZone=f"{REGION}a", Size=50, TagSpecifications=_tags(NAME, "volume"))

    def ray_down(config):  # terminates the instances, as `ray down` does, but not the volume
        live = [i["id"] for i in aws_leftovers(config["cluster_name"], REGION) if i["kind"] == "instance"]
        ec2.terminate_instances(InstanceIds=live)

    monkeypatch.setattr(_ray_compat, "teardown_cluster", ray_down)
    report = teardown_vms(_aws_config(), Stages(None), verify_timeout_s=0.2, poll_s=0.05)
    assert report.verified and not report.clean and report.forced == []
    assert report.leftovers == [{"kind": "volume", "id": vol["VolumeId"], "state": "available"}]
    assert f"STILL LEFT on aws: volume {vol['VolumeId']} (available)" in report.message()


def test_a_failed_straggler_termination_is_reported_not_raised(ec2):
    report = TeardownReport(NAME, "aws")
    assert force_terminate_aws(_aws_config(), ["i-0123456789abcdef0"], report) == []
    assert report.errors and report.errors[0].startswith("terminate_instances: ClientError")


# --- GCP -----------------------------------------------------------------------------------------------------


@pytest.fixture
def gce(monkeypatch):
    """FakeGCE answering the real discovery client that gcp_leftovers builds."""
    discovery = pytest.importorskip(
        "googleapiclient.discovery", reason="google-api-python-client (the gcp extra) is not installed"
    )
    fake = FakeGCE(project="proj", page_size=2)
    real_build = discovery.build
    builds = []

    def build(*args, **kwargs):
        inspect.signature(real_build).bind(*args, **kwargs)  # the library's call fits the real build()
        builds.append((args, kwargs))
        return real_build(*args, http=fake, static_discovery=True, **kwargs)

    monkeypatch.setattr(discovery, "build", build)
    fake.builds = builds
    return fake


def _gcp_config(name: str = NAME) -> dict:
    return {
        "cluster_name": name,
        "provider": {"type": "gcp", "project_id": "proj", "availability_zone": "us-central1-a"},
    }


def test_gcp_leftovers_page_through_the_label_filter_and_count_stopped_instances_with_disks(gce):
    zone, labels = "us-central1-a", {TAG_CLUSTER_NAME: NAME}
    for i in range(3):
        gce.add(f"{NAME}-worker-{i}", zone, "RUNNING", labels)
    gce.add(f"{NAME}-head", zone, "TERMINATED", labels, disks=1)  # stopped, its disk still bills
    gce.add(f"{NAME}-gone", zone, "TERMINATED", labels, disks=0)
    gce.add("other-head", zone, "RUNNING", {TAG_CLUSTER_NAME: "other"})
    gce.add(f"{NAME}-elsewhere", "europe-west4-a", "RUNNING", labels)

    left = gcp_leftovers(NAME, "proj", zone)
    assert sorted((i["id"], i["state"]) for i in left) == [
        (f"{NAME}-head", "TERMINATED"),
        (f"{NAME}-worker-0", "RUNNING"),
        (f"{NAME}-worker-1", "RUNNING"),
        (f"{NAME}-worker-2", "RUNNING"),
    ]
    lists = [uri for method, uri in gce.requests if method == "GET"]
    assert len(lists) == 3 and "pageToken=2" in lists[1]  # 5 matches, 2 per page: the client paged
    assert gce.builds == [(("compute", "v1"), {"cache_discovery": False})]


def test_gcp_teardown_is_verified_clean_once_ray_removed_the_nodes(gce, monkeypatch):
    for i in range(2):
        gce.add(f"{NAME}-{i}", "us-central1-a", "RUNNING", {TAG_CLUSTER_NAME: NAME})
    monkeypatch.setattr(_ray_compat, "teardown_cluster", lambda config: gce.instances.clear())
    report = teardown_vms(_gcp_config(), Stages(None), verify_timeout_s=5, poll_s=0.01)
    assert report.verified and report.clean and len(report.found_before) == 2 and report.forced == []
    assert "nothing tagged ray-cluster-name=gnb-verify is left on gcp" in report.message()


def test_gcp_nodes_ray_left_are_named_in_the_report(gce, monkeypatch):
    gce.add(f"{NAME}-head", "us-central1-a", "STOPPING", {TAG_CLUSTER_NAME: NAME})

    def ray_down(config):
        raise RuntimeError("gcp provider: 403 insufficient permissions")

    monkeypatch.setattr(_ray_compat, "teardown_cluster", ray_down)
    report = teardown_vms(_gcp_config(), Stages(None), verify_timeout_s=0.1, poll_s=0.02)
    assert report.verified and not report.clean and report.forced == []  # direct termination is AWS only
    assert f"STILL LEFT on gcp: instance {NAME}-head (STOPPING)" in report.message()
    assert any("403" in e for e in report.errors)


# --- Azure ---------------------------------------------------------------------------------------------------


@pytest.fixture
def azure(monkeypatch):
    """FakeAzureCompute in place of ComputeManagementClient; a credential that needs no login."""
    compute = pytest.importorskip(
        "azure.mgmt.compute", reason="azure-mgmt-compute (the azure extra) is not installed"
    )
    identity = pytest.importorskip(
        "azure.identity", reason="azure-identity (the azure extra) is not installed"
    )
    fake = FakeAzureCompute()
    fake.real_client = compute.ComputeManagementClient
    monkeypatch.setattr(compute, "ComputeManagementClient", fake)
    monkeypatch.setattr(identity, "DefaultAzureCredential", lambda **kwargs: object())
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "sub-0")
    return fake


def _azure_config(name: str = NAME) -> dict:
    return {"cluster_name": name, "provider": {"type": "azure", "resource_group": "rg"}}


def test_azure_leftovers_match_the_tag_in_the_resource_group(azure):
    azure.add(f"{NAME}-head", "rg", {TAG_CLUSTER_NAME: NAME}, "Succeeded")
    azure.add(f"{NAME}-w0", "rg", {TAG_CLUSTER_NAME: NAME}, "Deleting")
    azure.add("untagged", "rg")
    azure.add("other", "rg", {TAG_CLUSTER_NAME: "other"})
    azure.add(f"{NAME}-elsewhere", "rg2", {TAG_CLUSTER_NAME: NAME})
    left = azure_leftovers(NAME, "rg")
    assert sorted((i["kind"], i["id"], i["state"]) for i in left) == [
        ("vm", f"{NAME}-head", "Succeeded"),
        ("vm", f"{NAME}-w0", "Deleting"),
    ]
    assert azure.subscription_id == "sub-0"


def test_the_azure_fake_is_called_the_way_the_real_client_is(azure):
    from azure.mgmt.compute import models, operations

    real = {
        "ComputeManagementClient": inspect.signature(azure.real_client.__init__),
        "virtual_machines.list": inspect.signature(operations.VirtualMachinesOperations.list),
    }
    azure.add(f"{NAME}-head", "rg", {TAG_CLUSTER_NAME: NAME})
    azure_leftovers(NAME, "rg")
    assert [c[0] for c in azure.calls] == ["ComputeManagementClient", "virtual_machines.list"]
    for name, args, kwargs in azure.calls:
        sent = {k: v for k, v in kwargs.items() if v is not None}
        real[name].bind(object(), *args, **sent)  # raises TypeError if the library's call does not fit
    vm = models.VirtualMachine(location="eastus")
    assert all(hasattr(vm, attr) for attr in ("name", "tags", "provisioning_state"))


def test_azure_teardown_is_verified_and_names_what_is_left(azure, monkeypatch):
    azure.add(f"{NAME}-head", "rg", {TAG_CLUSTER_NAME: NAME})
    azure.add(f"{NAME}-w0", "rg", {TAG_CLUSTER_NAME: NAME})
    monkeypatch.setattr(_ray_compat, "teardown_cluster", lambda config: azure.remove(f"{NAME}-w0", "rg"))
    report = teardown_vms(_azure_config(), Stages(None), verify_timeout_s=0.1, poll_s=0.02)
    assert report.verified and not report.clean and len(report.found_before) == 2
    assert f"STILL LEFT on azure: vm {NAME}-head (Succeeded)" in report.message()
    monkeypatch.setattr(_ray_compat, "teardown_cluster", lambda config: azure.vms.clear())
    assert teardown_vms(_azure_config(), Stages(None), verify_timeout_s=5, poll_s=0.01).clean


def test_azure_without_a_subscription_is_unverified(azure, monkeypatch):
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID")
    monkeypatch.setattr(_ray_compat, "teardown_cluster", lambda config: None)
    report = teardown_vms(_azure_config(), Stages(None), verify_timeout_s=0, poll_s=0)
    assert not report.verified and "set AZURE_SUBSCRIPTION_ID" in report.message()
