"""Teardown reports: clean, leftovers, and clouds whose API cannot be asked from here (said loudly)."""

from __future__ import annotations

import sys

import pytest

from gpu_notebook.cloud import ClusterSpec, TeardownReport, render_ray_config, resolve
from gpu_notebook.cloud._progress import Stages
from gpu_notebook.cloud._teardown import teardown_vms
from gpu_notebook.cloud._verify import VerificationUnavailable, leftovers_for


def test_report_messages():
    clean = TeardownReport(
        "gnb-a", "aws", found_before=[{"kind": "instance", "id": "i-1"}] * 3, verified=True
    )
    assert clean.clean and "found 3 instances" in clean.message() and "nothing tagged" in clean.message()
    left = TeardownReport(
        "gnb-a", "aws", verified=True, leftovers=[{"kind": "instance", "id": "i-9", "state": "stopping"}]
    )
    assert not left.clean and "STILL LEFT on aws: instance i-9 (stopping)" in left.message()
    assert "color:red" in left._repr_html_()
    unverified = TeardownReport("gnb-a", "gcp", errors=["no SDK"])
    assert (
        not unverified.clean
        and "could NOT be verified" in unverified.message()
        and "no SDK" in str(unverified)
    )


def test_gcp_without_its_sdk_is_reported_unverified_not_clean(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path))
    for mod in ("googleapiclient", "googleapiclient.discovery"):
        monkeypatch.setitem(sys.modules, mod, None)  # as if google-api-python-client were not installed
    spec = ClusterSpec(cloud="gcp", gpu="T4:1", project="p", name="gnb-g", pip_packages=[], image="i")
    config = render_ray_config(spec, resolve(spec))
    with pytest.raises(VerificationUnavailable, match="google-api-python-client"):
        leftovers_for(config)
    report = teardown_vms(config, Stages(None), verify_timeout_s=0, poll_s=0)
    assert not report.verified and not report.clean
    assert any("teardown_cluster" in e for e in report.errors)  # Ray's GCP provider needs the SDK too
    assert "could NOT be verified through the gcp API" in report.message()


def test_unknown_provider_cannot_be_verified():
    with pytest.raises(VerificationUnavailable):
        leftovers_for({"cluster_name": "x", "provider": {"type": "local"}})
