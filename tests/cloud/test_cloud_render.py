"""Rendered cluster configs: Ray's own validation (what ``ray up`` runs), spot markers per cloud, golden files.

Regenerate the golden files after an intended change with ``GNB_UPDATE_GOLDEN=1 pytest tests/cloud/test_cloud_render.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_notebook.cloud import ClusterSpec, render_kuberay_manifest, render_ray_config, resolve, to_yaml
from gpu_notebook.cloud import _ray_compat as rc
from gpu_notebook.cloud._render import (
    HEAD_TYPE,
    OWNER_TAG,
    WORKER_ONDEMAND_TYPE,
    WORKER_SPOT_TYPE,
    WORKER_TYPE,
)
from gpu_notebook.cloud._ship import ShippedPackage

pytest.importorskip("ray")
yaml = pytest.importorskip("yaml")

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "cloud"
PINNED = dict(image="rayproject/ray:2.60.0-py311-gpu", pip_packages=["torch==2.13.0"])
# a shipped package with fixed paths and digest, so the golden files do not change with every edit of the code
GOLDEN_PACKAGE = ShippedPackage(
    "0.1.0",
    "0123456789abcdef" * 4,
    Path("/home/user/.cache/gpu_notebook/packages/0.1.0-0123456789abcdef/tree/gpu_notebook"),
    Path("/home/user/.cache/gpu_notebook/packages/0.1.0-0123456789abcdef/sdist/gpu_notebook-0.1.0.tar.gz"),
)

# name -> typical request
REQUESTS = {
    "aws_a100x8_spot_idle": dict(
        cloud="aws",
        region="us-east-1",
        gpu="A100:8",
        workers=2,
        spot=True,
        idle_stop_minutes=60,
        name="gnb-golden-aws",
    ),
    "aws_g5_instance_ondemand": dict(
        cloud="aws",
        region="us-west-2",
        instance_type="g5.xlarge",
        workers=1,
        max_workers=4,
        name="gnb-golden-g5",
        disk_gb=100,
    ),
    "gcp_t4_preemptible": dict(
        cloud="gcp",
        region="us-central1",
        gpu="T4:1",
        workers=2,
        spot=True,
        project="my-project",
        name="gnb-golden-gcp",
    ),
    "azure_a100x8_spot": dict(
        cloud="azure",
        region="eastus",
        gpu="A100:8",
        workers=1,
        spot=True,
        spot_fallback=False,
        name="gnb-golden-azure",
    ),
    "kubernetes_a100x8": dict(
        cloud="kubernetes", gpu="A100:8", workers=2, spot=True, name="gnb-golden-k8s", namespace="ml"
    ),
}


def _render(kw):
    spec = ClusterSpec(**{**PINNED, **kw})
    if spec.cloud == "kubernetes":
        return render_kuberay_manifest(spec)
    return render_ray_config(spec, resolve(spec), GOLDEN_PACKAGE)


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_golden_files(name, monkeypatch):
    monkeypatch.setattr("gpu_notebook.cloud._render.local_ray_version", lambda: "2.60.0")
    text = to_yaml(_render(REQUESTS[name]))
    path = GOLDEN / f"{name}.yaml"
    if os.environ.get("GNB_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden file {path}; run with GNB_UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("name", sorted(n for n in REQUESTS if not n.startswith("kubernetes")))
def test_golden_configs_pass_rays_validation(name):
    config = yaml.safe_load((GOLDEN / f"{name}.yaml").read_text())
    prepared = rc.prepare_and_validate(config)
    assert prepared["cluster_name"] == REQUESTS[name]["name"]
    assert prepared["provider"]["cache_stopped_nodes"] is False
    # prepare_config merged setup commands into head/worker setup like `ray up` does: every node installs the
    # sent sdist, and nothing named gpu_notebook comes from a package index
    sent = GOLDEN_PACKAGE.remote_sdist
    # the sdist's folder is mounted: Ray puts its contents in the remote folder, so the file lands at `sent`
    assert prepared["file_mounts"] == {
        "~/gpu_notebook_dist/0123456789abcdef": str(GOLDEN_PACKAGE.sdist.parent)
    }
    assert sent == "~/gpu_notebook_dist/0123456789abcdef/gpu_notebook-0.1.0.tar.gz"
    for key in ("head_setup_commands", "worker_setup_commands"):
        assert any(f"pip install -q --force-reinstall --no-deps {sent}" in c for c in prepared[key])
        assert not any("gpu_notebook==" in c for c in prepared[key])


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
@pytest.mark.parametrize("spot", [False, True])
def test_every_cloud_validates_spot_and_on_demand(cloud, spot):
    spec = ClusterSpec(
        cloud=cloud, gpu="A100:8", workers=2, max_workers=3, spot=spot, project="p", name="gnb-v", **PINNED
    )
    config = render_ray_config(spec, resolve(spec))
    prepared = rc.prepare_and_validate(config)
    types = prepared["available_node_types"]
    assert prepared["max_workers"] == 3
    if spot:
        assert set(types) == {HEAD_TYPE, WORKER_SPOT_TYPE, WORKER_ONDEMAND_TYPE}
        assert types[WORKER_SPOT_TYPE]["min_workers"] == 2 and types[WORKER_ONDEMAND_TYPE]["min_workers"] == 0
        assert types[WORKER_SPOT_TYPE]["priority"] > types[WORKER_ONDEMAND_TYPE]["priority"]
        spot_cfg = types[WORKER_SPOT_TYPE]["node_config"]
        od_cfg = types[WORKER_ONDEMAND_TYPE]["node_config"]
    else:
        assert set(types) == {HEAD_TYPE, WORKER_TYPE}
        spot_cfg, od_cfg = None, types[WORKER_TYPE]["node_config"]
    head_cfg = types[HEAD_TYPE]["node_config"]
    assert types[WORKER_SPOT_TYPE if spot else WORKER_TYPE]["resources"]["GPU"] == 8
    assert "GPU" not in types[HEAD_TYPE]["resources"]
    if cloud == "aws":
        if spot_cfg:
            assert spot_cfg["InstanceMarketOptions"]["MarketType"] == "spot"
        assert "InstanceMarketOptions" not in od_cfg and "InstanceMarketOptions" not in head_cfg
        assert od_cfg["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 200
        assert {"Key": OWNER_TAG, "Value": "gnb-v"} in od_cfg["TagSpecifications"][0]["Tags"]
    elif cloud == "gcp":
        if spot_cfg:
            assert spot_cfg["scheduling"]["preemptible"] is True
            assert spot_cfg["scheduling"]["provisioningModel"] == "SPOT"
            assert spot_cfg["scheduling"]["instanceTerminationAction"] == "DELETE"
        assert "preemptible" not in od_cfg["scheduling"] and "provisioningModel" not in od_cfg["scheduling"]
        assert od_cfg["scheduling"]["onHostMaintenance"] == "TERMINATE"  # required with GPUs
        assert od_cfg["disks"][0]["initializeParams"]["diskSizeGb"] == 200
        assert prepared["provider"]["project_id"] == "p"
    else:
        if spot_cfg:
            assert spot_cfg["azure_arm_parameters"]["priority"] == "Spot"
            assert spot_cfg["azure_arm_parameters"]["billingProfile"] == {"maxPrice": -1}
        assert "priority" not in od_cfg["azure_arm_parameters"]
        assert prepared["auth"]["ssh_public_key"].endswith(".pub")


def test_gpu_workers_run_the_container_with_gpus_all():
    spec = ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-dk", **PINNED)
    docker = rc.prepare_and_validate(render_ray_config(spec, resolve(spec)))["docker"]
    assert docker["worker_run_options"] == ["--gpus all"]
    assert "--gpus all" not in docker["run_options"]  # the head is a CPU instance
    assert docker["disable_automatic_runtime_detection"] is True  # no --runtime=nvidia


def test_gcp_n1_gets_guest_accelerators_and_a2_does_not():
    t4 = ClusterSpec(cloud="gcp", gpu="T4:1", project="p", name="gnb-t4", **PINNED)
    cfg = render_ray_config(t4, resolve(t4))["available_node_types"][WORKER_TYPE]["node_config"]
    assert cfg["machineType"] == "n1-standard-4"
    assert cfg["guestAccelerators"] == [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": 1}]
    a100 = ClusterSpec(cloud="gcp", gpu="A100:8", project="p", name="gnb-a2", **PINNED)
    cfg = render_ray_config(a100, resolve(a100))["available_node_types"][WORKER_TYPE]["node_config"]
    assert cfg["machineType"].startswith("a2-") and "guestAccelerators" not in cfg


def test_aws_default_ami_is_the_current_gpu_dlami_not_rays_cuda_11_one():
    # Ray's fallback AMI (Deep Learning AMI Ubuntu 18.04 V71.0, CUDA 11.2) predates the R525 driver CUDA 12 needs;
    # every node gets the Ubuntu 22.04 GPU base DLAMI through its public SSM parameter instead.
    spec = ClusterSpec(cloud="aws", gpu="A100:8", spot=True, name="gnb-ami", **PINNED)
    types = render_ray_config(spec, resolve(spec))["available_node_types"]
    for node_type in types.values():
        cfg = node_type["node_config"]
        assert cfg["ImageId"] == (
            "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id"
        )
        assert cfg["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"  # the Ubuntu AMI's root device
    own = ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-ami2", vm_image="ami-0123456789abcdef0", **PINNED)
    cfg = render_ray_config(own, resolve(own))["available_node_types"][WORKER_TYPE]["node_config"]
    assert cfg["ImageId"] == "ami-0123456789abcdef0"


@pytest.mark.parametrize("gpu", ["L4:1", "H100:8", "T4:1"])
def test_gcp_boot_disk_is_pd_balanced_in_the_launch_zone(gpu):
    # pd-standard (the API default) is not offered on G2 (L4) and A3 (H100) machine types
    spec = ClusterSpec(cloud="gcp", gpu=gpu, project="p", name="gnb-disk", **PINNED)
    config = render_ray_config(spec, resolve(spec))
    zone = config["provider"]["availability_zone"]
    for node_type in config["available_node_types"].values():
        params = node_type["node_config"]["disks"][0]["initializeParams"]
        assert params["diskType"] == f"zones/{zone}/diskTypes/pd-balanced"


def test_gcp_default_zone_exists_in_the_region():
    # us-east1 and europe-west1 have no "-a" zone (their zones are b, c and d)
    east = ClusterSpec(cloud="gcp", region="us-east1", gpu="T4:1", project="p", name="gnb-zone", **PINNED)
    assert render_ray_config(east, resolve(east))["provider"]["availability_zone"] == "us-east1-b"
    central = ClusterSpec(cloud="gcp", gpu="T4:1", project="p", name="gnb-zone2", **PINNED)
    assert render_ray_config(central, resolve(central))["provider"]["availability_zone"] == "us-central1-a"
    chosen = ClusterSpec(
        cloud="gcp", region="us-east1", zone="us-east1-d", gpu="T4:1", project="p", name="gnb-zone3", **PINNED
    )
    cfg = render_ray_config(chosen, resolve(chosen))
    assert cfg["provider"]["availability_zone"] == "us-east1-d"
    disk = cfg["available_node_types"][WORKER_TYPE]["node_config"]["disks"][0]["initializeParams"]
    assert disk["diskType"] == "zones/us-east1-d/diskTypes/pd-balanced"


def test_head_start_commands_carry_client_port_and_idle_stop_only_when_asked():
    with_idle = ClusterSpec(cloud="aws", gpu="A100:8", idle_stop_minutes=45, name="gnb-i", **PINNED)
    cmds = render_ray_config(with_idle, resolve(with_idle))["head_start_ray_commands"]
    assert any("--ray-client-server-port=10001" in c for c in cmds)
    assert any("gpu_notebook.cloud._idle_watch --minutes 45 " in c for c in cmds)
    without = ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-n", **PINNED)
    cmds = render_ray_config(without, resolve(without))["head_start_ray_commands"]
    assert not any("_idle_watch" in c for c in cmds)


def test_default_image_and_packages_match_this_machine():
    import sys
    from importlib.metadata import version

    spec = ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-d")
    major, minor = sys.version_info[:2]
    assert spec.image_or_default == f"rayproject/ray:{version('ray')}-py{major}{minor}-gpu"
    assert spec.pip_or_default == [f"torch=={version('torch').split('+')[0]}"]
    cfg = render_ray_config(spec, resolve(spec))
    assert cfg["docker"]["image"] == spec.image_or_default
    # this kernel's own package is sent, at this kernel's version: a folder holding only the sdist, which Ray
    # copies into the remote folder, where the setup commands install it from
    ((remote, local),) = cfg["file_mounts"].items()
    assert Path(local).is_dir()  # Ray's launcher warns "refers to a file" for a file mount
    (sdist,) = Path(local).iterdir()
    assert sdist.name == f"gpu_notebook-{version('gpu_notebook')}.tar.gz" and sdist.is_file()
    sent = f"{remote}/{sdist.name}"
    assert any(f"pip install -q --force-reinstall --no-deps {sent}" in c for c in cfg["setup_commands"])


def test_this_kernels_package_mounts_a_folder_so_ray_warns_of_no_file_mount(capfd):
    """Ray's config check (the one ``ray up`` runs) warns of every ``file_mounts`` entry that is a file."""
    spec = ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-d", **PINNED)
    cfg = render_ray_config(spec, resolve(spec))
    assert cfg["file_mounts"] and all(Path(local).is_dir() for local in cfg["file_mounts"].values())
    rc.prepare_and_validate(cfg)
    assert "File Mount" not in "".join(capfd.readouterr())
    # the check does see a file mount, so the assertion above can fail
    rc.prepare_and_validate({**cfg, "file_mounts": {"~/x/setup.py": __file__}})
    assert "File Mount: (~/x/setup.py:" in "".join(capfd.readouterr())


def test_ship_package_off_sends_nothing():
    spec = ClusterSpec(cloud="aws", gpu="A100:8", name="gnb-d", ship_package=False, **PINNED)
    cfg = render_ray_config(spec, resolve(spec))
    assert cfg["file_mounts"] == {}
    assert cfg["setup_commands"] == ["pip install -q -U torch==2.13.0"]


def test_kuberay_manifest_shape():
    spec = ClusterSpec(
        cloud="kubernetes", gpu="H100:4", workers=1, max_workers=3, name="gnb-k", namespace="ml", **PINNED
    )
    m = render_kuberay_manifest(spec)
    assert (m["apiVersion"], m["kind"]) == ("ray.io/v1", "RayCluster")
    assert m["metadata"] == {
        "name": "gnb-k",
        "namespace": "ml",
        "labels": {"app.kubernetes.io/managed-by": "gpu-notebook", OWNER_TAG: "gnb-k"},
    }
    (group,) = m["spec"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (1, 1, 3)
    worker = group["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert worker["image"] == PINNED["image"]
    assert {"name": "PYTHONPATH", "value": "/opt/gnb-site"} in worker["env"]
    init = group["template"]["spec"]["initContainers"][0]
    assert (
        init["command"][-1] == "pip install -q --target /opt/gnb-site torch==2.13.0"
    )  # gpu_notebook: runtime_env
    head = m["spec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    assert {p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]} == {
        6379,
        8265,
        10001,
    }
    assert "anchor" not in to_yaml(m) and "&id" not in to_yaml(m)


def test_render_refuses_the_wrong_kind():
    with pytest.raises(ValueError):
        render_ray_config(ClusterSpec(cloud="kubernetes", gpu="A100:1", name="gnb-x"))
    with pytest.raises(ValueError):
        render_kuberay_manifest(ClusterSpec(cloud="aws", gpu="A100:1", name="gnb-x"))
