"""Capacity and quota: what a cloud's refusal means, the AWS vCPU quota check, and what to try instead.

A launch that the cloud refuses for want of capacity or quota is the most common failure of a GPU launch. The
functions here turn the error chain into ``(code, description)``, check the EC2 vCPU quota before anything is
created (AWS is the only cloud whose quota API the launcher reads), and list alternatives from the catalog:
other regions with the instance type, other instance types with the GPU, the other market.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from gpu_notebook.catalog import get_catalog

from ._spec import CloudRequestError, ClusterSpec, InstanceChoice

if TYPE_CHECKING:
    from ._plan import Plan
    from ._teardown import TeardownReport

__all__ = [
    "AWS_VCPU_QUOTAS",
    "CAPACITY_CODES",
    "QUOTA_URLS",
    "alternatives",
    "aws_vcpu_quota",
    "check_aws_quota",
    "error_code",
    "failure_message",
]

#: Cloud API error codes that mean "no capacity or no quota for this request".
CAPACITY_CODES = {
    "VcpuLimitExceeded",
    "InstanceLimitExceeded",
    "MaxSpotInstanceCountExceeded",
    "InsufficientInstanceCapacity",
    "SpotMaxPriceTooLow",
    "Unsupported",
    "InsufficientCapacity",
    "InsufficientHostCapacity",
    "QUOTA_EXCEEDED",
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "OperationNotAllowed",
    "SkuNotAvailable",
    "QuotaExceeded",
}
QUOTA_URLS = {
    "aws": "https://console.aws.amazon.com/servicequotas/home/services/ec2/quotas",
    "gcp": "https://console.cloud.google.com/iam-admin/quotas",
    "azure": "https://portal.azure.com/#view/Microsoft_Azure_Capacity/QuotaMenuBlade",
}

#: EC2 vCPU quotas by instance family: {family: ((on-demand code, name), (spot code, name))}.
AWS_VCPU_QUOTAS = {
    "p": (("L-417A185B", "Running On-Demand P instances"), ("L-7212CCBC", "All P Spot Instance Requests")),
    "g": (
        ("L-DB2E81BA", "Running On-Demand G and VT instances"),
        ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ),
}
AWS_VCPU_QUOTAS["vt"] = AWS_VCPU_QUOTAS["g"]


def aws_vcpu_quota(region: str, instance_type: str, spot: bool) -> tuple[str, str, float] | None:
    """``(quota code, quota name, vCPUs allowed)`` for ``instance_type``'s family, or None if unknown/unreadable."""
    match = re.match(r"[a-z]+", instance_type.lower())
    family = match.group(0) if match else ""
    if family not in AWS_VCPU_QUOTAS:
        return None
    code, name = AWS_VCPU_QUOTAS[family][1 if spot else 0]
    try:
        import boto3
        import botocore.exceptions as bexc
    except ImportError:
        return None
    try:
        resp = boto3.client("service-quotas", region_name=region).get_service_quota(
            ServiceCode="ec2", QuotaCode=code
        )
        return code, name, float(resp["Quota"]["Value"])
    except (bexc.BotoCoreError, bexc.ClientError, KeyError, TypeError, ValueError):
        return None  # no permission, not supported (e.g. an emulator), offline: launch and let EC2 decide


def error_code(exc: BaseException) -> tuple[str | None, str]:
    """(code, description) from a launcher exception chain (NodeLaunchException, botocore ClientError...)."""
    seen = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        category = getattr(cur, "category", None)
        if category:
            return str(category), str(getattr(cur, "description", "") or "")
        response = getattr(cur, "response", None)
        if isinstance(response, dict) and "Error" in response:
            err = response["Error"]
            return str(err.get("Code")), str(err.get("Message", ""))
        cur = cur.__cause__ or cur.__context__
    return None, str(exc)


def alternatives(spec: ClusterSpec, worker: InstanceChoice, catalog: Any = None) -> list[str]:
    """Other regions with this instance type and other instance types with this GPU (cheapest first)."""
    out: list[str] = []
    try:
        cat = catalog if catalog is not None else get_catalog()
        it = cat.get(spec.cloud, worker.name)
        regions = []
        for region in getattr(it, "regions", []):
            if region != spec.region:
                try:
                    regions.append((it.price(region, market="spot" if spec.spot else "on_demand"), region))
                except LookupError:  # no price in that market there
                    continue
        if regions:
            out.append(f"{worker.name} in " + ", ".join(f"{r} (${p:.2f}/h)" for p, r in sorted(regions)[:4]))
        if worker.gpu:
            others = [
                o for o in cat.find(spec.cloud, gpu=worker.gpu, region=spec.region) if o.name != worker.name
            ]
            if others:
                out.append(
                    f"other {worker.gpu} instances in {spec.region}: "
                    + ", ".join(f"{o.name} ({o.gpu_count}x)" for o in others[:4])
                )
    # alternatives only decorate an error message: a catalog that cannot answer must not hide the real error
    except Exception:  # noqa: BLE001
        pass
    out.append("--spot off (on-demand)" if spec.spot else "--spot (a separate capacity pool)")
    return out


def check_aws_quota(spec: ClusterSpec, plan: Plan, catalog: Any = None) -> None:
    """Refuse a launch whose workers need more vCPUs than the account's EC2 quota allows (before launching).

    Raises
    ------
    CloudRequestError
        The quota is too low; the message names it, the alternatives, and where to ask for more.
    """
    worker = plan.resolved.worker
    quota = aws_vcpu_quota(str(spec.region), worker.name, spec.spot)
    if quota is None or worker.vcpus is None:
        return
    code, name, allowed = quota
    need = float(worker.vcpus) * int(spec.max_workers or spec.workers)
    if allowed >= need:
        return
    alts = alternatives(spec, worker, catalog)
    raise CloudRequestError(
        f"aws quota too low in {spec.region}: {spec.max_workers} x {worker.name} needs {need:.0f} vCPUs of "
        f"'{name}' ({code}), the account allows {allowed:.0f}. Nothing was launched.\n"
        f"Alternatives: {'; '.join(alts)}\nOr request a quota increase: {QUOTA_URLS['aws']}"
    )


def failure_message(
    spec: ClusterSpec,
    plan: Plan,
    code: str | None,
    desc: str,
    report: TeardownReport,
    catalog: Any = None,
) -> str:
    """Why a VM launch failed, what to try instead when it was capacity or quota, and what was cleaned up."""
    worker = plan.resolved.worker
    lines = [
        f"Launching {spec.cloud} cluster {spec.name} failed: {code + ': ' if code else ''}{desc}".rstrip()
    ]
    if code in CAPACITY_CODES or "quota" in desc.lower() or "capacity" in desc.lower():
        lines.append(f"{spec.cloud} has no capacity or quota for this request in {spec.region} right now.")
        alts = alternatives(spec, worker, catalog)
        if alts:
            lines.append("Alternatives: " + "; ".join(alts))
        if spec.cloud in QUOTA_URLS:
            lines.append(f"Or request a quota increase: {QUOTA_URLS[spec.cloud]}")
    lines.append("Cleanup: " + report.message())
    return "\n".join(lines)
