"""ClusterSpec validation, catalog resolution, unmeetable requests and the dry-run plan."""

from __future__ import annotations

import pytest

from gpu_notebook.cloud import (
    CloudLauncher,
    CloudRequestError,
    ClusterSpec,
    plan_cluster,
    resolve,
    spec_from_options,
)
from gpu_notebook.cloud._spec import default_cluster_name, parse_gpu


def test_parse_gpu():
    assert parse_gpu("A100:8") == ("A100", 8)
    assert parse_gpu("T4") == ("T4", 1)
    for bad in ("", ":8", "A100:x", "A100:0"):
        with pytest.raises(CloudRequestError):
            parse_gpu(bad)


@pytest.mark.parametrize(
    "kw, text",
    [
        (dict(cloud="oracle", gpu="A100:8"), "choose one of aws, gcp, azure, kubernetes"),
        (dict(cloud="aws"), "--gpu TYPE:COUNT"),
        (dict(cloud="aws", gpu="A100:8", instance_type="p4d.24xlarge"), "not both"),
        (dict(cloud="aws", gpu="A100:8", workers=3, max_workers=2), "below workers"),
        (dict(cloud="aws", gpu="A100:8", workers=0), "at least one worker"),
        (dict(cloud="aws", gpu="A100:8", name="Bad_Name"), "lowercase"),
        (dict(cloud="aws", gpu="A100:8", idle_stop_minutes=0), "--idle-stop"),
        (dict(cloud="aws", gpu="A100:8", disk_gb=5), "disk_gb"),
    ],
)
def test_spec_rejects_bad_requests(kw, text):
    with pytest.raises(CloudRequestError, match=text.replace("(", r"\(")):
        ClusterSpec(**kw)


def test_spec_defaults_and_round_trip():
    spec = ClusterSpec(cloud="AWS", gpu="A100:8", workers=2)
    assert spec.cloud == "aws" and spec.region == "us-east-1" and spec.max_workers == 2
    assert spec.name.startswith("gnb-") and not spec.cache_stopped_nodes
    assert ClusterSpec.from_dict(spec.to_dict()) == spec
    assert ClusterSpec(cloud="azure", gpu="A100:8", name="gnb-az").resource_group == "gpu-notebook-gnb-az"
    assert default_cluster_name() != default_cluster_name()


def test_spec_from_magic_options():
    spec = spec_from_options("aws", region="us-west-2", gpu="H100:8", workers=3, spot=True, idle_stop=30)
    assert (spec.region, spec.gpu, spec.workers, spec.spot, spec.idle_stop_minutes) == (
        "us-west-2",
        "H100:8",
        3,
        True,
        30,
    )


def test_resolve_picks_cheapest_matching_instance_with_prices():
    r = resolve(ClusterSpec(cloud="aws", region="us-east-1", gpu="A100:8", spot=True, name="gnb-r"))
    assert r.worker.name == "p4d.24xlarge" and r.worker.gpus_per_node == 8 and r.worker.gpu == "A100"
    assert 0 < r.worker.spot_per_hour < r.worker.on_demand_per_hour
    assert r.head is not None and r.head.name == "m5.xlarge" and r.head.on_demand_per_hour > 0


@pytest.mark.parametrize(
    "kw, expected",
    [
        (dict(gpu="X999:8"), ["X999", "A100", "H100"]),  # unknown GPU: lists the GPUs there are
        (
            dict(gpu="A100:8", region="sa-east-1"),
            ["sa-east-1", "us-east-1", "eu-west-1"],
        ),  # region without it
        (dict(instance_type="p4d.24xlarge", region="sa-east-1"), ["not offered in sa-east-1", "us-east-1"]),
        (dict(instance_type="p9.mega"), ["p9.mega", "g5."]),  # unknown type: names known ones
    ],
)
def test_unmeetable_requests_name_alternatives(kw, expected):
    with pytest.raises(CloudRequestError) as err:
        resolve(ClusterSpec(cloud="aws", name="gnb-u", **kw))
    for text in expected:
        assert text in str(err.value)


def test_plan_prices_on_demand_vs_spot_and_shows_config():
    spec = ClusterSpec(
        cloud="aws",
        region="us-east-1",
        gpu="A100:8",
        workers=2,
        max_workers=4,
        spot=True,
        idle_stop_minutes=60,
        name="gnb-plan",
        image="img:1",
        pip_packages=["torch==2.13.0"],
    )
    plan = plan_cluster(spec)
    worker, head = plan.resolved.worker, plan.resolved.head
    assert plan.hourly("on_demand") == pytest.approx(head.on_demand_per_hour + 2 * worker.on_demand_per_hour)
    assert plan.hourly("spot") == pytest.approx(head.on_demand_per_hour + 2 * worker.spot_per_hour)
    assert plan.hourly("spot", at_max=True) == pytest.approx(
        head.on_demand_per_hour + 4 * worker.spot_per_hour
    )
    text = plan.text()
    assert "dry run: nothing launched" in text
    assert f"${plan.hourly('on_demand'):,.2f}/h all on-demand" in text
    assert "with on-demand fallback" in text and "auto-stop after 60 idle min" in text
    assert "InstanceMarketOptions" in text and "cluster_name: gnb-plan" in text
    assert "setup installs torch==2.13.0; then this kernel's gpu_notebook 0.1.0, sent as " in text
    html = plan._repr_html_()
    assert "<table>" in html and "p4d.24xlarge" in html and "full config" in html
    assert "p4d.24xlarge x2" in repr(plan)
    assert (plan.gpus_per_node, plan.world_size) == (8, 16)


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_plan_for_each_cloud_validates(cloud):
    plan = CloudLauncher().plan(
        ClusterSpec(cloud=cloud, gpu="A100:8", workers=1, spot=True, project="p", name=f"gnb-{cloud}")
    )
    assert plan.kind == "ray" and plan.hourly("spot") < plan.hourly("on_demand")


def test_a_kubernetes_plan_promises_no_head_side_idle_stop():
    """The KubeRay manifest has no idle watcher on the head pod: the plan says the idle stop runs in this kernel,
    and what removes the cluster when the kernel ends first (issue 17 item 8)."""
    import json

    plan = plan_cluster(ClusterSpec(cloud="kubernetes", gpu="A100:8", name="gnb-kidle", idle_stop_minutes=10))
    text = plan.text()
    assert "head auto-stop" not in text and "idle stop after 10 idle min, by this kernel" in text
    assert any("no watcher on the head pod" in n for n in plan.notes)
    assert "_idle_watch" not in json.dumps(plan.config)  # (nothing on the head would stop it)
    aws = plan_cluster(ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-aidle", idle_stop_minutes=10))
    assert "head auto-stop after 10 idle min" in aws.text() and "_idle_watch" in aws.text()


def test_plan_for_kubernetes_is_a_manifest_without_prices():
    plan = plan_cluster(ClusterSpec(cloud="kubernetes", gpu="A100:8", name="gnb-k"))
    assert plan.kind == "kuberay" and plan.config["kind"] == "RayCluster"
    assert "kind: RayCluster" in plan.text() and "no estimate" in plan.text()
