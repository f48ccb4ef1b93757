"""Every PromQL query of the shipped Grafana dashboard, run on a real Prometheus scraping our endpoint.

Debian's ``prometheus`` (``/usr/bin/prometheus``; ``scripts/test.sh`` installs it) scrapes ``/metrics`` of a
monitor of two fake-NVML nodes (one busy GPU, one under-used GPU each) that belongs to a cluster with a real
cost meter (AWS list prices) and a budget. The dashboard's template variables are resolved the way Grafana
resolves them (``label_values`` through Prometheus's series API) and substituted; each query must return data.
Without prometheus the test is skipped on a developer's machine and fails under ``CI=true``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import pytest

from gpu_notebook import _registry
from gpu_notebook.cost import cost_meter_for
from gpu_notebook.monitor import Monitor, NodeSampler, grafana_dashboard
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML

PROMETHEUS = "/usr/bin/prometheus"


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WorkshopCluster:
    """What the export reads of a cluster (name, state, kind, workers, start) and the cost meter's ``ray_nodes``.

    The nodes are the two fake-NVML nodes below, so cost and GPU series share their ``node`` label.
    """

    name = "workshop"
    state = "running"
    kind = "local"
    backend = "gloo"
    world_size = 4

    def __init__(self, nodes: list[str]) -> None:
        self.nodes = nodes
        self.started_at = time.time() - 60

    def ray_nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": n, "Alive": True} for n in self.nodes]


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:  # Prometheus says why a query is bad in the body
        raise AssertionError(f"{urllib.parse.unquote(url)}: {e.code} {e.read().decode()}") from None


def _api(base: str, path: str, **params: Any) -> Any:
    query = urllib.parse.urlencode(params, doseq=True)
    reply = _get(f"{base}/api/v1/{path}?{query}")
    assert reply["status"] == "success", reply
    return reply["data"]


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in values.items():
        expr = expr.replace("${" + name + "}", value)
        expr = re.sub(rf"\${name}\b", lambda _m, v=value: v, expr)
    return expr


def _regex(values: list[str]) -> str:
    """A multi-value variable in a ``=~`` matcher, as Grafana sends it: the values regex-escaped, joined with
    ``|``, each backslash doubled inside the PromQL string literal."""
    return "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in values) + ")"


def _resolve_variables(base: str, dashboard: dict[str, Any]) -> dict[str, str]:
    """Each query variable as Grafana fills it: ``label_values(selector, label)``, every value, as a regex."""
    values: dict[str, str] = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] == "datasource":
            continue
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", _substitute(query, values))
        assert m, f"variable {var['name']}: not a label_values query: {query}"
        series = _api(base, "series", **{"match[]": m.group(1)})
        found = sorted({s[m.group(2)] for s in series if m.group(2) in s})
        assert found, f"variable {var['name']} has no values ({query})"
        values[var["name"]] = _regex(found)
    return values


def _targets(dashboard: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            out += [(inner["title"], t) for t in inner.get("targets", [])]
    return out


@pytest.fixture
def monitored_workshop():
    """Two fake nodes sampled at 5 Hz, served over HTTP; the cluster's cost meter prices them on AWS."""
    names = ["node-a", "node-b"]
    samplers = [
        NodeSampler(
            n,
            nvml=FakeNVML([FakeGPU(util=90.0, mem_used_mib=30000), FakeGPU(util=5.0)]),
            interval=0.2,
        )
        for n in names
    ]
    cluster = WorkshopCluster(names)
    pricing = {
        "node-a": ("aws", "p4d.24xlarge", "us-east-1", "on_demand"),
        "node-b": ("aws", "p4d.24xlarge", "us-east-1", "spot"),
    }
    meter = cost_meter_for(cluster, node_pricing=pricing)
    meter.budget_usd = 100.0  # what attach_policies(budget_usd=100) sets
    for s in samplers:
        s.start()
    mon = Monitor(cluster, samplers=samplers, pull_interval=0.2, advice_window=1.0).start()
    srv = mon.serve_prometheus()
    try:
        yield srv
    finally:
        mon.stop()
        for s in samplers:
            s.stop()
        _registry.cost_meters.pop(cluster)


def test_every_dashboard_query_returns_data_from_a_real_prometheus(monitored_workshop, tmp_path) -> None:
    if not os.access(PROMETHEUS, os.X_OK):
        what = f"Debian's prometheus is not installed at {PROMETHEUS}"
        if _in_ci():
            pytest.fail(f"{what} (CI=true: this test must run; scripts/test.sh installs prometheus)")
        pytest.skip(what)
    target = f"127.0.0.1:{monitored_workshop.port}"
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: gpu_notebook\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        dashboard = grafana_dashboard(str(tmp_path / "dashboard.json"))
        assert json.loads((tmp_path / "dashboard.json").read_text()) == dashboard
        # ready once a scrape has stored an advice message (the under-used GPUs are flagged after 1 s)
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                if _api(base, "query", query="gpu_notebook_advice_info")["result"]:
                    break
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-3000:]
            time.sleep(0.3)
        (health,) = [t["health"] for t in _api(base, "targets")["activeTargets"]]
        assert health == "up"

        values = _resolve_variables(base, dashboard)
        assert values == {"instance": _regex([target]), "node": _regex(["node-a", "node-b"])}
        targets = _targets(dashboard)
        exprs = " ".join(t["expr"] for _, t in targets)
        for wanted in (
            "gpu_notebook_gpu_utilization_percent",
            "gpu_notebook_gpu_memory_used_bytes",
            "gpu_notebook_gpu_power_watts",
            "gpu_notebook_cost_spent_usd",
            "gpu_notebook_cost_usd_per_hour",
            "gpu_notebook_cost_budget_usd",
            "gpu_notebook_cost_node_usd_per_hour",
            "gpu_notebook_advice_info",
            "gpu_notebook_cluster_up",
        ):
            assert wanted in exprs, f"the dashboard has no panel on {wanted}"
        now = time.time()
        empty = []
        for title, t in targets:
            assert t["datasource"]["uid"] == "${datasource}"
            expr = _substitute(t["expr"], values)
            assert "$" not in expr, f"{title}: an unresolved variable in {expr}"
            result = _api(base, "query", query=expr)["result"]
            if not t.get("instant"):  # a time series panel: the range query Grafana sends
                rng = _api(base, "query_range", query=expr, start=now - 20, end=now, step="1s")["result"]
                result = result and rng
            if not result:
                empty.append(f"{title}: {expr}")
        assert not empty, "queries without data:\n" + "\n".join(empty)

        by_node = {
            r["metric"]["node"]: float(r["value"][1])
            for r in _api(base, "query", query="gpu_notebook_cost_node_usd_per_hour")["result"]
        }
        assert by_node["node-a"] > by_node["node-b"] > 0  # on-demand costs more than spot
        under = {
            (r["metric"]["node"], r["metric"]["gpu"]): float(r["value"][1])
            for r in _api(base, "query", query="gpu_notebook_gpu_underused")["result"]
        }
        assert under == {("node-a", "0"): 0, ("node-a", "1"): 1, ("node-b", "0"): 0, ("node-b", "1"): 1}
        (state,) = _api(base, "query", query="gpu_notebook_cluster_info")["result"]
        assert state["metric"]["cluster"] == "workshop" and state["metric"]["state"] == "running"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
