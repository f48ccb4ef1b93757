"""Render a :class:`~gpu_notebook.cloud.ClusterSpec` into Ray cluster-launcher YAML or a KubeRay manifest.

The output is plain data (dicts) that ``ray up`` would accept: ``render_ray_config`` for ``aws``, ``gcp`` and
``azure``, ``render_kuberay_manifest`` for ``kubernetes``. ``to_yaml`` prints either.

Our own package reaches the VM nodes as this kernel's copy (:mod:`._ship`): its sdist is a ``file_mounts`` entry
and a setup command installs it; nothing named gpu_notebook is ever fetched from a package index. On Kubernetes
it travels through Ray's ``runtime_env`` at start instead (the init container installs only the index packages).
"""

from __future__ import annotations

import shlex
from typing import Any

from ._ship import ShippedPackage
from ._ship import package as ship_package
from ._spec import (
    DEFAULT_VM_IMAGES,
    ClusterSpec,
    InstanceChoice,
    Resolved,
    local_ray_version,
    parse_gpu,
    resolve,
)

#: Tag put on every instance and disk we create, next to Ray's own ``ray-cluster-name``.
OWNER_TAG = "gpu-notebook-cluster"
HEAD_TYPE = "ray.head.default"
WORKER_TYPE = "ray.worker.gpu"
WORKER_SPOT_TYPE = "ray.worker.gpu.spot"
WORKER_ONDEMAND_TYPE = "ray.worker.gpu.ondemand"
#: A custom resource every worker advertises, naming the market it was launched in: the cost meter prices a
#: worker that Ray's autoscaler started on demand (the spot fallback) at the on-demand price.
MARKET_RESOURCE = {"spot": "gpu_notebook_spot", "on_demand": "gpu_notebook_on_demand"}
RAY_CLIENT_PORT = 10001
GCS_PORT = 6379
DASHBOARD_PORT = 8265
IDLE_WATCH_LOG = "/tmp/gpu_notebook_idle_watch.log"

#: GCE boot disk type. The API default, pd-standard, is not offered on the newer machine series (A3 and G2 take
#: pd-balanced, pd-ssd or Hyperdisk; cf. C3 in kubernetes-sigs/gcp-compute-persistent-disk-csi-driver#1391);
#: pd-balanced works on N1, N2, A2, A3 and G2 alike.
GCP_BOOT_DISK_TYPE = "pd-balanced"
#: GCE regions whose zones do not include ``<region>-a`` (us-east1: b, c, d; europe-west1: b, c, d).
GCP_DEFAULT_ZONES = {"us-east1": "us-east1-b", "europe-west1": "europe-west1-b"}


def gcp_zone(spec: ClusterSpec) -> str:
    """The GCE zone a spec launches in: ``spec.zone``, else a zone that exists in its region."""
    region = spec.region or "us-central1"
    return spec.zone or GCP_DEFAULT_ZONES.get(region, f"{region}-a")


#: GCE accelerator names for N1 machines (A2/A3/G2 machine types come with their GPUs attached).
GCP_ACCELERATORS = {
    "T4": "nvidia-tesla-t4",
    "V100": "nvidia-tesla-v100",
    "P100": "nvidia-tesla-p100",
    "P4": "nvidia-tesla-p4",
    "K80": "nvidia-tesla-k80",
}


def shipped_package(spec: ClusterSpec, package: ShippedPackage | None = None) -> ShippedPackage | None:
    """The package a spec sends to its nodes: ``package`` if given, else this kernel's (None: not shipped)."""
    if not spec.ship_package:
        return None
    return package if package is not None else ship_package()


def setup_commands(spec: ClusterSpec, package: ShippedPackage | None = None) -> list[str]:
    """Commands run in the container on every node: the index packages (torch), our sent sdist, then extras."""
    cmds: list[str] = []
    pkgs = spec.pip_or_default
    if pkgs:
        cmds.append("pip install -q -U " + " ".join(shlex.quote(p) for p in pkgs))
    if package is not None:
        cmds.append(package.install_command())
    cmds.extend(spec.setup_commands)
    return cmds


def head_start_commands(spec: ClusterSpec) -> list[str]:
    """``ray start --head`` (with the Ray Client port) and, with ``idle_stop_minutes``, our idle watcher."""
    cmds = [
        "ray stop",
        "ulimit -n 65536; ray start --head --port=6379 --object-manager-port=8076 "
        "--autoscaling-config=~/ray_bootstrap_config.yaml --dashboard-host=0.0.0.0 "
        f"--ray-client-server-port={RAY_CLIENT_PORT}",
    ]
    if spec.idle_stop_minutes:
        cmds.append(
            f"nohup python -m gpu_notebook.cloud._idle_watch --minutes {spec.idle_stop_minutes:g} "
            f"--config ~/ray_bootstrap_config.yaml > {IDLE_WATCH_LOG} 2>&1 &"
        )
    return cmds


WORKER_START_COMMANDS = [
    "ray stop",
    "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076",
]


def _resources(cpus: float | None, gpus: int, gpu: str | None, default_cpus: int = 4) -> dict[str, int]:
    res: dict[str, int] = {"CPU": int(cpus) if cpus else default_cpus}
    if gpus:
        res["GPU"] = int(gpus)
        if gpu:
            res[f"accelerator_type:{gpu}"] = 1
    return res


def _aws_node(spec: ClusterSpec, instance: str, spot: bool) -> dict[str, Any]:
    tags = [{"Key": OWNER_TAG, "Value": spec.name}]
    node: dict[str, Any] = {
        "InstanceType": instance,
        "BlockDeviceMappings": [
            {
                "DeviceName": "/dev/sda1",
                "Ebs": {"VolumeSize": int(spec.disk_gb), "VolumeType": "gp3", "DeleteOnTermination": True},
            }
        ],
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": list(tags)},
            {"ResourceType": "volume", "Tags": [{"Key": "ray-cluster-name", "Value": spec.name}, *tags]},
        ],
    }
    image = spec.vm_image or DEFAULT_VM_IMAGES["aws"]
    if image:
        node["ImageId"] = image
    if spot:
        node["InstanceMarketOptions"] = {
            "MarketType": "spot",
            "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
        }
    return node


def _gcp_node(
    spec: ClusterSpec, machine: str, gpu: str | None, gpus: int, spot: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    # The catalog names N1+GPU combinations like "n1-standard-4-t4x1"; GCE wants the machine type.
    machine = str(extra.get("machine_type") or machine)
    node: dict[str, Any] = {
        "machineType": machine,
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "type": "PERSISTENT",
                "initializeParams": {
                    "diskSizeGb": int(spec.disk_gb),
                    # instances.insert wants a (partial) URL here, not the bare type name
                    "diskType": f"zones/{gcp_zone(spec)}/diskTypes/{GCP_BOOT_DISK_TYPE}",
                    "sourceImage": spec.vm_image or DEFAULT_VM_IMAGES["gcp"],
                },
            }
        ],
        "labels": {OWNER_TAG: spec.name},
    }
    if gpus:
        node["metadata"] = {"items": [{"key": "install-nvidia-driver", "value": "True"}]}
        if machine.startswith("n1-") and gpu:
            accel = extra.get("accelerator_type") or GCP_ACCELERATORS.get(
                gpu.upper(), f"nvidia-tesla-{gpu.lower()}"
            )
            node["guestAccelerators"] = [{"acceleratorType": accel, "acceleratorCount": int(gpus)}]
    # GCE wants `scheduling` as an object (Ray's own examples use a list: ray-project/ray#46248).
    scheduling: dict[str, Any] = {}
    if gpus or spot:
        scheduling.update(onHostMaintenance="TERMINATE", automaticRestart=False)
    if spot:
        # Spot VMs (the successor of preemptible VMs), deleted rather than stopped when reclaimed.
        scheduling.update(provisioningModel="SPOT", preemptible=True, instanceTerminationAction="DELETE")
    if scheduling:
        node["scheduling"] = scheduling
    return node


def _azure_node(spec: ClusterSpec, size: str, spot: bool) -> dict[str, Any]:
    publisher, offer, sku, version = (spec.vm_image or DEFAULT_VM_IMAGES["azure"] or "").split(":")
    params: dict[str, Any] = {
        "vmSize": size,
        "imagePublisher": publisher,
        "imageOffer": offer,
        "imageSku": sku,
        "imageVersion": version,
        "osDiskSize": int(spec.disk_gb),
    }
    if spot:
        params["priority"] = "Spot"
        params["evictionPolicy"] = "Delete"  # an evicted spot VM must not keep billing for its disk
        # -1: pay up to the on-demand price, never evicted for price reasons.
        params["billingProfile"] = {"maxPrice": -1}
    return {"azure_arm_parameters": params}


def _node_config(
    spec: ClusterSpec,
    instance: str,
    gpu: str | None,
    gpus: int,
    spot: bool,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    if spec.cloud == "aws":
        return _aws_node(spec, instance, spot)
    if spec.cloud == "gcp":
        return _gcp_node(spec, instance, gpu, gpus, spot, extra or {})
    return _azure_node(spec, instance, spot)


def _provider(spec: ClusterSpec) -> dict[str, Any]:
    if spec.cloud == "aws":
        prov: dict[str, Any] = {"type": "aws", "region": spec.region}
        if spec.zone:
            prov["availability_zone"] = spec.zone
    elif spec.cloud == "gcp":
        region = spec.region or "us-central1"
        prov = {
            "type": "gcp",
            "region": region,
            "availability_zone": gcp_zone(spec),
            "project_id": spec.project,
        }
    else:
        prov = {"type": "azure", "location": spec.region, "resource_group": spec.resource_group}
        prov["availability_zone"] = spec.zone or "auto"
    prov["cache_stopped_nodes"] = bool(spec.cache_stopped_nodes)
    return prov


def _auth(spec: ClusterSpec) -> dict[str, Any]:
    auth: dict[str, Any] = {"ssh_user": spec.ssh_user}
    if spec.cloud == "azure":
        auth["ssh_private_key"] = spec.ssh_private_key or "~/.ssh/id_rsa"
        auth["ssh_public_key"] = spec.ssh_public_key or "~/.ssh/id_rsa.pub"
    elif spec.ssh_private_key:
        auth["ssh_private_key"] = spec.ssh_private_key
    return auth


def render_ray_config(
    spec: ClusterSpec, resolved: Resolved | None = None, package: ShippedPackage | None = None
) -> dict[str, Any]:
    """The Ray cluster-launcher config (what ``ray up`` reads) for an ``aws``, ``gcp`` or ``azure`` spec.

    Parameters
    ----------
    spec : ClusterSpec
    resolved : Resolved, optional
        The instances (default: :func:`~gpu_notebook.cloud.resolve` against the catalog).
    package : ShippedPackage, optional
        The gpu_notebook to send (default: this kernel's, built by :func:`gpu_notebook.cloud._ship.package`;
        none when ``spec.ship_package`` is False).
    """
    if spec.cloud == "kubernetes":
        raise ValueError("kubernetes clusters are KubeRay manifests: use render_kuberay_manifest()")
    res = resolved or resolve(spec)
    worker, head = res.worker, res.head
    assert head is not None
    max_workers = int(spec.max_workers or spec.workers)
    head_type = {
        "resources": _resources(head.vcpus, 0, None),
        "node_config": _node_config(spec, head.name, None, 0, False),
    }
    node_types: dict[str, Any] = {HEAD_TYPE: head_type, **_worker_node_types(spec, worker, max_workers)}
    shipped = shipped_package(spec, package)
    return {
        "cluster_name": spec.name,
        "max_workers": max_workers,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": float(spec.worker_idle_minutes),
        "docker": {
            "image": spec.image_or_default,
            "container_name": "ray_container",
            "pull_before_run": True,
            "run_options": ["--ulimit nofile=65536:65536"],
            # GPU workers get `--gpus all` (not Ray's `--runtime=nvidia` guess); the CPU head gets no GPU flag
            "worker_run_options": ["--gpus all"],
            "disable_automatic_runtime_detection": True,
        },
        "provider": _provider(spec),
        "auth": _auth(spec),
        "available_node_types": node_types,
        "head_node_type": HEAD_TYPE,
        "file_mounts": shipped.file_mounts() if shipped is not None else {},
        "initialization_commands": [],
        "setup_commands": setup_commands(spec, shipped),
        "head_start_ray_commands": head_start_commands(spec),
        "worker_start_ray_commands": list(WORKER_START_COMMANDS),
    }


def _worker_node_types(spec: ClusterSpec, worker: InstanceChoice, max_workers: int) -> dict[str, Any]:
    """The worker node types: one in the chosen market, or spot first with an on-demand fallback type.

    Ray's autoscaler tries node types by ``priority``: spot workers first; when spot capacity is refused it
    launches the on-demand type. Each type carries a market resource so cost accounting can tell them apart.
    """
    worker_resources = _resources(worker.vcpus, worker.gpus_per_node, worker.gpu)
    node_types: dict[str, Any] = {}
    if spec.spot and spec.spot_fallback:
        node_types[WORKER_SPOT_TYPE] = {
            "min_workers": int(spec.workers),
            "max_workers": max_workers,
            "priority": 10,
            "resources": {**worker_resources, MARKET_RESOURCE["spot"]: 1},
            "node_config": _node_config(
                spec, worker.name, worker.gpu, worker.gpus_per_node, True, worker.extra
            ),
        }
        node_types[WORKER_ONDEMAND_TYPE] = {
            "min_workers": 0,
            "max_workers": max_workers,
            "priority": 0,
            "resources": {**worker_resources, MARKET_RESOURCE["on_demand"]: 1},
            "node_config": _node_config(
                spec, worker.name, worker.gpu, worker.gpus_per_node, False, worker.extra
            ),
        }
    else:
        node_types[WORKER_TYPE] = {
            "min_workers": int(spec.workers),
            "max_workers": max_workers,
            "resources": {**worker_resources, MARKET_RESOURCE["spot" if spec.spot else "on_demand"]: 1},
            "node_config": _node_config(
                spec, worker.name, worker.gpu, worker.gpus_per_node, spec.spot, worker.extra
            ),
        }
    return node_types


def render_kuberay_manifest(spec: ClusterSpec) -> dict[str, Any]:
    """A KubeRay ``RayCluster`` (``ray.io/v1``) for a ``kubernetes`` spec.

    The workers ask for ``nvidia.com/gpu``; torch (the index packages) is installed by an init container into a
    shared volume that is put on ``PYTHONPATH``, so the stock Ray image is enough. gpu_notebook itself comes
    through Ray's ``runtime_env`` when the notebook starts its workers (a manifest carries no files).
    """
    if spec.cloud != "kubernetes":
        raise ValueError("render_kuberay_manifest() is for --cloud kubernetes")
    gpu, count = parse_gpu(spec.gpu) if spec.gpu else (None, 1)
    labels = {"app.kubernetes.io/managed-by": "gpu-notebook", OWNER_TAG: str(spec.name)}
    head_ports = [
        {"containerPort": GCS_PORT, "name": "gcs"},
        {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
        {"containerPort": RAY_CLIENT_PORT, "name": "client"},
    ]
    head = _kube_container(spec, "ray-head", {"cpu": "4", "memory": "16Gi"}, head_ports)
    worker = _kube_container(
        spec, "ray-worker", {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": str(count)}, []
    )
    worker_start: dict[str, str] = {}
    if gpu:
        worker_start["resources"] = f'"{{\\"accelerator_type:{gpu}\\": 1}}"'
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
        "spec": {
            "rayVersion": local_ray_version(),
            "enableInTreeAutoscaling": True,
            "autoscalerOptions": {"idleTimeoutSeconds": int(spec.worker_idle_minutes * 60)},
            "headGroupSpec": {
                "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0"},
                "template": _kube_pod_template(spec, labels, head),
            },
            "workerGroupSpecs": [
                {
                    "groupName": "gpu",
                    "replicas": int(spec.workers),
                    "minReplicas": int(spec.workers),
                    "maxReplicas": int(spec.max_workers or spec.workers),
                    "rayStartParams": worker_start,
                    "template": _kube_pod_template(spec, labels, worker, _kube_tolerations(spec.spot)),
                }
            ],
        },
    }


_KUBE_SITE = "/opt/gnb-site"  # the shared volume the init container installs torch (the index packages) into


def _kube_container(
    spec: ClusterSpec, name: str, resources: dict[str, Any], ports: list[dict[str, Any]]
) -> dict[str, Any]:
    """A Ray container of the stock image that imports from the shared volume (``PYTHONPATH``)."""
    return {
        "name": name,
        "image": spec.image_or_default,
        "env": [{"name": "PYTHONPATH", "value": _KUBE_SITE}],
        "ports": ports,
        "resources": {"limits": resources, "requests": resources},
        "volumeMounts": [{"name": "gnb-site", "mountPath": _KUBE_SITE}],
    }


def _kube_pod_template(
    spec: ClusterSpec,
    labels: dict[str, str],
    container: dict[str, Any],
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod with the init container that installs the index packages, ``container``, and the shared volume."""
    pkgs = spec.pip_or_default
    steps = (
        [f"pip install -q --target {_KUBE_SITE} " + " ".join(shlex.quote(p) for p in pkgs)] if pkgs else []
    )
    init = {
        "name": "install-packages",
        "image": spec.image_or_default,
        "command": ["bash", "-lc", " && ".join([*steps, *spec.setup_commands]) or "true"],
        "volumeMounts": [{"name": "gnb-site", "mountPath": _KUBE_SITE}],
    }
    pod: dict[str, Any] = {"initContainers": [init], "containers": [container]}
    if tolerations is not None:
        pod["tolerations"] = tolerations
    pod["volumes"] = [{"name": "gnb-site", "emptyDir": {}}]
    return {"metadata": {"labels": labels}, "spec": pod}


def _kube_tolerations(spot: bool) -> list[dict[str, Any]]:
    """GPU nodes' taint, and with ``spot`` the spot-node taints of GKE and AKS."""
    out: list[dict[str, Any]] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if spot:
        out += [
            {
                "key": "cloud.google.com/gke-spot",
                "operator": "Equal",
                "value": "true",
                "effect": "NoSchedule",
            },
            {
                "key": "kubernetes.azure.com/scalesetpriority",
                "operator": "Equal",
                "value": "spot",
                "effect": "NoSchedule",
            },
        ]
    return out


def to_yaml(config: dict[str, Any]) -> str:
    """YAML text of a rendered config or manifest (key order kept)."""
    import json

    import yaml

    plain = json.loads(json.dumps(config))  # no shared objects, so no YAML anchors
    return str(yaml.safe_dump(plain, sort_keys=False, default_flow_style=False, width=110))
