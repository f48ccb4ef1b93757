"""Build the shipped GPU price catalog (``gpu_notebook/data/gpu_catalog.json``) from a small seed table.

The seed holds, per instance type, its hardware and ONE on-demand list price in a base region, as publicly
listed by the provider at ``SEED_DATE`` (best known to the authors; not a quote). Prices in other regions
are the base price times a regional factor, spot is a typical fraction of on-demand, and the 1-year
reservation is 60% of on-demand (the usual "a 1-year reservation saves about 40%"). Every entry records
how its numbers were made (``price_basis``) so the catalog never pretends precision.

Regenerate with ``python -m gpu_notebook.catalog._seed``; refresh live prices with ``Catalog.refresh()``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SEED_DATE = "2025-05"
RESERVED_1Y_FACTOR = 0.60

SOURCES = {
    "aws": "https://aws.amazon.com/ec2/pricing/on-demand/",
    "gcp": "https://cloud.google.com/compute/gpus-pricing",
    "azure": "https://azure.microsoft.com/en-us/pricing/details/virtual-machines/linux/",
}
SPOT_SOURCES = {
    "aws": "https://aws.amazon.com/ec2/spot/pricing/",
    "gcp": "https://cloud.google.com/spot-vms/pricing",
    "azure": "https://azure.microsoft.com/en-us/pricing/spot-advisor/",
}
BASE_REGION = {"aws": "us-east-1", "gcp": "us-central1", "azure": "eastus"}
REGION_FACTOR = {
    "aws": {
        "us-east-1": 1.0,
        "us-east-2": 1.0,
        "us-west-2": 1.0,
        "eu-west-1": 1.10,
        "eu-central-1": 1.20,
        "ap-northeast-1": 1.35,
    },
    "gcp": {
        "us-central1": 1.0,
        "us-east1": 1.0,
        "us-west1": 1.0,
        "us-east4": 1.05,
        "europe-west4": 1.10,
        "asia-northeast1": 1.28,
        "asia-southeast1": 1.20,
    },
    "azure": {"eastus": 1.0, "westus2": 1.0, "southcentralus": 1.0, "westeurope": 1.12, "japaneast": 1.25},
}

_AWS_ALL = ["us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1", "ap-northeast-1"]
_GCP_WIDE = ["us-central1", "us-east1", "us-west1", "europe-west4", "asia-northeast1"]
_AZ_ALL = ["eastus", "westus2", "southcentralus", "westeurope", "japaneast"]

# (name, gpu, gpu_count, gpu_memory_gb, vcpus, memory_gb, network_gbps, base on-demand $/h, spot fraction,
#  regions, extra)
Row = tuple[str, str, int, float, int, float, float | None, float, float, list[str], dict[str, Any]]

AWS: list[Row] = [
    (
        "p5.48xlarge",
        "H100",
        8,
        80,
        192,
        2048,
        3200,
        98.32,
        0.30,
        ["us-east-1", "us-east-2", "us-west-2", "ap-northeast-1"],
        {},
    ),
    ("p4d.24xlarge", "A100", 8, 40, 96, 1152, 400, 32.7726, 0.25, _AWS_ALL, {}),
    ("p4de.24xlarge", "A100", 8, 80, 96, 1152, 400, 40.9657, 0.35, ["us-east-1", "us-west-2"], {}),
    ("p3.2xlarge", "V100", 1, 16, 8, 61, 10, 3.06, 0.30, _AWS_ALL, {}),
    ("p3.8xlarge", "V100", 4, 16, 32, 244, 10, 12.24, 0.30, _AWS_ALL, {}),
    ("p3.16xlarge", "V100", 8, 16, 64, 488, 25, 24.48, 0.30, _AWS_ALL, {}),
    (
        "p3dn.24xlarge",
        "V100",
        8,
        32,
        96,
        768,
        100,
        31.212,
        0.30,
        ["us-east-1", "us-west-2", "ap-northeast-1"],
        {},
    ),
    ("g5.xlarge", "A10G", 1, 24, 4, 16, 10, 1.006, 0.40, _AWS_ALL, {}),
    ("g5.2xlarge", "A10G", 1, 24, 8, 32, 10, 1.212, 0.40, _AWS_ALL, {}),
    ("g5.4xlarge", "A10G", 1, 24, 16, 64, 25, 1.624, 0.40, _AWS_ALL, {}),
    ("g5.8xlarge", "A10G", 1, 24, 32, 128, 25, 2.448, 0.40, _AWS_ALL, {}),
    ("g5.12xlarge", "A10G", 4, 24, 48, 192, 40, 5.672, 0.40, _AWS_ALL, {}),
    ("g5.16xlarge", "A10G", 1, 24, 64, 256, 25, 4.096, 0.40, _AWS_ALL, {}),
    ("g5.24xlarge", "A10G", 4, 24, 96, 384, 50, 8.144, 0.40, _AWS_ALL, {}),
    ("g5.48xlarge", "A10G", 8, 24, 192, 768, 100, 16.288, 0.40, _AWS_ALL, {}),
    ("g6.xlarge", "L4", 1, 24, 4, 16, 10, 0.8048, 0.40, _AWS_ALL, {}),
    ("g6.2xlarge", "L4", 1, 24, 8, 32, 10, 0.9776, 0.40, _AWS_ALL, {}),
    ("g6.4xlarge", "L4", 1, 24, 16, 64, 25, 1.3232, 0.40, _AWS_ALL, {}),
    ("g6.8xlarge", "L4", 1, 24, 32, 128, 25, 2.0144, 0.40, _AWS_ALL, {}),
    ("g6.12xlarge", "L4", 4, 24, 48, 192, 40, 4.6016, 0.40, _AWS_ALL, {}),
    ("g6.16xlarge", "L4", 1, 24, 64, 256, 25, 3.3968, 0.40, _AWS_ALL, {}),
    ("g6.24xlarge", "L4", 4, 24, 96, 384, 50, 6.6752, 0.40, _AWS_ALL, {}),
    ("g6.48xlarge", "L4", 8, 24, 192, 768, 100, 13.3504, 0.40, _AWS_ALL, {}),
    ("g4dn.xlarge", "T4", 1, 16, 4, 16, 25, 0.526, 0.35, _AWS_ALL, {}),
    ("g4dn.2xlarge", "T4", 1, 16, 8, 32, 25, 0.752, 0.35, _AWS_ALL, {}),
    ("g4dn.4xlarge", "T4", 1, 16, 16, 64, 25, 1.204, 0.35, _AWS_ALL, {}),
    ("g4dn.8xlarge", "T4", 1, 16, 32, 128, 50, 2.176, 0.35, _AWS_ALL, {}),
    ("g4dn.12xlarge", "T4", 4, 16, 48, 192, 50, 3.912, 0.35, _AWS_ALL, {}),
    ("g4dn.16xlarge", "T4", 1, 16, 64, 256, 50, 4.352, 0.35, _AWS_ALL, {}),
    ("g4dn.metal", "T4", 8, 16, 96, 384, 100, 7.824, 0.35, _AWS_ALL, {}),
]


def _gcp(machine: str, family: str, accel: str | None, accel_count: int) -> dict[str, Any]:
    extra: dict[str, Any] = {"machine_type": machine, "family": family}
    if accel:
        extra["accelerator_type"] = accel
        extra["accelerator_count"] = accel_count
    return extra


_A100 = "nvidia-tesla-a100"
_A100_80 = "nvidia-a100-80gb"
GCP: list[Row] = [
    (
        "a2-highgpu-1g",
        "A100",
        1,
        40,
        12,
        85,
        24,
        3.673,
        0.35,
        _GCP_WIDE,
        _gcp("a2-highgpu-1g", "A2", _A100, 1),
    ),
    (
        "a2-highgpu-2g",
        "A100",
        2,
        40,
        24,
        170,
        32,
        7.347,
        0.35,
        _GCP_WIDE,
        _gcp("a2-highgpu-2g", "A2", _A100, 2),
    ),
    (
        "a2-highgpu-4g",
        "A100",
        4,
        40,
        48,
        340,
        50,
        14.694,
        0.35,
        _GCP_WIDE,
        _gcp("a2-highgpu-4g", "A2", _A100, 4),
    ),
    (
        "a2-highgpu-8g",
        "A100",
        8,
        40,
        96,
        680,
        100,
        29.387,
        0.35,
        _GCP_WIDE,
        _gcp("a2-highgpu-8g", "A2", _A100, 8),
    ),
    (
        "a2-megagpu-16g",
        "A100",
        16,
        40,
        96,
        1360,
        100,
        55.739,
        0.35,
        ["us-central1", "europe-west4", "asia-northeast1"],
        _gcp("a2-megagpu-16g", "A2", _A100, 16),
    ),
    (
        "a2-ultragpu-1g",
        "A100",
        1,
        80,
        12,
        170,
        24,
        5.069,
        0.40,
        ["us-central1", "us-east4", "europe-west4", "asia-southeast1"],
        _gcp("a2-ultragpu-1g", "A2", _A100_80, 1),
    ),
    (
        "a2-ultragpu-2g",
        "A100",
        2,
        80,
        24,
        340,
        32,
        10.138,
        0.40,
        ["us-central1", "us-east4", "europe-west4", "asia-southeast1"],
        _gcp("a2-ultragpu-2g", "A2", _A100_80, 2),
    ),
    (
        "a2-ultragpu-4g",
        "A100",
        4,
        80,
        48,
        680,
        50,
        20.276,
        0.40,
        ["us-central1", "us-east4", "europe-west4", "asia-southeast1"],
        _gcp("a2-ultragpu-4g", "A2", _A100_80, 4),
    ),
    (
        "a2-ultragpu-8g",
        "A100",
        8,
        80,
        96,
        1360,
        100,
        40.552,
        0.40,
        ["us-central1", "us-east4", "europe-west4", "asia-southeast1"],
        _gcp("a2-ultragpu-8g", "A2", _A100_80, 8),
    ),
    (
        "a3-highgpu-8g",
        "H100",
        8,
        80,
        208,
        1872,
        1000,
        88.25,
        0.35,
        ["us-central1", "us-east4", "europe-west4", "asia-northeast1"],
        _gcp("a3-highgpu-8g", "A3", "nvidia-h100-80gb", 8),
    ),
    (
        "g2-standard-4",
        "L4",
        1,
        24,
        4,
        16,
        10,
        0.7068,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-4", "G2", "nvidia-l4", 1),
    ),
    (
        "g2-standard-8",
        "L4",
        1,
        24,
        8,
        32,
        16,
        0.8536,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-8", "G2", "nvidia-l4", 1),
    ),
    (
        "g2-standard-12",
        "L4",
        1,
        24,
        12,
        48,
        16,
        1.0004,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-12", "G2", "nvidia-l4", 1),
    ),
    (
        "g2-standard-16",
        "L4",
        1,
        24,
        16,
        64,
        32,
        1.1472,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-16", "G2", "nvidia-l4", 1),
    ),
    (
        "g2-standard-24",
        "L4",
        2,
        24,
        24,
        96,
        32,
        2.0008,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-24", "G2", "nvidia-l4", 2),
    ),
    (
        "g2-standard-32",
        "L4",
        1,
        24,
        32,
        128,
        32,
        1.7336,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-32", "G2", "nvidia-l4", 1),
    ),
    (
        "g2-standard-48",
        "L4",
        4,
        24,
        48,
        192,
        50,
        4.0016,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-48", "G2", "nvidia-l4", 4),
    ),
    (
        "g2-standard-96",
        "L4",
        8,
        24,
        96,
        384,
        100,
        8.0032,
        0.40,
        _GCP_WIDE,
        _gcp("g2-standard-96", "G2", "nvidia-l4", 8),
    ),
    (
        "n1-standard-4-t4x1",
        "T4",
        1,
        16,
        4,
        15,
        10,
        0.54,
        0.35,
        _GCP_WIDE,
        _gcp("n1-standard-4", "N1", "nvidia-tesla-t4", 1),
    ),
    (
        "n1-standard-8-t4x1",
        "T4",
        1,
        16,
        8,
        30,
        16,
        0.73,
        0.35,
        _GCP_WIDE,
        _gcp("n1-standard-8", "N1", "nvidia-tesla-t4", 1),
    ),
    (
        "n1-standard-16-t4x2",
        "T4",
        2,
        16,
        16,
        60,
        32,
        1.46,
        0.35,
        _GCP_WIDE,
        _gcp("n1-standard-16", "N1", "nvidia-tesla-t4", 2),
    ),
    (
        "n1-standard-32-t4x4",
        "T4",
        4,
        16,
        32,
        120,
        32,
        2.92,
        0.35,
        _GCP_WIDE,
        _gcp("n1-standard-32", "N1", "nvidia-tesla-t4", 4),
    ),
    (
        "n1-standard-8-v100x1",
        "V100",
        1,
        16,
        8,
        30,
        16,
        2.86,
        0.35,
        ["us-central1", "us-west1", "europe-west4"],
        _gcp("n1-standard-8", "N1", "nvidia-tesla-v100", 1),
    ),
    (
        "n1-standard-32-v100x4",
        "V100",
        4,
        16,
        32,
        120,
        32,
        11.44,
        0.35,
        ["us-central1", "us-west1", "europe-west4"],
        _gcp("n1-standard-32", "N1", "nvidia-tesla-v100", 4),
    ),
    (
        "n1-standard-64-v100x8",
        "V100",
        8,
        16,
        64,
        240,
        32,
        22.88,
        0.35,
        ["us-central1", "us-west1", "europe-west4"],
        _gcp("n1-standard-64", "N1", "nvidia-tesla-v100", 8),
    ),
]

_AZ_H100 = ["eastus", "southcentralus", "westeurope"]
_AZ_ND = ["eastus", "southcentralus", "westus2", "westeurope"]
AZURE: list[Row] = [
    ("Standard_NC24ads_A100_v4", "A100", 1, 80, 24, 220, 20, 3.673, 0.30, _AZ_ALL, {}),
    ("Standard_NC48ads_A100_v4", "A100", 2, 80, 48, 440, 40, 7.346, 0.30, _AZ_ALL, {}),
    ("Standard_NC96ads_A100_v4", "A100", 4, 80, 96, 880, 80, 14.692, 0.30, _AZ_ALL, {}),
    ("Standard_ND96asr_v4", "A100", 8, 40, 96, 900, 1600, 27.197, 0.30, _AZ_ND, {"infiniband": True}),
    ("Standard_ND96amsr_A100_v4", "A100", 8, 80, 96, 1900, 1600, 32.77, 0.30, _AZ_ND, {"infiniband": True}),
    ("Standard_ND96isr_H100_v5", "H100", 8, 80, 96, 1900, 3200, 98.32, 0.40, _AZ_H100, {"infiniband": True}),
    ("Standard_NC4as_T4_v3", "T4", 1, 16, 4, 28, 8, 0.526, 0.25, _AZ_ALL, {}),
    ("Standard_NC8as_T4_v3", "T4", 1, 16, 8, 56, 8, 0.752, 0.25, _AZ_ALL, {}),
    ("Standard_NC16as_T4_v3", "T4", 1, 16, 16, 110, 8, 1.204, 0.25, _AZ_ALL, {}),
    ("Standard_NC64as_T4_v3", "T4", 4, 16, 64, 440, 32, 4.352, 0.25, _AZ_ALL, {}),
    ("Standard_NC6s_v3", "V100", 1, 16, 6, 112, None, 3.06, 0.30, _AZ_ALL, {}),
    ("Standard_NC12s_v3", "V100", 2, 16, 12, 224, None, 6.12, 0.30, _AZ_ALL, {}),
    ("Standard_NC24s_v3", "V100", 4, 16, 24, 448, None, 12.24, 0.30, _AZ_ALL, {}),
    (
        "Standard_NC24rs_v3",
        "V100",
        4,
        16,
        24,
        448,
        100,
        13.464,
        0.30,
        ["eastus", "southcentralus", "westeurope"],
        {"infiniband": True},
    ),
]

NOTES = (
    "List-price ESTIMATES, not quotes. Base-region on-demand prices are the providers' public list prices as "
    f"best known at {SEED_DATE}; other regions use an approximate regional factor; spot is a typical fraction "
    "of on-demand (spot prices move hourly and differ per zone); reserved_1y is 60% of on-demand (rule of "
    "thumb: a 1-year reservation saves about 40%). AWS announced on-demand cuts of up to 45% for P4/P5 in "
    "June 2025 which are not reflected here. Run Catalog.refresh() online, or Catalog.override() with your "
    "negotiated prices."
)


def _r(x: float) -> float:
    return round(x, 4)


def build() -> dict[str, Any]:
    """Return the catalog document (what ``gpu_catalog.json`` holds)."""
    instances = []
    for cloud, rows in (("aws", AWS), ("gcp", GCP), ("azure", AZURE)):
        base = BASE_REGION[cloud]
        for name, gpu, n, gmem, vcpus, mem, net, od, spot_f, regions, extra in rows:
            prices = {}
            for region in regions:
                f = REGION_FACTOR[cloud][region]
                p = od * f
                prices[region] = {
                    "on_demand": _r(p),
                    "spot": _r(p * spot_f),
                    "reserved_1y": _r(p * RESERVED_1Y_FACTOR),
                }
            instances.append(
                {
                    "cloud": cloud,
                    "name": name,
                    "gpu": gpu,
                    "gpu_count": n,
                    "gpu_memory_gb": gmem,
                    "vcpus": vcpus,
                    "memory_gb": mem,
                    "network_gbps": net,
                    "source": SOURCES[cloud],
                    "spot_source": SPOT_SOURCES[cloud],
                    "date": SEED_DATE,
                    "price_basis": (
                        f"on-demand {od} USD/h list price in {base}; other regions x regional factor; "
                        f"spot = {spot_f:.2f} x on-demand (typical); reserved_1y = "
                        f"{RESERVED_1Y_FACTOR:.2f} x on-demand (rule of thumb)"
                    ),
                    "extra": extra,
                    "prices": prices,
                }
            )
    return {
        "schema_version": 1,
        "source": "gpu_notebook seed table (providers' public list prices, best known; estimates)",
        "date": SEED_DATE,
        "notes": NOTES,
        "region_factors": REGION_FACTOR,
        "instances": instances,
    }


def main() -> None:
    path = Path(__file__).resolve().parent.parent / "data" / "gpu_catalog.json"
    path.write_text(json.dumps(build(), indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
