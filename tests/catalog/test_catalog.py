"""Tests of the shipped GPU instance catalog: data quality, lookups, find() errors and user overrides."""

from __future__ import annotations

import json
import re

import pytest

from gpu_notebook.catalog import Catalog, CatalogError, InstanceType, _seed, get_catalog, parse_gpu


@pytest.fixture
def cat() -> Catalog:
    return Catalog.shipped()  # a private copy: overrides in one test never leak into another


def test_every_entry_has_source_date_and_positive_prices(cat: Catalog) -> None:
    assert len(cat) >= 60
    for it in cat:
        assert it.source.startswith("https://"), it
        assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", it.date), it
        assert it.regions, it
        assert it.gpu_count >= 1 and it.gpu_memory_gb > 0 and it.vcpus > 0 and it.memory_gb > 0
        assert it.price_basis
        for region in it.regions:
            p = it.prices_in(region)
            assert set(p) == {"on_demand", "spot", "reserved_1y"}, (it.name, region)
            assert all(v > 0 for v in p.values())
            assert p["spot"] < p["on_demand"], (it.name, region)
            assert p["reserved_1y"] < p["on_demand"], (it.name, region)


def test_catalog_labels_itself_an_estimate(cat: Catalog) -> None:
    assert cat.date == _seed.SEED_DATE
    assert "estimate" in repr(cat).lower()
    assert "estimate" in cat._repr_html_().lower()
    assert "ESTIMATES" in cat.notes


def test_shipped_json_is_what_the_seed_builds() -> None:
    from importlib import resources

    shipped = json.loads(resources.files("gpu_notebook").joinpath("data/gpu_catalog.json").read_text())
    assert shipped == json.loads(json.dumps(_seed.build()))


@pytest.mark.parametrize(
    "cloud,name,gpu,count",
    [
        ("aws", "p5.48xlarge", "H100", 8),
        ("aws", "p4d.24xlarge", "A100", 8),
        ("aws", "p4de.24xlarge", "A100", 8),
        ("aws", "p3.2xlarge", "V100", 1),
        ("aws", "p3.8xlarge", "V100", 4),
        ("aws", "p3.16xlarge", "V100", 8),
        ("aws", "p3dn.24xlarge", "V100", 8),
        ("aws", "g5.xlarge", "A10G", 1),
        ("aws", "g5.48xlarge", "A10G", 8),
        ("aws", "g6.xlarge", "L4", 1),
        ("aws", "g4dn.xlarge", "T4", 1),
        ("gcp", "a2-highgpu-1g", "A100", 1),
        ("gcp", "a2-highgpu-8g", "A100", 8),
        ("gcp", "a2-ultragpu-8g", "A100", 8),
        ("gcp", "a3-highgpu-8g", "H100", 8),
        ("gcp", "g2-standard-4", "L4", 1),
        ("gcp", "n1-standard-8-t4x1", "T4", 1),
        ("gcp", "n1-standard-8-v100x1", "V100", 1),
        ("azure", "Standard_NC24ads_A100_v4", "A100", 1),
        ("azure", "Standard_ND96asr_v4", "A100", 8),
        ("azure", "Standard_ND96amsr_A100_v4", "A100", 8),
        ("azure", "Standard_ND96isr_H100_v5", "H100", 8),
        ("azure", "Standard_NC4as_T4_v3", "T4", 1),
        ("azure", "Standard_NC6s_v3", "V100", 1),
    ],
)
def test_required_instance_types_present(cat: Catalog, cloud: str, name: str, gpu: str, count: int) -> None:
    it = cat.get(cloud, name)
    assert isinstance(it, InstanceType)
    assert (it.gpu, it.gpu_count) == (gpu, count)
    assert len(it.regions) >= 2


def test_gcp_entries_carry_machine_and_accelerator(cat: Catalog) -> None:
    for it in cat.instances(cloud="gcp"):
        assert it.extra["machine_type"]
        assert it.extra["accelerator_type"].startswith("nvidia-")
        assert it.extra["accelerator_count"] == it.gpu_count


def test_get_unknown_names_close_matches(cat: Catalog) -> None:
    with pytest.raises(CatalogError, match="did you mean: p4d.24xlarge"):
        cat.get("aws", "p4d.24xlarg")
    with pytest.raises(CatalogError, match="unknown cloud"):
        cat.get("ibm", "x")
    assert cat.get("azure", "standard_nc24ads_a100_v4").name == "Standard_NC24ads_A100_v4"


def test_price_errors_for_missing_region(cat: Catalog) -> None:
    it = cat.get("aws", "p4de.24xlarge")
    with pytest.raises(CatalogError, match="regions with prices: us-east-1, us-west-2"):
        it.price("eu-west-1")
    with pytest.raises(CatalogError, match="unknown market"):
        it.price("us-east-1", "lunar")


def test_instances_filters(cat: Catalog) -> None:
    a100 = cat.instances(cloud="aws", gpu="A100")
    assert {i.name for i in a100} == {"p4d.24xlarge", "p4de.24xlarge"}
    assert {i.name for i in cat.instances(cloud="aws", gpu="A100-80GB")} == {"p4de.24xlarge"}
    assert all("eu-west-1" in i.regions for i in cat.instances(region="eu-west-1"))
    assert {i.cloud for i in cat.instances(gpu="H100")} == {"aws", "gcp", "azure"}


def test_parse_gpu() -> None:
    assert parse_gpu("A100") == ("A100", None, None)
    assert parse_gpu("a100-80gb:8") == ("A100", 80.0, 8)
    assert parse_gpu("nvidia-tesla-v100") == ("V100", None, None)
    assert parse_gpu("A10G:1") == ("A10G", None, 1)
    with pytest.raises(CatalogError):
        parse_gpu("A100:eight")


def test_find_cheapest_first(cat: Catalog) -> None:
    hits = cat.find("aws", gpu="A100", count=8, region="us-east-1")
    assert [h.name for h in hits] == ["p4d.24xlarge", "p4de.24xlarge"]
    l4 = cat.find("gcp", gpu="L4", count=1, region="us-central1")
    prices = [h.price("us-central1") for h in l4]
    assert prices == sorted(prices) and len(l4) >= 4
    assert cat.find("aws", gpu="A100:8")[0].name == "p4d.24xlarge"
    spot = cat.find("aws", gpu="A10G", count=1, region="us-east-1", market="spot")
    assert spot[0].name == "g5.xlarge"
    assert cat.find("gcp", gpu="A100-80GB", count=8)[0].name == "a2-ultragpu-8g"


def test_find_errors_list_alternatives(cat: Catalog) -> None:
    with pytest.raises(CatalogError) as e:
        cat.find("aws", gpu="H100", count=8, region="eu-west-1")
    assert "regions with 8x H100: ap-northeast-1, us-east-1" in str(e.value)
    assert "GPUs in eu-west-1: A100, A10G, L4, T4, V100" in str(e.value)
    with pytest.raises(CatalogError, match="A100 counts in us-east-1: 8"):
        cat.find("aws", gpu="A100", count=3, region="us-east-1")
    with pytest.raises(CatalogError, match="L4 is offered on: aws, gcp"):
        cat.find("azure", gpu="L4", count=1)
    with pytest.raises(CatalogError, match="GPUs on gcp: A100, H100, L4, T4, V100"):
        cat.find("gcp", gpu="A10G")
    with pytest.raises(TypeError, match="region="):
        cat.find("aws", "A100", "us-east-1")  # type: ignore[arg-type]


def test_overrides_apply(cat: Catalog) -> None:
    it = cat.get("aws", "p4d.24xlarge")
    base = it.price("us-east-1")
    cat.override("aws", "p4d.24xlarge", region="us-east-1", usd_per_hour=20.0)
    assert it.price("us-east-1") == 20.0
    assert it.catalog_price("us-east-1") == base
    assert it.price("us-west-2") == it.catalog_price("us-west-2")  # other regions untouched
    cat.override("aws", "p4d.24xlarge", market="reserved_1y", discount=0.5)  # every region
    assert it.price("us-west-2", "reserved_1y") == pytest.approx(
        it.catalog_price("us-west-2", "reserved_1y") * 0.5
    )
    # an override changes what find() ranks
    cat.override("aws", "p4de.24xlarge", region="us-east-1", usd_per_hour=1.0)
    assert cat.find("aws", gpu="A100", count=8, region="us-east-1")[0].name == "p4de.24xlarge"
    assert len(cat.overrides) == 3
    cat.clear_overrides()
    assert it.price("us-east-1") == base
    with pytest.raises(ValueError):
        cat.override("aws", "p4d.24xlarge", usd_per_hour=1.0, discount=0.1)
    with pytest.raises(ValueError):
        cat.override("aws", "p4d.24xlarge", discount=1.5)


def test_get_catalog_is_cached_and_reloadable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPU_NOTEBOOK_CACHE_DIR", str(tmp_path))
    a = get_catalog(reload=True)
    assert get_catalog() is a
    b = get_catalog(reload=True)
    assert b is not a and len(b) == len(a)


def test_get_catalog_uses_saved_refresh_and_survives_a_broken_one(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("GPU_NOTEBOOK_CACHE_DIR", str(tmp_path))
    cat = Catalog.shipped()
    cat.update_price(
        "aws", "g5.xlarge", "us-east-1", "on_demand", 0.9, source="https://example/refresh", date="2026-11-01"
    )
    cat.source, cat.date = "refreshed", "2026-11-01"
    (tmp_path / "gpu_catalog.json").write_text(json.dumps(cat.to_doc()))
    fresh = get_catalog(reload=True)
    assert fresh.get("aws", "g5.xlarge").price("us-east-1") == 0.9
    assert fresh.date == "2026-11-01" and fresh.get("aws", "g5.xlarge").date == "2026-11-01"
    (tmp_path / "gpu_catalog.json").write_text("{not json")
    assert get_catalog(reload=True).date == _seed.SEED_DATE
    get_catalog(reload=True, use_cache=False)
