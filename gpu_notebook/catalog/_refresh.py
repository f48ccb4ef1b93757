"""Refresh catalog prices from the providers' public price lists, and AWS spot prices through boto3.

Sources (no credentials needed unless noted):

* AWS on-demand and 1-year reserved: the Price List Query API (``pricing.get_products``, needs AWS
  credentials) or, opt-in, the public Bulk API offer file per region,
  ``https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json``
  (no credentials, but hundreds of MB per region). Neither includes spot.
* AWS spot: ``ec2.describe_spot_price_history`` (needs AWS credentials), median over availability zones.
* Azure on-demand, spot and 1-year reservations: the Retail Prices API, ``https://prices.azure.com/api/retail/prices``.
* GCP on-demand and spot: the Cloud Billing Catalog API (needs an API key in ``GPU_NOTEBOOK_GCP_API_KEY`` or
  ``GOOGLE_API_KEY``); machine prices are composed from per-vCPU, per-GB and per-GPU SKUs.

Each parser works on the provider's document format and is tested on saved samples in ``tests/data``.
Failures are collected per source; if nothing could be refreshed a :class:`CatalogError` says why (e.g.
offline) and the catalog keeps its prices.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import statistics
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpu_notebook import _settings

from ._types import CatalogError, InstanceType, PriceBook, cache_path, normalize_cloud

AWS_BULK_URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.json"
AZURE_RETAIL_URL = "https://prices.azure.com/api/retail/prices"
GCP_BILLING_URL = "https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus"  # Compute Engine
RESERVED_1Y_FACTOR = 0.60
HOURS_PER_YEAR = 8760.0

Fetch = Callable[[str], bytes]


@dataclass
class RefreshReport:
    """What a refresh changed and what failed."""

    updated: list[str] = field(default_factory=list)  # "aws p4d.24xlarge us-east-1 on_demand 32.77 -> 21.96"
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    saved_to: str | None = None

    @property
    def ok(self) -> bool:
        return bool(self.updated)

    def __repr__(self) -> str:
        return f"RefreshReport({len(self.updated)} prices updated, {len(self.errors)} errors)"

    def __str__(self) -> str:
        lines = [
            f"{len(self.updated)} prices updated" + (f", saved to {self.saved_to}" if self.saved_to else "")
        ]
        lines += [f"  error: {e}" for e in self.errors]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def url_fetcher(timeout: float = 20.0) -> Fetch:
    """A fetch function using urllib with ``timeout`` seconds; errors become :class:`CatalogError`."""

    def fetch(url: str) -> bytes:
        shown = re.sub(r"key=[^&]+", "key=***", url)
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 (https URLs we build)
                return resp.read()
        except urllib.error.HTTPError as e:
            raise CatalogError(f"{shown}: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            reason = getattr(e, "reason", e)
            raise CatalogError(f"cannot reach {shown} ({reason}); offline or blocked?") from None

    return fetch


# -- AWS bulk offer file ---------------------------------------------------------------------------------
def parse_aws_bulk(
    doc: dict[str, Any], names: Iterable[str] | None = None
) -> dict[tuple[str, str], dict[str, float]]:
    """Prices from an AWS EC2 bulk offer file: ``{(instance_type, region): {"on_demand": .., "reserved_1y": ..}}``.

    Keeps Linux, shared tenancy, no pre-installed software, ``capacitystatus == Used`` (SkyPilot's filter).
    ``reserved_1y`` is the standard 1-year no-upfront reservation's hourly rate when the file has it.
    """
    wanted = set(names) if names is not None else None
    skus: dict[str, tuple[str, str]] = {}
    for sku, prod in (doc.get("products") or {}).items():
        a = prod.get("attributes") or {}
        it = a.get("instanceType")
        if not it or (wanted is not None and it not in wanted):
            continue
        if (
            a.get("operatingSystem") != "Linux"
            or a.get("tenancy", "Shared") != "Shared"
            or a.get("preInstalledSw", "NA") != "NA"
            or a.get("capacitystatus", "Used") != "Used"
            or a.get("licenseModel", "No License required") != "No License required"
        ):
            continue
        region = a.get("regionCode") or a.get("location")
        skus[sku] = (it, str(region))
    out: dict[tuple[str, str], dict[str, float]] = {}
    terms = doc.get("terms") or {}
    for sku, offers in (terms.get("OnDemand") or {}).items():
        if sku not in skus:
            continue
        for offer in offers.values():
            for dim in (offer.get("priceDimensions") or {}).values():
                if dim.get("unit") == "Hrs":
                    p = float(dim["pricePerUnit"]["USD"])
                    if p > 0:
                        out.setdefault(skus[sku], {})["on_demand"] = p
    for sku, offers in (terms.get("Reserved") or {}).items():
        if sku not in skus:
            continue
        for offer in offers.values():
            ta = offer.get("termAttributes") or {}
            if (ta.get("LeaseContractLength"), ta.get("PurchaseOption"), ta.get("OfferingClass")) != (
                "1yr",
                "No Upfront",
                "standard",
            ):
                continue
            for dim in (offer.get("priceDimensions") or {}).values():
                if dim.get("unit") == "Hrs" and float(dim["pricePerUnit"]["USD"]) > 0:
                    out.setdefault(skus[sku], {})["reserved_1y"] = float(dim["pricePerUnit"]["USD"])
    return out


def aws_spot_from_history(records: Iterable[dict[str, Any]], region: str) -> dict[tuple[str, str], float]:
    """Median over availability zones of the latest Linux spot price per instance type."""
    latest: dict[tuple[str, str], tuple[Any, float]] = {}
    for r in records:
        if r.get("ProductDescription", "Linux/UNIX") not in ("Linux/UNIX", "Linux/UNIX (Amazon VPC)"):
            continue
        key = (r["InstanceType"], r.get("AvailabilityZone", region))
        ts = r.get("Timestamp")
        if key not in latest or (ts is not None and latest[key][0] is not None and ts > latest[key][0]):
            latest[key] = (ts, float(r["SpotPrice"]))
    per_type: dict[str, list[float]] = {}
    for (it, _az), (_ts, p) in latest.items():
        per_type.setdefault(it, []).append(p)
    return {(it, region): float(statistics.median(ps)) for it, ps in per_type.items() if ps}


def fetch_aws_spot(
    region: str, instance_types: list[str], client: Any = None
) -> dict[tuple[str, str], float]:
    """Current spot prices in ``region`` through boto3 (needs credentials); ``client`` may be given (tests)."""
    if client is None:
        import boto3

        client = boto3.client("ec2", region_name=region)
    now = _dt.datetime.now(_dt.UTC)
    records: list[dict[str, Any]] = []
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=instance_types, ProductDescriptions=["Linux/UNIX"], StartTime=now
    )
    for page in pages:
        records.extend(page.get("SpotPriceHistory", []))
    return aws_spot_from_history(records, region)


_AWS_FILTERS = (
    ("operatingSystem", "Linux"),
    ("tenancy", "Shared"),
    ("preInstalledSw", "NA"),
    ("capacitystatus", "Used"),
)


def aws_products_to_offer(price_list: Iterable[str | dict[str, Any]]) -> dict[str, Any]:
    """Turn Price List Query API ``PriceList`` entries (JSON strings) into the bulk offer-file shape."""
    doc: dict[str, Any] = {"products": {}, "terms": {"OnDemand": {}, "Reserved": {}}}
    for item in price_list:
        d = json.loads(item) if isinstance(item, str) else item
        prod = d.get("product") or {}
        sku = prod.get("sku")
        if not sku:
            continue
        doc["products"][sku] = prod
        for kind in ("OnDemand", "Reserved"):
            terms = (d.get("terms") or {}).get(kind)
            if terms:
                doc["terms"][kind][sku] = terms
    return doc


def fetch_aws_products(region: str, instance_types: list[str], client: Any = None) -> dict[str, Any]:
    """On-demand and reserved prices of ``instance_types`` in ``region`` through ``pricing.get_products``
    (the Price List Query API: needs credentials, small answers), in the bulk offer-file shape."""
    if client is None:
        import boto3

        client = boto3.client("pricing", region_name="us-east-1")
    items: list[Any] = []
    for name in instance_types:
        filters = [
            {"Type": "TERM_MATCH", "Field": f, "Value": v}
            for f, v in (("instanceType", name), ("regionCode", region), *_AWS_FILTERS)
        ]
        for page in client.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
            items.extend(page.get("PriceList", []))
    return aws_products_to_offer(items)


def aws_credentials_available() -> bool:
    """Whether boto3 finds AWS credentials (never reads or prints them beyond that)."""
    try:
        import boto3

        return boto3.Session().get_credentials() is not None
    # boto3 missing, or a broken config file or credential process (botocore raises many types): none found
    except Exception:  # noqa: BLE001
        return False


# -- Azure retail prices ------------------------------------------------------------------------------------
def parse_azure_retail(doc: dict[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """Prices from one page of the Azure Retail Prices API: ``{(armSkuName, armRegionName): {market: usd/h}}``.

    Linux only (Windows meters are skipped), ``Spot`` meters become ``spot``, ``Low Priority`` is skipped,
    1-year reservations (full-term price) become an hourly ``reserved_1y``.
    """
    out: dict[tuple[str, str], dict[str, float]] = {}
    for item in doc.get("Items") or []:
        if item.get("currencyCode", "USD") != "USD" or "Windows" in str(item.get("productName", "")):
            continue
        if "Virtual Machines" not in str(item.get("serviceName", "Virtual Machines")):
            continue
        sku, region = item.get("armSkuName"), item.get("armRegionName")
        price = float(item.get("retailPrice", item.get("unitPrice", 0)) or 0)
        if not sku or not region or price <= 0:
            continue
        meter = f"{item.get('meterName', '')} {item.get('skuName', '')}"
        kind = item.get("type", "Consumption")
        if "Low Priority" in meter:
            continue
        if kind == "Consumption":
            market = "spot" if "Spot" in meter else "on_demand"
            hourly = price
        elif kind == "Reservation" and item.get("reservationTerm") == "1 Year":
            market, hourly = "reserved_1y", price / HOURS_PER_YEAR
        else:
            continue
        out.setdefault((sku, region), {})[market] = hourly
    return out


def azure_url(sku: str, base: str = AZURE_RETAIL_URL) -> str:
    flt = f"serviceName eq 'Virtual Machines' and armSkuName eq '{sku}'"
    return base + "?" + urllib.parse.urlencode({"api-version": "2023-01-01-preview", "$filter": flt})


# -- GCP billing catalog ----------------------------------------------------------------------------------
_GCP_GPU_DESC = {
    "nvidia-tesla-a100": "Nvidia Tesla A100 GPU",
    "nvidia-a100-80gb": "Nvidia A100 80GB GPU",
    "nvidia-h100-80gb": "Nvidia H100 80GB GPU",
    "nvidia-l4": "Nvidia L4 GPU",
    "nvidia-tesla-t4": "Nvidia Tesla T4 GPU",
    "nvidia-tesla-v100": "Nvidia Tesla V100 GPU",
}


def _gcp_unit_price(sku: dict[str, Any]) -> float | None:
    for info in sku.get("pricingInfo") or []:
        rates = (info.get("pricingExpression") or {}).get("tieredRates") or []
        for rate in rates:
            up = rate.get("unitPrice") or {}
            p = float(up.get("units", 0) or 0) + float(up.get("nanos", 0) or 0) / 1e9
            if p > 0:
                return p
    return None


def parse_gcp_skus(
    skus: Iterable[dict[str, Any]], entries: Iterable[InstanceType], regions: Iterable[str] | None = None
) -> dict[tuple[str, str], dict[str, float]]:
    """Compose GCP machine prices from Cloud Billing SKUs: vCPUs x core + GiB x RAM + GPUs x GPU price.

    Returns ``{(instance_name, region): {"on_demand": .., "spot": ..}}`` for the entries whose every part has a
    SKU in that region.
    """
    # (region, usage "OnDemand"/"Preemptible", part) -> price; part: ("core"|"ram", FAMILY) or ("gpu", accel)
    table: dict[tuple[str, str, tuple[str, str]], float] = {}
    for sku in skus:
        cat = sku.get("category") or {}
        if cat.get("resourceFamily") != "Compute":
            continue
        usage = cat.get("usageType")
        if usage not in ("OnDemand", "Preemptible"):
            continue
        desc = str(sku.get("description", ""))
        if re.search(r"(?i)commit|custom|sole tenancy|reserved|dws|calendar|flex", desc):
            continue
        price = _gcp_unit_price(sku)
        if price is None:
            continue
        d = re.sub(r"^(?i:spot preemptible|preemptible)\s+", "", desc)
        part: tuple[str, str] | None = None
        m = re.match(r"(?i)([a-z]\d+[a-z]?) (?:predefined )?instance (core|ram)\b", d)
        if m:
            part = (m.group(2).lower(), m.group(1).upper())
        else:
            for accel, text in _GCP_GPU_DESC.items():
                if d.lower().startswith(text.lower()):
                    part = ("gpu", accel)
                    break
        if part is None:
            continue
        for region in sku.get("serviceRegions") or []:
            table[(region, usage, part)] = price
    wanted = set(regions) if regions is not None else None
    out: dict[tuple[str, str], dict[str, float]] = {}
    for it in entries:
        fam = str(it.extra.get("family", "")).upper()
        accel = str(it.extra.get("accelerator_type") or "")
        n_acc = int(it.extra.get("accelerator_count", it.gpu_count))
        for region in {r for (r, _u, _p) in table}:
            if wanted is not None and region not in wanted:
                continue
            for usage, market in (("OnDemand", "on_demand"), ("Preemptible", "spot")):
                core = table.get((region, usage, ("core", fam)))
                ram = table.get((region, usage, ("ram", fam)))
                gpu = table.get((region, usage, ("gpu", accel))) if accel else 0.0
                if core is None or ram is None or gpu is None:
                    continue
                total = it.vcpus * core + it.memory_gb * ram + n_acc * gpu
                out.setdefault((it.name, region), {})[market] = round(total, 6)
    return out


def _fetch_json(fetch: Fetch, url: str) -> dict[str, Any]:
    data = fetch(url)
    try:
        return json.loads(data)
    except ValueError:
        raise CatalogError(f"{re.sub(r'key=[^&]+', 'key=***', url)}: not JSON") from None


# -- the driver -------------------------------------------------------------------------------------------
def _apply(
    cat: PriceBook,
    report: RefreshReport,
    cloud: str,
    prices: dict[tuple[str, str], dict[str, float]],
    source: str,
    date: str,
    derive_reserved: bool,
) -> None:
    for (name, region), by_market in sorted(prices.items()):
        try:
            it = cat.get(cloud, name)
        except CatalogError:
            continue
        old = dict(it.prices.get(region, {}))
        new = dict(by_market)
        od = new.get("on_demand", old.get("on_demand"))
        if od is None:
            continue
        if "spot" not in new and "spot" in old and "on_demand" in old and old["on_demand"] > 0:
            new["spot"] = old["spot"] / old["on_demand"] * od  # keep the typical spot fraction
        if "reserved_1y" not in new and derive_reserved:
            new["reserved_1y"] = od * RESERVED_1Y_FACTOR
        for market, p in new.items():
            if p <= 0:
                continue
            if market == "spot" and p >= od:
                report.notes.append(
                    f"{cloud} {name} {region}: spot {p:.4f} >= on-demand {od:.4f} (no discount)"
                )
            if abs(old.get(market, -1.0) - p) > 1e-9:
                report.updated.append(
                    f"{cloud} {name} {region} {market} {old.get(market, float('nan')):.4f} -> {p:.4f}"
                )
            cat.update_price(cloud, name, region, market, p, source=source, date=date)


@dataclass
class _Refresh:
    """What every source of one refresh shares: the catalog it changes, the report it fills, how it fetches."""

    cat: PriceBook
    report: RefreshReport
    fetch: Fetch
    urls: dict[str, str]  # base URL overrides by cloud (tests point them at saved samples)
    only: set[str] | None  # the regions asked for; None: every region the catalog lists
    today: str  # the date each updated price is stamped with

    def apply(
        self, cloud: str, prices: dict[tuple[str, str], dict[str, float]], source: str, derive_reserved: bool
    ) -> None:
        """Merge ``prices`` of ``cloud`` into the catalog and the report (see :func:`_apply`)."""
        _apply(self.cat, self.report, cloud, prices, source, self.today, derive_reserved)


def refresh_catalog(
    cat: PriceBook,
    clouds: Iterable[str] | None = None,
    regions: Iterable[str] | None = None,
    fetch: Fetch | None = None,
    timeout: float = 20.0,
    aws_spot: bool | None = None,
    aws_spot_client: Callable[[str], Any] | None = None,
    aws_source: str = "auto",
    aws_pricing_client: Any = None,
    gcp_api_key: str | None = None,
    urls: dict[str, str] | None = None,
    save: bool = True,
) -> RefreshReport:
    """Refresh ``cat`` in place from public price lists; return a :class:`RefreshReport`.

    Parameters
    ----------
    clouds, regions
        Limit the refresh (default: every cloud, every region the catalog lists).
    fetch
        ``fetch(url) -> bytes``; default urllib with ``timeout``.
    aws_spot
        Query ``describe_spot_price_history`` (default: when boto3 finds credentials).
    aws_spot_client
        ``region -> ec2 client`` (tests point it at a moto server).
    aws_source
        AWS on-demand/reserved prices from ``"api"`` (``pricing.get_products``, needs credentials, small),
        ``"bulk"`` (the public offer file per region: no credentials, but several hundred MB each) or
        ``"auto"`` (the API when credentials exist, else nothing: the bulk download is opt-in).
    aws_pricing_client
        A ``pricing`` client for ``aws_source="api"`` (tests).
    gcp_api_key
        Cloud Billing API key (default ``GPU_NOTEBOOK_GCP_API_KEY`` or ``GOOGLE_API_KEY``).
    urls
        Base URL overrides: ``{"aws": ".../{region}/index.json", "azure": ..., "gcp": ...}``.
    save
        Save the refreshed catalog to :func:`gpu_notebook.catalog.cache_path` so :func:`get_catalog` uses it.

    Raises
    ------
    CatalogError
        When nothing could be refreshed (offline, no access); the message lists each failure.
    """
    only = set(regions) if regions else None
    today = _dt.date.today().isoformat()
    run = _Refresh(cat, RefreshReport(), fetch or url_fetcher(timeout), dict(urls or {}), only, today)
    todo = [normalize_cloud(c) for c in (clouds or ("aws", "gcp", "azure"))]
    # each source records its own failures in the report and returns, so one failing source stops no other
    if "aws" in todo:
        _refresh_aws(run, aws_source, aws_pricing_client, aws_spot, aws_spot_client)
    if "azure" in todo:
        _refresh_azure(run)
    if "gcp" in todo:
        _refresh_gcp(run, gcp_api_key)
    return _finish(run, save)


def _refresh_aws(
    run: _Refresh,
    aws_source: str,
    pricing_client: Any,
    aws_spot: bool | None,
    spot_client: Callable[[str], Any] | None,
) -> None:
    """AWS on-demand and reserved prices, then spot prices, in every region the catalog lists for AWS.

    Raises
    ------
    ValueError
        ``aws_source`` is none of ``auto``, ``api`` or ``bulk`` (a caller's mistake, not a source failing).
    """
    items = run.cat.instances(cloud="aws")
    regions = sorted({r for i in items for r in i.prices if run.only is None or r in run.only})
    source = aws_source
    if source == "auto":
        source = "api" if (pricing_client is not None or aws_credentials_available()) else "none"
    if source not in ("api", "bulk", "none"):
        raise ValueError(f"aws_source is 'auto', 'api' or 'bulk', not {aws_source!r}")
    if source == "none":
        run.report.errors.append(
            "aws on-demand: no AWS credentials for the Price List Query API; pass "
            "aws_source='bulk' to download the public offer files (several hundred MB per region)"
        )
    else:
        _refresh_aws_on_demand(run, items, regions, source, pricing_client)
    if aws_spot is None:
        aws_spot = spot_client is not None or aws_credentials_available()
        if not aws_spot:
            run.report.notes.append("no AWS credentials: spot prices stay typical estimates")
    if aws_spot:
        _refresh_aws_spot(run, items, regions, spot_client)


def _refresh_aws_on_demand(
    run: _Refresh, items: list[InstanceType], regions: list[str], source: str, pricing_client: Any
) -> None:
    """On-demand and reserved prices per region from ``source``: ``"api"`` (boto3) or ``"bulk"`` (offer files).

    A region that fails is reported and the next one is tried; an unreachable offer file ends the loop, as every
    other region's would fail the same way (offline: one message is enough).
    """
    names = [i.name for i in items]
    for region in regions:
        here = [i.name for i in items if region in i.prices]
        if source == "api":
            where = f"pricing.get_products ({region})"
            try:
                offer = fetch_aws_products(region, here, pricing_client)
            # botocore (no access, expired token, offline: many types): this region's failure, reported
            except Exception as e:  # noqa: BLE001
                run.report.errors.append(f"aws {region}: {type(e).__name__}: {str(e)[:200]}")
                continue
        else:
            where = run.urls.get("aws", AWS_BULK_URL).format(region=region)
            try:
                offer = _fetch_json(run.fetch, where)
            except CatalogError as e:
                run.report.errors.append(f"aws {region}: {e}")
                if "cannot reach" in str(e):
                    break  # offline: one message is enough
                continue
        prices = parse_aws_bulk(offer, names)
        prices = {(n, region): p for (n, _r), p in prices.items()}  # one region per offer
        run.apply("aws", prices, source=where, derive_reserved=True)


def _refresh_aws_spot(
    run: _Refresh, items: list[InstanceType], regions: list[str], spot_client: Callable[[str], Any] | None
) -> None:
    """Spot prices per region from ``ec2.describe_spot_price_history``; a region that fails is reported."""
    for region in regions:
        here = [i.name for i in items if region in i.prices]
        try:
            client = spot_client(region) if spot_client else None
            spot = fetch_aws_spot(region, here, client)
            run.apply(
                "aws",
                {k: {"spot": v} for k, v in spot.items()},
                source=f"ec2.describe_spot_price_history ({region})",
                derive_reserved=False,
            )
        # botocore (no access, expired token, offline: many types): this region's failure, reported
        except Exception as e:  # noqa: BLE001
            run.report.errors.append(f"aws spot {region}: {type(e).__name__}: {str(e)[:200]}")


def _refresh_azure(run: _Refresh) -> None:
    """Azure prices of each instance type the catalog lists, one Retail Prices query per type.

    A type that fails is reported and the next one is tried; an unreachable API ends the loop (offline: one
    message is enough).
    """
    for it in run.cat.instances(cloud="azure"):
        try:
            prices = _azure_prices(run, it.name)
            run.apply("azure", prices, source=AZURE_RETAIL_URL, derive_reserved=True)
        except CatalogError as e:
            run.report.errors.append(f"azure {it.name}: {e}")
            if "cannot reach" in str(e):
                break


def _azure_prices(run: _Refresh, sku: str) -> dict[tuple[str, str], dict[str, float]]:
    """Every page (at most 20) of the Retail Prices API's answer for ``sku``, parsed, in the regions asked for."""
    url = azure_url(sku, run.urls.get("azure", AZURE_RETAIL_URL))
    prices: dict[tuple[str, str], dict[str, float]] = {}
    pages = 0
    while url and pages < 20:
        doc = _fetch_json(run.fetch, url)
        for k, v in parse_azure_retail(doc).items():
            prices.setdefault(k, {}).update(v)
        url = doc.get("NextPageLink") or ""
        pages += 1
    if run.only is not None:
        prices = {k: v for k, v in prices.items() if k[1] in run.only}
    return prices


def _refresh_gcp(run: _Refresh, gcp_api_key: str | None) -> None:
    """GCP prices composed from the Cloud Billing Catalog's SKUs; without an API key (and no URL override,
    as tests give) the API cannot be asked, which is reported."""
    key = gcp_api_key or _settings.gcp_api_key() or os.environ.get("GOOGLE_API_KEY")
    if not key and "gcp" not in run.urls:
        run.report.errors.append(
            "gcp: the Cloud Billing Catalog API needs an API key "
            "(set GPU_NOTEBOOK_GCP_API_KEY); GCP prices unchanged"
        )
        return
    try:
        skus = _gcp_skus(run.fetch, run.urls.get("gcp", GCP_BILLING_URL), key)
        prices = parse_gcp_skus(skus, run.cat.instances(cloud="gcp"), run.only)
        run.apply("gcp", prices, source=GCP_BILLING_URL, derive_reserved=True)
    except CatalogError as e:
        run.report.errors.append(f"gcp: {e}")


def _gcp_skus(fetch: Fetch, base: str, key: str | None) -> list[dict[str, Any]]:
    """Every Compute Engine SKU in USD, page by page (at most 50 pages of 5000)."""
    skus: list[dict[str, Any]] = []
    token = ""
    for _ in range(50):
        q = {"currencyCode": "USD", "pageSize": "5000"}
        if key:
            q["key"] = key
        if token:
            q["pageToken"] = token
        doc = _fetch_json(fetch, base + "?" + urllib.parse.urlencode(q))
        skus.extend(doc.get("skus") or [])
        token = doc.get("nextPageToken") or ""
        if not token:
            break
    return skus


def _finish(run: _Refresh, save: bool) -> RefreshReport:
    """The report of a refresh that updated something (the catalog restamped and, with ``save``, saved); with
    nothing updated, the report when nothing failed either, else a :class:`CatalogError` listing the failures
    (the catalog keeps its prices)."""
    cat, report = run.cat, run.report
    if not report.updated:
        if report.errors:
            raise CatalogError(
                "could not refresh GPU prices; keeping the catalog from "
                f"{cat.source} as of {cat.date}:\n  " + "\n  ".join(report.errors)
            )
        return report
    cat.source = "refreshed from providers' price lists (see each instance's source)"
    cat.date = run.today
    if save:
        path = cache_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cat.to_doc(), indent=1))
            report.saved_to = str(path)
        except OSError as e:
            report.notes.append(f"could not save the refreshed catalog to {path}: {e}")
    return report
