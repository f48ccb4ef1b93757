"""Dashboard links in a cluster's status, through the Jupyter server's ``jupyter-server-proxy``.

The journey: a real Jupyter server (a JupyterHub-like ``base_url``, a token, ``jupyter-server-proxy`` installed)
starts a real kernel; in it a monitor serves Prometheus metrics and a status lists its link. The kernel found
its server (its parent process, in Jupyter's runtime directory), so the link is ``<base_url>proxy/<port>/``,
and fetching it through the server with the token returns our metrics. No Ray: the link does not need it.
"""

from __future__ import annotations

import json
import os
import pathlib
import queue
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest

from gpu_notebook._settings import PROXY_PREFIX_VAR
from gpu_notebook.cluster._status import (
    ClusterStatus,
    DashboardLink,
    dashboard_links,
    jupyter_proxy_prefix,
)

BASE_URL = "/user/student/"
KERNEL_CODE = """
import json
from gpu_notebook.cluster._status import ClusterStatus, dashboard_links
from gpu_notebook.monitor import Monitor, NodeSampler
from gpu_notebook.testing.nvml import FakeNVML

sampler = NodeSampler("node-0", nvml=FakeNVML(2), interval=0.2).start()
mon = Monitor(samplers=[sampler]).start()
srv = mon.serve_prometheus()
st = ClusterStatus("demo", "local", "local", "running", "gloo", 5.0, dashboards=dashboard_links())
print(json.dumps({"links": [[d.name, d.url, d.direct] for d in st.dashboards], "text": str(st)}))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(url: str, token: str | None = None, method: str = "GET", body: bytes | None = None):
    req = urllib.request.Request(url, data=body, method=method)
    if token:
        req.add_header("Authorization", f"token {token}")
    return urllib.request.urlopen(req, timeout=20)


def test_prefix_sources_in_order_and_links_built_from_them() -> None:
    pytest.importorskip("jupyter_server_proxy")
    assert jupyter_proxy_prefix({"JUPYTERHUB_SERVICE_PREFIX": "/user/alice"}) == "/user/alice/"
    assert (
        jupyter_proxy_prefix({PROXY_PREFIX_VAR: "lab/", "JUPYTERHUB_SERVICE_PREFIX": "/user/a/"}) == "/lab/"
    )
    assert jupyter_proxy_prefix({PROXY_PREFIX_VAR: "off", "JUPYTERHUB_SERVICE_PREFIX": "/user/a/"}) is None
    assert jupyter_proxy_prefix({PROXY_PREFIX_VAR: "/"}) == "/"
    local, remote = (
        dashboard_links(ray_dashboard=url, prefix="/user/alice/")[-1]
        for url in ("127.0.0.1:8265", "http://10.0.0.7:8265")
    )
    assert local == DashboardLink("Ray dashboard", "/user/alice/proxy/8265/", "http://127.0.0.1:8265/")
    assert not remote.proxied and remote.url == "http://10.0.0.7:8265/"  # the proxy reaches this machine only
    st = ClusterStatus("c", "local", "local", "running", "gloo", 1.0, dashboards=[local])
    assert "Ray dashboard       /user/alice/proxy/8265/  (direct: http://127.0.0.1:8265/)" in str(st)
    assert "<a href='/user/alice/proxy/8265/'" in st._repr_html_()
    assert "Dashboards" not in str(ClusterStatus("c", "local", "local", "running", "gloo", 1.0))


def _wait_for_kernel(kc: Any, timeout: float, log: pathlib.Path) -> None:
    """Until the kernel answers kernel_info and its IOPub reaches us. Not ``wait_for_ready``: without a kernel
    manager that one calls the kernel dead when one heartbeat is late (seen in CI, on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        kc.kernel_info()
        try:
            msg = kc.get_shell_msg(timeout=2)
        except queue.Empty:
            msg = None
        if msg is not None and msg["msg_type"] == "kernel_info_reply":
            try:  # the reply's status messages on IOPub: it is connected (else ask again)
                kc.get_iopub_msg(timeout=0.5)
                return
            except queue.Empty:
                pass
        assert time.monotonic() < deadline, f"the kernel never answered: {log.read_text()[-3000:]}"


def test_prometheus_link_opens_through_a_real_jupyter_server_proxy(tmp_path) -> None:
    pytest.importorskip("jupyter_server_proxy")
    from jupyter_client import BlockingKernelClient

    token = "gnb-proxy-test-token"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_") and k != PROXY_PREFIX_VAR}
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")  # where the kernel finds its server
    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter_server",
            "--no-browser",
            "--allow-root",  # CI containers run as root
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.base_url={BASE_URL}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={tmp_path}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    origin = f"http://127.0.0.1:{port}"
    kc = None
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                _request(f"{origin}{BASE_URL}api/status", token).close()
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "server.log").read_text()[-3000:]
                time.sleep(0.2)
        with _request(f"{origin}{BASE_URL}api/kernels", token, "POST", b'{"name": "python3"}') as r:
            kernel_id = json.loads(r.read())["id"]
        kc = BlockingKernelClient(connection_file=str(tmp_path / "runtime" / f"kernel-{kernel_id}.json"))
        kc.load_connection_file()
        kc.start_channels()
        _wait_for_kernel(kc, 120, tmp_path / "server.log")
        out: list[str] = []

        def hook(msg: dict) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = kc.execute_interactive(KERNEL_CODE, timeout=60, output_hook=hook)
        assert reply["content"]["status"] == "ok", "".join(out)
        seen = json.loads("".join(out))
        ((name, url, direct),) = seen["links"]
        assert name == "Prometheus metrics"
        assert url.startswith(f"{BASE_URL}proxy/") and url.endswith("/metrics"), url
        assert direct == f"http://127.0.0.1:{url.split('/')[-2]}/metrics"
        assert f"Prometheus metrics  {url}  (direct: {direct})" in seen["text"]
        with _request(origin + url, token) as r:
            assert r.status == 200
            body = r.read().decode()
        assert 'gpu_notebook_gpu_utilization_percent{node="node-0",gpu="1"' in body
        with _request(origin + url) as r:  # the proxy is behind the server's login: no token, no metrics
            assert "/login" in r.url and "gpu_notebook_gpu" not in r.read().decode()
    finally:
        if kc is not None:
            kc.stop_channels()
        server.terminate()  # shuts its kernels down too
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_gpu_monitor_prometheus_on_a_cluster_exports_its_cost_and_status_links_it(shared, ip, monkeypatch):
    """The default journey: %gpu_cluster start, %gpu_monitor prometheus, %gpu_cluster status (real Ray)."""
    from IPython.utils.capture import capture_output

    monkeypatch.setenv(PROXY_PREFIX_VAR, "/user/student/")  # as under a Jupyter server with the proxy
    with capture_output() as cap:
        ip.run_line_magic("gpu_monitor", "prometheus")
    try:
        through, direct = cap.stdout.splitlines()
        port = direct.rsplit(":", 1)[-1].split("/")[0]
        assert through == f"Prometheus metrics through Jupyter at /user/student/proxy/{port}/metrics"
        with urllib.request.urlopen(direct.rsplit(" ", 1)[-1], timeout=20) as r:
            text = r.read().decode()
        # the cluster's state and its cost ($0 on a local cluster), although %gpu_cost never ran
        assert 'gpu_notebook_cluster_up{cluster="shared"} 1' in text
        assert 'gpu_notebook_cost_usd_per_hour{cluster="shared"} 0.0' in text
        assert 'gpu_notebook_cost_info{cluster="shared",local="true"' in text
        links = shared.status().dashboards
        assert (
            DashboardLink(
                "Prometheus metrics",
                f"/user/student/proxy/{port}/metrics",
                f"http://127.0.0.1:{port}/metrics",
            )
            in links
        )
        with capture_output() as cap:
            ip.run_line_magic("gpu_cluster", "status")
        html = "".join(o.data.get("text/html", "") for o in cap.outputs)
        assert f"<a href='/user/student/proxy/{port}/metrics'" in html
    finally:
        ip.run_line_magic("gpu_monitor", "stop")
