"""The provider-neutral description of a cloud GPU cluster, and how a request is matched to instances.

A :class:`ClusterSpec` says what the user asked for (cloud, region, ``--gpu A100:8`` or an instance type,
workers, spot, image, disk, idle stop); :func:`resolve` looks the instances up in the catalog
(:mod:`gpu_notebook.catalog`) and returns a :class:`Resolved` with the worker and head instance types, or
raises :class:`CloudRequestError` with a message that names the alternatives.
"""

from __future__ import annotations

import getpass
import hashlib
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_notebook.catalog import CatalogError, get_catalog
from gpu_notebook.errors import GpuNotebookError

CLOUDS = ("aws", "gcp", "azure", "kubernetes")

#: A small CPU instance for the head node per cloud: the GPUs live on the workers.
DEFAULT_HEAD_TYPES = {"aws": "m5.xlarge", "gcp": "n2-standard-4", "azure": "Standard_D4s_v3"}
#: On-demand USD/hour of the default head types, used only when the GPU catalog does not list them
#: (public list prices, us-east-1 / us-central1 / eastus, as of 2025-05; estimates, not quotes).
HEAD_PRICES = {
    ("aws", "m5.xlarge"): 0.192,
    ("gcp", "n2-standard-4"): 0.194,
    ("azure", "Standard_D4s_v3"): 0.192,
}
HEAD_PRICE_SOURCE = "list price 2025-05 (gpu_notebook.cloud._spec.HEAD_PRICES)"
DEFAULT_REGIONS = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}
#: VM images with NVIDIA drivers and docker (the Ray container runs on top). Override with ``vm_image``.
DEFAULT_VM_IMAGES: dict[str, str | None] = {
    # AWS: the current "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)" of the launch region, looked
    # up by EC2 at launch through its public SSM parameter (RunInstances accepts ``resolve:ssm:`` as ImageId).
    # Ray's own default AMI ("Deep Learning AMI (Ubuntu 18.04) V71.0", CUDA 11.2 per ray/autoscaler/_private/aws/
    # config.py) has a driver older than the R525 that CUDA 12 (Ray's -gpu images, PyPI torch) needs. An Ubuntu
    # AMI: root device /dev/sda1, SSH user ubuntu; it ships docker and the NVIDIA container toolkit.
    "aws": "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    "gcp": "projects/deeplearning-platform-release/global/images/family/common-cu124-ubuntu-2204-py310",
    "azure": "microsoft-dsvm:ubuntu-2204:2204-gen2:latest",
}

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$")


class CloudRequestError(GpuNotebookError, ValueError):
    """A ``--cloud`` request that cannot be met (unknown GPU, region without it, quota, bad option)."""


def local_ray_version() -> str:
    """The Ray version installed here (the cluster image must match it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ray")
    except PackageNotFoundError:
        return "latest"


def local_python_tag() -> str:
    """``py311`` for Python 3.11: the tag Ray's images use."""
    return f"py{sys.version_info.major}{sys.version_info.minor}"


def default_image() -> str:
    """Ray's GPU image of the local Ray and Python version, e.g. ``rayproject/ray:2.60.0-py311-gpu``."""
    return f"rayproject/ray:{local_ray_version()}-{local_python_tag()}-gpu"


def local_package_version(name: str) -> str | None:
    """The installed version of ``name`` without importing it, minus any local tag (``2.13.0+cpu`` -> ``2.13.0``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name).split("+", 1)[0]
    except PackageNotFoundError:
        return None


def default_pip_packages() -> list[str]:
    """What setup commands install from the package index on every node: the same torch, if installed here.

    gpu_notebook itself never comes from an index: the nodes get this kernel's own copy (``ship_package``).
    """
    torch = local_package_version("torch")
    return [f"torch=={torch}"] if torch else []


def parse_gpu(text: str) -> tuple[str, int]:
    """Parse ``TYPE:COUNT`` (``A100:8``; ``A100`` means one).

    Raises
    ------
    CloudRequestError
        On an empty type or a count that is not a positive integer.
    """
    gpu, _, count = text.strip().partition(":")
    gpu = gpu.strip()
    if not gpu:
        raise CloudRequestError(f"--gpu {text!r}: expected TYPE:COUNT, e.g. A100:8")
    if not count:
        return gpu, 1
    try:
        n = int(count)
    except ValueError:
        raise CloudRequestError(
            f"--gpu {text!r}: the count after ':' must be an integer, e.g. A100:8"
        ) from None
    if n < 1:
        raise CloudRequestError(f"--gpu {text!r}: the GPU count must be at least 1")
    return gpu, n


def default_cluster_name(seed: str = "") -> str:
    """``gnb-<user>-<6 hex>``: short, lowercase, valid as an AWS tag, a GCP label and a Kubernetes name."""
    user = re.sub(r"[^a-z0-9]", "", getpass.getuser().lower())[:12] or "user"
    digest = hashlib.sha1(f"{user}{seed}{time.time_ns()}".encode()).hexdigest()[:6]
    return f"gnb-{user}-{digest}"


@dataclass
class ClusterSpec:
    """A cloud GPU cluster request, independent of the cloud.

    Parameters
    ----------
    cloud : {"aws", "gcp", "azure", "kubernetes"}
    region : str, optional
        Cloud region (Azure: location). Default per cloud (``us-east-1``, ``us-central1``, ``eastus``).
    gpu : str, optional
        ``TYPE:COUNT`` per worker node, e.g. ``"A100:8"``; the cheapest matching catalog instance is used.
    instance_type : str, optional
        An exact worker instance type instead of ``gpu``, e.g. ``"p4d.24xlarge"``.
    workers : int
        Worker nodes started with the cluster (Ray ``min_workers``).
    max_workers : int, optional
        Upper bound for autoscaling (default: ``workers``).
    spot : bool
        Workers on spot / preemptible capacity.
    spot_fallback : bool
        With ``spot``: also declare an on-demand worker type that Ray's autoscaler uses when spot capacity
        cannot be had (the total stays within ``max_workers``).
    image : str, optional
        Container image for every node (default :func:`default_image`).
    pip_packages : list of str, optional
        Installed from the package index by the setup commands (default :func:`default_pip_packages`: torch).
    ship_package : bool
        Send this kernel's own gpu_notebook to every node and install it there (an sdist through the launcher's
        ``file_mounts``; on Kubernetes, Ray's ``runtime_env``). False: the image must already have the same
        version; the start checks every node either way (see :mod:`gpu_notebook.cloud._ship`).
    setup_commands : list of str
        Extra commands after the pip install.
    disk_gb : int
        Boot disk size of every node.
    idle_stop_minutes : float, optional
        Our head idle auto-stop: tear the whole cluster down after this many idle minutes. Ray's own
        ``idle_timeout_minutes`` (``worker_idle_minutes``) only removes idle workers.
    worker_idle_minutes : float
        Ray's ``idle_timeout_minutes`` for workers above ``workers``.
    name : str, optional
        Cluster name (the ``ray-cluster-name`` tag); default :func:`default_cluster_name`.
    head_instance_type : str, optional
        Head node instance (default: a small CPU instance per cloud).
    zone : str, optional
        Availability zone(s), comma separated.
    project : str, optional
        GCP project id.
    resource_group : str, optional
        Azure resource group (default ``gpu-notebook-<name>``).
    namespace : str
        Kubernetes namespace.
    vm_image : str, optional
        Host VM image (AMI id, GCE image, Azure ``publisher:offer:sku:version``).
    ssh_user : str
        SSH user of the VM image.
    ssh_private_key, ssh_public_key : str, optional
        Key files (Azure needs both; AWS/GCP create a key pair when absent).
    cache_stopped_nodes : bool
        Keep stopped nodes for reuse. False by default: a stopped node keeps billing for its disk.
    connect : {"tunnel", "direct"}
        How the notebook reaches the head's Ray Client port (10001) on a VM cloud: through an SSH tunnel
        started by the launch (works from anywhere; the default security groups only open SSH), or directly
        (a notebook inside the cluster's network).
    """

    cloud: str
    region: str | None = None
    gpu: str | None = None
    instance_type: str | None = None
    workers: int = 1
    max_workers: int | None = None
    spot: bool = False
    spot_fallback: bool = True
    image: str | None = None
    pip_packages: list[str] | None = None
    ship_package: bool = True
    setup_commands: list[str] = field(default_factory=list)
    disk_gb: int = 200
    idle_stop_minutes: float | None = None
    worker_idle_minutes: float = 5.0
    name: str | None = None
    head_instance_type: str | None = None
    zone: str | None = None
    project: str | None = None
    resource_group: str | None = None
    namespace: str = "default"
    vm_image: str | None = None
    ssh_user: str = "ubuntu"
    ssh_private_key: str | None = None
    ssh_public_key: str | None = None
    cache_stopped_nodes: bool = False
    connect: str = "tunnel"

    def __post_init__(self) -> None:
        self.cloud = (self.cloud or "").lower()
        if self.cloud not in CLOUDS:
            raise CloudRequestError(f"--cloud {self.cloud!r}: choose one of {', '.join(CLOUDS)}")
        if self.gpu and self.instance_type:
            raise CloudRequestError("give either --gpu TYPE:COUNT or --instance-type, not both")
        if not self.gpu and not self.instance_type:
            raise CloudRequestError("say which GPUs: --gpu TYPE:COUNT (e.g. A100:8) or --instance-type NAME")
        if self.gpu:
            parse_gpu(self.gpu)
        if self.workers < 0:
            raise CloudRequestError("--workers must be 0 or more")
        if self.max_workers is None:
            self.max_workers = self.workers
        if self.max_workers < self.workers:
            raise CloudRequestError(f"max_workers ({self.max_workers}) is below workers ({self.workers})")
        if self.max_workers < 1:
            raise CloudRequestError("a GPU cluster needs at least one worker: --workers 1 or more")
        if self.region is None and self.cloud in DEFAULT_REGIONS:
            self.region = DEFAULT_REGIONS[self.cloud]
        if self.name is None:
            self.name = default_cluster_name(f"{self.cloud}{self.gpu}{self.instance_type}")
        if not _NAME_RE.match(self.name):
            raise CloudRequestError(
                f"cluster name {self.name!r}: use 2-40 lowercase letters, digits and '-', starting with a letter"
            )
        if self.disk_gb < 20:
            raise CloudRequestError("disk_gb must be at least 20")
        if self.idle_stop_minutes is not None and not 0 < self.idle_stop_minutes < float("inf"):
            raise CloudRequestError("--idle-stop must be a positive number of minutes")
        if self.connect not in ("tunnel", "direct"):
            raise CloudRequestError(f"connect={self.connect!r}: choose 'tunnel' or 'direct'")
        if self.cloud == "azure" and self.resource_group is None:
            self.resource_group = f"gpu-notebook-{self.name}"

    @property
    def image_or_default(self) -> str:
        """The container image the nodes run."""
        return self.image or default_image()

    @property
    def pip_or_default(self) -> list[str]:
        """The pip packages the setup commands install."""
        return list(self.pip_packages) if self.pip_packages is not None else default_pip_packages()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (saved in the cluster state)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterSpec:
        """Inverse of :meth:`to_dict` (unknown keys are ignored)."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class InstanceChoice:
    """One instance type picked for a role, with its hourly prices in the spec's region."""

    role: str  # "head" | "worker"
    name: str
    count: int
    max_count: int
    gpu: str | None
    gpus_per_node: int
    vcpus: float | None
    memory_gb: float | None
    on_demand_per_hour: float | None
    spot_per_hour: float | None
    spot: bool
    source: str | None = None
    date: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def hourly(self, market: str) -> float | None:
        """Price per hour for ``count`` nodes in ``market`` (``"on_demand"`` or ``"spot"``)."""
        price = self.spot_per_hour if market == "spot" else self.on_demand_per_hour
        return None if price is None else price * self.count


@dataclass
class Resolved:
    """The instances a spec resolves to."""

    worker: InstanceChoice
    head: InstanceChoice | None
    alternatives: list[str] = field(default_factory=list)


def _price(it: Any, region: str, market: str) -> float | None:
    try:
        value = it.price(region, market=market)
    except LookupError:  # CatalogError: no price in that market there
        return None
    return None if value is None else float(value)


def _choice(it: Any, role: str, region: str, count: int, max_count: int, spot: bool) -> InstanceChoice:
    return InstanceChoice(
        role=role,
        name=it.name,
        count=count,
        max_count=max_count,
        gpu=getattr(it, "gpu", None) or None,
        gpus_per_node=int(getattr(it, "gpu_count", 0) or 0),
        vcpus=getattr(it, "vcpus", None),
        memory_gb=getattr(it, "memory_gb", None),
        on_demand_per_hour=_price(it, region, "on_demand"),
        spot_per_hour=_price(it, region, "spot"),
        spot=spot,
        source=getattr(it, "source", None),
        date=str(getattr(it, "date", "")) or None,
        extra=dict(getattr(it, "extra", {}) or {}),
    )


def resolve(spec: ClusterSpec, catalog: Any = None) -> Resolved:
    """Match ``spec`` to catalog instances in its region.

    Raises
    ------
    CloudRequestError
        Unknown GPU or instance type, or a region that does not offer it; the message lists alternatives.
    """
    if spec.cloud == "kubernetes":
        gpu, count = parse_gpu(spec.gpu) if spec.gpu else (spec.instance_type or "GPU", 1)
        worker = InstanceChoice(
            "worker",
            f"pod:{gpu}x{count}",
            spec.workers,
            spec.max_workers or spec.workers,
            gpu,
            count,
            None,
            None,
            None,
            None,
            spec.spot,
        )
        return Resolved(worker=worker, head=None)
    cat = catalog if catalog is not None else get_catalog()
    region = spec.region or DEFAULT_REGIONS[spec.cloud]
    it = _worker_type(spec, cat, region)
    worker = _choice(it, "worker", region, spec.workers, spec.max_workers or spec.workers, spec.spot)
    return Resolved(worker=worker, head=_head_choice(spec, cat, region))


def _worker_type(spec: ClusterSpec, cat: Any, region: str) -> Any:
    """The catalog's instance type for the workers: the one named, or the cheapest with the GPUs asked for."""
    try:
        if spec.instance_type:
            it = cat.get(spec.cloud, spec.instance_type)
            regions = list(getattr(it, "regions", []) or [])
            if regions and region not in regions:
                raise CloudRequestError(
                    f"{spec.cloud} instance type {it.name} is not offered in {region}. "
                    f"Regions that have it: {', '.join(sorted(regions))}."
                )
            return it
        gpu, count = parse_gpu(spec.gpu or "")
        found = cat.find(spec.cloud, gpu=gpu, count=count, region=region)
        if not found:
            raise CloudRequestError(f"no {spec.cloud} instance with {count} x {gpu} in {region}")
        return found[0]
    except CatalogError as exc:
        raise CloudRequestError(f"{spec.cloud}: {exc}") from exc


def _head_choice(spec: ClusterSpec, cat: Any, region: str) -> InstanceChoice:
    """The CPU head: from the catalog when it lists the type, else launched anyway at a known or no price."""
    head_name = spec.head_instance_type or DEFAULT_HEAD_TYPES[spec.cloud]
    try:
        return _choice(cat.get(spec.cloud, head_name), "head", region, 1, 1, False)
    except CatalogError:
        if spec.head_instance_type:
            raise CloudRequestError(f"{spec.cloud}: unknown head instance type {head_name}") from None
    # A CPU head the GPU catalog does not list: launch it anyway, price unknown.
    price = HEAD_PRICES.get((spec.cloud, head_name))
    return InstanceChoice(
        "head",
        head_name,
        1,
        1,
        None,
        0,
        4,
        16,
        price,
        None,
        False,
        source=HEAD_PRICE_SOURCE if price is not None else None,
    )
