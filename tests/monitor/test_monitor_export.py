"""Prometheus exposition (parsed by prometheus_client's own parser, scraped over HTTP) and nvidia-smi CSV."""

from __future__ import annotations

import csv
import io
import re
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML


class Clock:
    def __init__(self, t: float = 1_764_400_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def monitor():
    clock = Clock()
    nodes = []
    for n in range(2):
        gpus = [
            FakeGPU(name='NVIDIA "A100"\\x', util=10 * (n * 2 + i), mem_used_mib=1000 + i, gpm=(i == 0))
            for i in range(2)
        ]
        nodes.append(NodeSampler(f"node-{n}", nvml=FakeNVML(gpus, clock=clock), clock=clock, host=(n == 0)))
    mon = Monitor(samplers=nodes, clock=clock, autopull=False).start()
    for _ in range(3):
        clock.t += 0.5
        for s in nodes:
            s.tick()
    mon.pull()
    yield mon
    mon.stop()


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_prometheus_text_parses_with_one_sample_per_gpu(monitor: Monitor) -> None:
    fams = _families(monitor.prometheus_text())
    util = fams["gpu_notebook_gpu_utilization_percent"]
    assert util.type == "gauge"
    got = {(s.labels["node"], s.labels["gpu"]): s.value for s in util.samples}
    assert got == {("node-0", "0"): 0, ("node-0", "1"): 10, ("node-1", "0"): 20, ("node-1", "1"): 30}
    names = {s.labels["name"] for s in util.samples}
    assert names == {'NVIDIA "A100"\\x'}  # quotes and backslashes survive escaping
    mem = {
        (s.labels["node"], s.labels["gpu"]): s.value
        for s in fams["gpu_notebook_gpu_memory_used_bytes"].samples
    }
    assert mem[("node-1", "1")] == 1001 * 2**20
    energy = fams["gpu_notebook_gpu_energy_joules"]
    assert energy.type == "counter" and all(s.name.endswith("_total") for s in energy.samples)
    assert len(energy.samples) == 4  # typed samples, not an empty family plus untyped ones
    assert "gpu_notebook_gpu_energy_joules_total" not in fams
    sm = fams["gpu_notebook_gpu_sm_active_ratio"]
    assert {s.labels["gpu"] for s in sm.samples} == {"0"}  # only GPUs with GPM
    host = fams["gpu_notebook_host_memory_total_bytes"]
    assert [s.labels["node"] for s in host.samples] == ["node-0"]
    up = {s.labels["node"]: s.value for s in fams["gpu_notebook_node_up"].samples}
    assert up == {"node-0": 1, "node-1": 1}


def test_prometheus_text_one_line_per_gpu_metric(monitor: Monitor) -> None:
    lines = [
        ln for ln in monitor.prometheus_text().splitlines() if ln.startswith("gpu_notebook_gpu_power_watts{")
    ]
    assert len(lines) == 4
    assert all(
        re.match(r'^gpu_notebook_gpu_power_watts\{node="node-\d",gpu="\d",uuid="GPU-[^"]+",name=', ln)
        for ln in lines
    )


def test_prometheus_served_over_http(monitor: Monitor) -> None:
    srv = monitor.serve_prometheus(port=0)
    try:
        with urllib.request.urlopen(srv.url, timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            body = resp.read().decode()
        fams = _families(body)
        assert len(fams["gpu_notebook_gpu_utilization_percent"].samples) == 4
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/csv", timeout=10) as resp:
            assert (
                resp.read()
                .decode()
                .startswith("timestamp, name, utilization.gpu [%], memory.used [MiB], node")
            )
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/nope", timeout=10)
        assert srv.scrapes == 2
    finally:
        monitor.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(srv.url, timeout=2)


def test_csv_has_nvidia_smi_shape(monitor: Monitor, tmp_path) -> None:
    path = tmp_path / "gpu.csv"
    text = monitor.to_csv(str(path))
    assert path.read_text() == text
    lines = text.splitlines()
    assert lines[0] == "timestamp, name, utilization.gpu [%], memory.used [MiB]"
    assert len(lines) == 1 + 3 * 4  # 3 samples x 4 GPUs
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))[1:]
    for ts, _name, util, mem in rows:
        assert re.fullmatch(r"\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d{3}", ts)
        assert re.fullmatch(r"\d+ %", util) and re.fullmatch(r"\d+ MiB", mem)
    assert [r[2] for r in rows[:4]] == ["0 %", "10 %", "20 %", "30 %"]
    assert [r[0] for r in rows] == sorted(r[0] for r in rows)
    with_node = monitor.to_csv(node_column=True).splitlines()
    assert with_node[0].endswith(", node") and with_node[1].endswith(", node-0")
