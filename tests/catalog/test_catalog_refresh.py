"""Tests of catalog refresh: the providers' price-list formats (saved samples in tests/data served over real
loopback HTTP), AWS spot history through boto3 against a real moto server, and a clean failure offline."""

from __future__ import annotations

import json
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_notebook.catalog import Catalog, CatalogError, get_catalog
from gpu_notebook.catalog._refresh import (
    aws_spot_from_history,
    parse_aws_bulk,
    parse_azure_retail,
    parse_gcp_skus,
    refresh_catalog,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


class _PriceServer(BaseHTTPRequestHandler):
    """Serves the saved samples the way the providers' endpoints are laid out; records every request."""

    seen: list[str] = []

    def log_message(self, *args: object) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:  # noqa: N802
        self.seen.append(self.path)
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        base = f"http://{self.server.server_address[0]}:{self.server.server_address[1]}"
        body: str | None = None
        if url.path == "/aws/us-east-1/index.json":
            body = (DATA / "aws_ec2_offer_sample.json").read_text()
        elif url.path == "/azure":
            if "armSkuName eq 'Standard_NC24ads_A100_v4'" in q.get("$filter", [""])[0]:
                body = (DATA / "azure_retail_page1.json").read_text().replace("{BASE}", base)
            else:
                body = json.dumps({"BillingCurrency": "USD", "Items": [], "NextPageLink": None, "Count": 0})
        elif url.path == "/azure-page2":
            body = (DATA / "azure_retail_page2.json").read_text()
        elif url.path == "/gcp":
            body = (DATA / "gcp_billing_skus_sample.json").read_text()
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def price_server() -> Iterator[str]:
    _PriceServer.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _PriceServer)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here any more: connections are refused, like an offline machine
    return port


# -- parsers on the saved samples ---------------------------------------------------------------------------
def test_parse_aws_bulk_keeps_linux_shared_used_and_1y_no_upfront() -> None:
    got = parse_aws_bulk(_load("aws_ec2_offer_sample.json"), ["p4d.24xlarge", "g5.xlarge"])
    assert got == {
        ("p4d.24xlarge", "us-east-1"): {"on_demand": 21.96, "reserved_1y": 14.12},
        ("g5.xlarge", "us-east-1"): {"on_demand": 1.006},
    }
    every = parse_aws_bulk(_load("aws_ec2_offer_sample.json"))
    assert ("m5.large", "us-east-1") in every


def test_parse_azure_retail_markets() -> None:
    p1 = parse_azure_retail(_load("azure_retail_page1.json"))
    assert p1 == {
        ("Standard_NC24ads_A100_v4", "eastus"): {"on_demand": 3.4, "spot": 0.95}
    }  # no Windows, no Low Priority
    p2 = parse_azure_retail(_load("azure_retail_page2.json"))
    assert p2[("Standard_NC24ads_A100_v4", "eastus")] == {"reserved_1y": pytest.approx(17520 / 8760)}
    assert p2[("Standard_NC24ads_A100_v4", "westeurope")] == {"on_demand": 3.9}


def test_parse_gcp_skus_composes_machine_prices() -> None:
    cat = Catalog.shipped()
    got = parse_gcp_skus(_load("gcp_billing_skus_sample.json")["skus"], cat.instances(cloud="gcp"))
    a2 = got[("a2-highgpu-1g", "us-central1")]
    assert a2["on_demand"] == pytest.approx(12 * 0.031611 + 85 * 0.004237 + 2.933908)
    assert a2["spot"] == pytest.approx(12 * 0.009483 + 85 * 0.001271 + 1.1)
    assert got[("n1-standard-8-t4x1", "us-central1")] == {
        "on_demand": pytest.approx(8 * 0.031611 + 30 * 0.004237 + 0.35)
    }
    assert ("g2-standard-4", "us-central1") not in got  # no G2/L4 SKUs in the sample: never guessed


def test_aws_spot_from_history_median_of_latest_per_zone() -> None:
    import datetime as dt

    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(hours=1)
    recs = [
        {
            "InstanceType": "g5.xlarge",
            "AvailabilityZone": "us-east-1a",
            "SpotPrice": "0.50",
            "Timestamp": t0,
            "ProductDescription": "Linux/UNIX",
        },
        {
            "InstanceType": "g5.xlarge",
            "AvailabilityZone": "us-east-1a",
            "SpotPrice": "0.40",
            "Timestamp": t1,
            "ProductDescription": "Linux/UNIX",
        },
        {
            "InstanceType": "g5.xlarge",
            "AvailabilityZone": "us-east-1b",
            "SpotPrice": "0.30",
            "Timestamp": t1,
            "ProductDescription": "Linux/UNIX",
        },
        {
            "InstanceType": "g5.xlarge",
            "AvailabilityZone": "us-east-1c",
            "SpotPrice": "0.20",
            "Timestamp": t1,
            "ProductDescription": "Linux/UNIX",
        },
        {
            "InstanceType": "g5.xlarge",
            "AvailabilityZone": "us-east-1c",
            "SpotPrice": "9.99",
            "Timestamp": t1,
            "ProductDescription": "Windows",
        },
    ]
    assert aws_spot_from_history(recs, "us-east-1") == {("g5.xlarge", "us-east-1"): pytest.approx(0.30)}


# -- the whole refresh over loopback HTTP ---------------------------------------------------------------------
def test_refresh_over_http_updates_prices_and_saves(price_server: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPU_NOTEBOOK_CACHE_DIR", str(tmp_path))
    cat = Catalog.shipped()
    old_spot_frac = cat.get("aws", "p4d.24xlarge").price("us-east-1", "spot") / cat.get(
        "aws", "p4d.24xlarge"
    ).price("us-east-1")
    urls = {
        "aws": price_server + "/aws/{region}/index.json",
        "azure": price_server + "/azure",
        "gcp": price_server + "/gcp",
    }
    report = cat.refresh(
        regions=["us-east-1", "eastus", "us-central1"],
        urls=urls,
        aws_spot=False,
        aws_source="bulk",
        timeout=5,
    )
    assert report.ok
    p4d = cat.get("aws", "p4d.24xlarge")
    assert p4d.price("us-east-1") == 21.96 and p4d.price("us-east-1", "reserved_1y") == 14.12
    assert p4d.price("us-east-1", "spot") == pytest.approx(21.96 * old_spot_frac)  # typical fraction kept
    assert p4d.source.endswith("/aws/us-east-1/index.json") and p4d.date == cat.date != "2025-05"
    nc = cat.get("azure", "Standard_NC24ads_A100_v4")
    assert nc.prices_in("eastus") == {"on_demand": 3.4, "spot": 0.95, "reserved_1y": pytest.approx(2.0)}
    a2 = cat.get("gcp", "a2-highgpu-1g")
    assert a2.price("us-central1", "spot") == pytest.approx(12 * 0.009483 + 85 * 0.001271 + 1.1)
    assert a2.price("us-central1", "reserved_1y") == pytest.approx(0.6 * a2.price("us-central1"))
    # unrelated regions keep the seed estimate
    assert cat.get("aws", "p4d.24xlarge").date == cat.date
    assert any("us-east-1 on_demand" in u for u in report.updated)
    # the refreshed catalog was saved and get_catalog() now uses it
    assert report.saved_to and Path(report.saved_to).is_file()
    assert get_catalog(reload=True).get("aws", "p4d.24xlarge").price("us-east-1") == 21.96
    assert all("key=" not in s or "key=***" in s for s in report.errors)
    get_catalog(reload=True, use_cache=False)


def test_refresh_offline_fails_cleanly_and_keeps_prices(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPU_NOTEBOOK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("GPU_NOTEBOOK_GCP_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    cat = Catalog.shipped()
    before = cat.to_doc()
    dead = f"http://127.0.0.1:{_closed_port()}"
    urls = {"aws": dead + "/aws/{region}/index.json", "azure": dead + "/azure"}
    with pytest.raises(CatalogError) as e:
        refresh_catalog(cat, urls=urls, aws_spot=False, aws_source="bulk", timeout=2)
    msg = str(e.value)
    assert "could not refresh GPU prices; keeping the catalog from" in msg
    assert "cannot reach" in msg and "offline or blocked?" in msg
    assert "needs an API key" in msg  # GCP explains itself too
    assert "Traceback" not in msg
    assert cat.to_doc() == before
    assert not (tmp_path / "gpu_catalog.json").exists()


def test_refresh_aws_spot_through_boto3_against_moto_server(tmp_path, monkeypatch) -> None:
    boto3 = pytest.importorskip("boto3")
    from moto.server import ThreadedMotoServer

    monkeypatch.setenv("GPU_NOTEBOOK_CACHE_DIR", str(tmp_path))
    port = _closed_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:

        def client(region: str):
            return boto3.client(
                "ec2",
                region_name=region,
                endpoint_url=f"http://127.0.0.1:{port}",
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )

        cat = Catalog.shipped()
        dead = f"http://127.0.0.1:{_closed_port()}"
        report = refresh_catalog(
            cat,
            clouds=["aws"],
            regions=["us-east-1"],
            urls={"aws": dead + "/{region}"},
            aws_spot_client=client,
            aws_source="bulk",
            timeout=2,
        )
        assert report.ok, report
        assert any("cannot reach" in e for e in report.errors)  # bulk file offline, spot still refreshed
        g5 = cat.get("aws", "g5.xlarge")
        assert g5.price("us-east-1", "spot") == pytest.approx(0.00001)  # moto's fixed spot price
        assert g5.source == "ec2.describe_spot_price_history (us-east-1)"
        assert g5.price("us-east-1") == 1.006  # on-demand untouched
    finally:
        server.stop()


@pytest.fixture
def no_aws_credentials(monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("GPU_NOTEBOOK_CACHE_DIR", str(tmp_path))


def test_aws_price_list_query_api(no_aws_credentials) -> None:
    """pricing.get_products (needs credentials; no moto support): a real boto3 client with botocore's Stubber."""
    boto3 = pytest.importorskip("boto3")
    from botocore.stub import ANY, Stubber

    offer = _load("aws_ec2_offer_sample.json")
    entry = {
        "product": offer["products"]["SKUP4DLINUX"],
        "serviceCode": "AmazonEC2",
        "terms": {
            "OnDemand": offer["terms"]["OnDemand"]["SKUP4DLINUX"],
            "Reserved": offer["terms"]["Reserved"]["SKUP4DLINUX"],
        },
    }
    client = boto3.client(
        "pricing", region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    cat = Catalog.shipped()
    names = [i.name for i in cat.instances(cloud="aws", region="us-west-2")]
    with Stubber(client) as stub:
        for name in names:
            answer = [json.dumps(entry)] if name == "p4d.24xlarge" else []
            stub.add_response(
                "get_products",
                {"PriceList": answer, "FormatVersion": "aws_v1"},
                {"ServiceCode": "AmazonEC2", "Filters": ANY},
            )
        report = refresh_catalog(
            cat, clouds=["aws"], regions=["us-west-2"], aws_pricing_client=client, aws_spot=False
        )
        stub.assert_no_pending_responses()
    p4d = cat.get("aws", "p4d.24xlarge")
    assert p4d.prices_in("us-west-2")["on_demand"] == 21.96 and p4d.price("us-west-2", "reserved_1y") == 14.12
    assert p4d.source == "pricing.get_products (us-west-2)" and report.ok
    assert p4d.price("us-east-1") == 32.7726  # regions not asked for keep their estimate


def test_aws_without_credentials_does_not_download_the_bulk_files(no_aws_credentials) -> None:
    fetched: list[str] = []

    def fetch(url: str) -> bytes:
        fetched.append(url)
        raise CatalogError("should not be called")

    with pytest.raises(
        CatalogError, match="no AWS credentials for the Price List Query API; pass aws_source='bulk'"
    ):
        refresh_catalog(Catalog.shipped(), clouds=["aws"], fetch=fetch)
    assert fetched == []
