"""%gpu_cluster subcommands that call other parts: doctor, bench, --dry-run for clouds, --idle-stop/--budget."""

from __future__ import annotations

import re
import time

import pytest

from gpu_notebook import get_manager
from gpu_notebook.cost import BudgetPolicy, IdleStopPolicy, watcher_for

pytestmark = pytest.mark.timeout(240)


def test_doctor_reports_no_gpu_cleanly_on_a_cpu_cluster(ip, shared, capsys):
    res = ip.run_cell("%gpu_cluster doctor")
    assert res.success and res.error_in_exec is None
    out = capsys.readouterr().out
    assert "Traceback" not in out
    lines = out.splitlines()
    assert re.match(r"gpu_notebook doctor: shared: 0 errors, \d+ warnings?, \d+ OK$", lines[0]), out
    rows = {ln.split()[1]: ln for ln in lines[2:] if ln.split()[:1] in (["OK"], ["warning"], ["error"])}
    # every GPU check ran on the workers and says, at level OK, that it was skipped for want of a GPU
    for check in ("cuda-driver", "gpu-arch", "gpu-health"):
        assert rows[check].startswith("OK") and "no GPU on this node" in rows[check], out
    assert re.match(r"OK +gpu-assignment +\S+ +0-1 +no GPU visible to this rank", rows["gpu-assignment"]), out
    assert rows["nccl"].startswith("OK") and "gloo is used" in rows["nccl"]
    assert rows["versions"].startswith("OK") and "identical on every rank" in rows["versions"]


def test_bench_allreduce_through_the_magic(ip, shared, capsys):
    res = ip.run_cell("%gpu_cluster bench allreduce --max-bytes 4K --iters 2")
    assert res.success and res.error_in_exec is None
    out = capsys.readouterr().out
    assert "4096" in out  # the largest size row
    assert "busbw" in out.lower()


@pytest.mark.parametrize(
    "cloud,gpu,region",
    [("aws", "A100:8", "us-east-1"), ("gcp", "A100:8", "us-central1"), ("azure", "A100:8", "eastus")],
)
def test_dry_run_prints_config_and_cost_and_launches_nothing(ip, capsys, cloud, gpu, region):
    before = [c.name for c in get_manager().list()]
    res = ip.run_cell(
        f"%gpu_cluster start --cloud {cloud} --region {region} --gpu {gpu} --workers 2 --spot --dry-run"
    )
    assert res.error_in_exec is None
    out = capsys.readouterr().out
    assert "dry run" in out and "$" in out and "cluster_name:" in out
    assert [c.name for c in get_manager().list()] == before


def test_cloud_options_without_cloud_are_a_usage_error(ip, capsys):
    ip.run_cell("%gpu_cluster start --spot")
    assert "--spot needs --cloud" in capsys.readouterr().err


def test_idle_stop_and_budget_attach_policies(ip, ray_session, capsys):
    ip.run_cell(
        "%gpu_cluster start --name watched --workers 1 --cpus-per-worker 0.25 --idle-stop 30 --budget 5"
    )
    c = get_manager().get("watched")
    try:
        out = capsys.readouterr().out
        assert "idle stop after 30 min" in out and "budget cap $5" in out
        w = watcher_for(c)
        assert w is c.policies and w.running  # the watcher thread checks them on its own
        budget, idle = w.policies
        assert isinstance(budget, BudgetPolicy) and budget.usd == 5.0 and budget.cluster is c
        assert isinstance(idle, IdleStopPolicy) and idle.window_s == 30 * 60 and idle.cluster is c
        assert w.meter.is_local and budget.state == "ok" and idle.state != "stopped"
    finally:
        c.stop()
    deadline = time.monotonic() + 10
    while w.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not w.running  # the cluster's stop ends its watcher


def test_list_shows_cloud_clusters_saved_by_an_earlier_kernel(ip, capsys, tmp_path, monkeypatch):
    from gpu_notebook.cloud import ClusterState

    monkeypatch.setenv("GPU_NOTEBOOK_CONFIG_DIR", str(tmp_path))
    state = ClusterState(name="gnb-old-123abc", cloud="aws", region="us-east-1", status="running")
    state.save()
    ip.run_cell("%gpu_cluster list")
    out = capsys.readouterr().out
    assert "gnb-old-123abc" in out and "earlier kernel" in out and "%gpu_cluster stop gnb-old-123abc" in out
