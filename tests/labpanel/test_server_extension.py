"""The panel's server extension in a real Jupyter server (jupyter_server's pytest plugin, ``jp_fetch``), reading
the card of a real kernel that the server itself runs for a notebook, with a real cluster on the session's Ray.

The journey: a notebook's kernel starts a cluster and it is listed within 2 s, with its owner notebook; its live
part keeps changing while a blocking cell runs; the panel's stop ends that cell with "Cluster stopped: from the
JupyterLab panel" and the row goes within 2 s. Around it: authentication on every route, the feed folder private
to the user, and no credential of the kernel's environment in any file or response.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from pytest_jupyter.jupyter_core import *  # noqa: F403 - the plugin's fixtures, for this module only
from pytest_jupyter.jupyter_server import *  # noqa: F403
from pytest_jupyter.pytest_tornasync import *  # noqa: F403
from tornado.httpclient import HTTPClientError

from gpu_notebook import _feed

pytestmark = pytest.mark.timeout(240)

# the session's Ray keeps its auth token under the real home; jp_environ gives the server and kernel another HOME
RAY_TOKEN = Path(os.path.expanduser("~")) / ".ray" / "auth_token"

SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYPANELTESTKEY",
    "AWS_ACCESS_KEY_ID": "AKIAPANELTESTKEY0001",
    "AZURE_CLIENT_SECRET": "azure-panel-test-secret-value",
    "GOOGLE_API_KEY": "gcp-panel-test-api-key-value",
}


@pytest.fixture
def jp_server_config() -> dict[str, Any]:
    return {"ServerApp": {"jpserver_extensions": {"gpu_notebook.labpanel": True}}}


async def _get(jp_fetch: Any, *path: str) -> Any:
    r = await jp_fetch("gpu-notebook", "api", *path)
    return json.loads(r.body)


def _write_card(root: Path, kernel_id: str, name: str, **card: Any) -> Path:
    kdir = _feed.kernel_dir(root, kernel_id)
    _feed.write_json(kdir / _feed.KERNEL_FILE, _feed.kernel_record(kernel_id))
    data = {"card": {"name": name, "kind": "local", "state": "running", **card}, "live": {"t": time.time()}}
    path = _feed.cluster_file(kdir, name)
    _feed.write_json(path, data)
    _feed.write_json(_feed.series_file(kdir, name), {"t": [], "gpus": [], "hosts": [], "cost": None})
    return path


def test_routes_need_the_servers_login(
    jp_fetch: Any, jp_serverapp: Any, http_server_client: Any, jp_asyncio_loop: Any
) -> None:
    jp_asyncio_loop.run_until_complete(_routes(jp_fetch, jp_serverapp, http_server_client))


async def _routes(jp_fetch: Any, jp_serverapp: Any, http_server_client: Any) -> None:
    root = _feed.feed_root(jp_serverapp.runtime_dir)
    _write_card(root, "k1", "a b/c")  # any name: quoted in the id and the routes
    got = await _get(jp_fetch, "clusters")
    assert [e["id"] for e in got["clusters"]] == [f"k1/{quote('a b/c', safe='')}"]
    assert got["clusters"][0]["kernel_alive"] is True and got["clusters"][0]["orphan"] is False
    series = await _get(jp_fetch, "clusters", "k1", quote("a b/c", safe=""), "series")
    assert series["gpus"] == []
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("gpu-notebook", "api", "clusters", "k1", "nope", "series")
    assert missing.value.code == 404
    # without the server's token: refused, for reads and for actions
    for method, path, body in (("GET", "clusters", None), ("POST", "clusters/k1/x/stop", b"{}")):
        url = f"/{jp_serverapp.base_url.strip('/')}/gpu-notebook/api/{path}".replace("//", "/")
        with pytest.raises(HTTPClientError) as refused:
            await http_server_client.fetch(url, method=method, body=body, headers={})
        assert refused.value.code in (401, 403), (method, path)


def test_a_dead_kernels_local_cluster_is_dropped_and_a_cloud_one_is_an_orphan(
    jp_fetch: Any, jp_serverapp: Any, tmp_path: Path, jp_asyncio_loop: Any
) -> None:
    jp_asyncio_loop.run_until_complete(_orphans(jp_fetch, jp_serverapp, tmp_path))


async def _orphans(jp_fetch: Any, jp_serverapp: Any, tmp_path: Path) -> None:
    root = _feed.feed_root(jp_serverapp.runtime_dir)
    lease, log = tmp_path / "c.reaper", tmp_path / "c.reaper.log"
    lease.write_text("{}")
    log.write_text("reaper 999999999: watching kernel 1 for cloud cluster c\nthe kernel (pid 1) is gone\n"
                   "the kernel did not stop cloud cluster c (aws, status up): tearing it down\n")  # fmt: skip
    for kid, kind in (("dead-local", "local"), ("dead-cloud", "cloud")):
        path = _write_card(root, kid, "c", kind=kind, reaper={"lease": str(lease), "log": str(log)})
        record = _feed.read_json(path.parent / _feed.KERNEL_FILE)
        _feed.write_json(path.parent / _feed.KERNEL_FILE, dict(record, pid=2**22 + 12345))  # no such process
    got = (await _get(jp_fetch, "clusters"))["clusters"]
    assert [e["kernel_id"] for e in got] == ["dead-cloud"]
    assert (
        got[0]["orphan"] is True and got[0]["reaper"]["state"] == "up and costing"
    )  # its reaper is not running
    assert not (root / "dead-local").exists()
    lease.unlink()
    log.write_text(log.read_text() + "teardown done: 1 instance(s) terminated\n")
    got = (await _get(jp_fetch, "clusters"))["clusters"]
    assert got[0]["reaper"]["state"] == "gone"


def test_a_notebooks_cluster_in_the_panel_while_a_cell_runs_and_stopped_from_it(
    jp_fetch: Any,
    jp_serverapp: Any,
    jp_root_dir: Path,
    ray_session: Any,
    monkeypatch: pytest.MonkeyPatch,
    jp_asyncio_loop: Any,
) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)  # the kernel inherits them, as from a user's shell
    if RAY_TOKEN.exists():
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(RAY_TOKEN))
    gcs = ray_session.get_runtime_context().gcs_address
    jp_asyncio_loop.run_until_complete(_notebook_journey(jp_fetch, jp_serverapp, jp_root_dir, gcs))


async def _notebook_journey(jp_fetch: Any, jp_serverapp: Any, jp_root_dir: Path, gcs: str) -> None:
    root = _feed.feed_root(jp_serverapp.runtime_dir)
    (jp_root_dir / "train.ipynb").write_text(
        json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    )
    r = await jp_fetch(
        "api", "sessions", method="POST",
        body=json.dumps({"path": "train.ipynb", "type": "notebook", "kernel": {"name": "python3"}}),
    )  # fmt: skip
    kernel_id = json.loads(r.body)["kernel"]["id"]
    from jupyter_client import BlockingKernelClient

    kc = BlockingKernelClient(
        connection_file=jp_serverapp.kernel_manager.get_kernel(kernel_id).connection_file
    )
    kc.load_connection_file()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    try:
        await _journey(jp_fetch, kc, root, kernel_id, gcs)
    finally:
        kc.stop_channels()
        await jp_serverapp.kernel_manager.shutdown_kernel(kernel_id, now=True)


def _execute(kc: Any, code: str, timeout: float = 120) -> str:
    out: list[str] = []

    def hook(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return "".join(out)


async def _journey(jp_fetch: Any, kc: Any, root: Path, kernel_id: str, gcs: str) -> None:
    out = _execute(
        kc,
        f"%load_ext gpu_notebook\n%gpu_cluster start --address {gcs} --workers 1 --cpus-per-worker 0.25 --name panel",
    )
    assert "ready" in out, out
    t0 = time.monotonic()
    entries: list[dict[str, Any]] = []
    while time.monotonic() - t0 < 2.0 and not entries:
        entries = (await _get(jp_fetch, "clusters"))["clusters"]
    assert entries, "the notebook's cluster did not appear within 2 s"
    (e,) = entries
    assert (e["name"], e["kind"], e["kernel_id"], e["notebook"]) == (
        "panel",
        "address",
        kernel_id,
        "train.ipynb",
    )
    assert e["workers"] == 1 and e["state"] == "running" and e["kernel_alive"] is True
    assert e["attach_code"].startswith("%load_ext gpu_notebook")

    # a blocking cell: the feed keeps flowing from the kernel's publisher thread
    cell_out: list[str] = []
    cell = threading.Thread(
        target=lambda: cell_out.append(
            _execute(kc, "%%distributed\nimport time\nfor i in range(60):\n    time.sleep(1)", timeout=90)
        ),
        daemon=True,
    )
    cell.start()
    seen: list[float] = []
    busy = monitoring = False
    deadline = time.monotonic() + 60  # the shared monitor starts on the first look: its samplers take seconds
    series: dict[str, Any] = {}
    while time.monotonic() < deadline and (
        len(set(seen)) < 3 or not busy or not monitoring or not series.get("hosts")
    ):
        (e,) = (await _get(jp_fetch, "clusters"))["clusters"]
        if e.get("busy") and e.get("updated"):
            seen.append(e["updated"])
        busy = busy or bool(e.get("busy"))
        monitoring = bool(e.get("monitoring"))
        # as an open dashboard pane does: the kernel writes a cluster's series only while a pane asks for it
        series = await _get(jp_fetch, "clusters", kernel_id, "panel", "series")
        assert isinstance(series["t"], list) and "updated" in series, series
        await asyncio.sleep(0.5)
    assert busy and len(set(seen)) >= 3, f"the live feed did not flow while the cell ran: {seen} {e}"
    assert monitoring, f"the cluster's monitor did not start: {e}"
    assert e["nodes"] >= 1 and e.get("usd_per_hour") is not None
    assert (root / kernel_id / "panel.series").exists() and series["updated"], series
    assert series["hosts"] and series["hosts"][0]["cpu_percent"], series
    # one time axis for every series (the pane draws them against it)
    assert len(series["t"]) == len(series["hosts"][0]["cpu_percent"]) >= 1, series
    assert series["t"] == sorted(series["t"]) and all(isinstance(x, float) for x in series["t"]), series

    # the pane closes while the sidebar still polls: the kernel stops writing that series and removes its file
    # (a pane opened later sees "none yet", never an old series)
    t0 = time.monotonic()
    while (root / kernel_id / "panel.series").exists() and time.monotonic() - t0 < 30:
        await _get(jp_fetch, "clusters")
        await asyncio.sleep(0.5)
    assert not (root / kernel_id / "panel.series").exists(), "the series outlived its last pane by 30 s"
    assert (await _get(jp_fetch, "clusters"))["clusters"], "the sidebar's list went with the series"

    # stop from the panel: the running cell ends with the panel's reason
    r = await jp_fetch(
        "gpu-notebook", "api", "clusters", kernel_id, "panel", "stop", method="POST", body="{}"
    )
    reply = json.loads(r.body)
    assert reply["ok"] and "stopped" in reply["message"], reply
    cell.join(60)
    assert not cell.is_alive()
    assert "Cluster stopped: from the JupyterLab panel" in cell_out[0], cell_out
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2.0 and (await _get(jp_fetch, "clusters"))["clusters"]:
        pass
    assert (await _get(jp_fetch, "clusters"))["clusters"] == [], (
        "the stopped cluster stayed listed beyond 2 s"
    )

    # the folder is the user's alone, and no credential of the kernel's environment is in any file
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / kernel_id).stat().st_mode) == 0o700
    for path in root.rglob("*"):
        if path.is_file():
            if path.name != "watching":
                assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
            text = path.read_text(errors="replace")
            assert not [k for k, v in SECRETS.items() if v in text], path


def test_clean_masks_every_credential(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    card = {
        "name": "c",
        "labels": {"note": f"key {SECRETS['AWS_SECRET_ACCESS_KEY']} here", "aws_secret_access_key": "x"},
        "url": f"https://x/?sig={SECRETS['GOOGLE_API_KEY']}",
        "id": "AKIAABCDEFGHIJKLMNOP",
        "pem": "-----BEGIN RSA PRIVATE KEY-----\nabc",
        "util": float("nan"),
        "notebook": "/home/me/projects/a-rather-long-folder-name-for-a-notebook/train.ipynb",
    }
    text = json.dumps(_feed.clean(card), allow_nan=False)
    assert not [v for v in SECRETS.values() if v in text]
    assert "AKIAABCDEFGHIJKLMNOP" not in text and "PRIVATE KEY" not in text
    assert '"util": null' in text and card["notebook"] in text  # paths are no secrets


def test_feed_files_are_private_and_atomic(tmp_path: Path) -> None:
    root = _feed.feed_root(tmp_path)
    path = _write_card(root, "k", "c")
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    with pytest.raises(ValueError):
        _feed.kernel_dir(root, "../escape")
    cid = _feed.post_command(path.parent, {"action": "stop", "cluster": "c"})
    (cmd,) = _feed.take_commands(path.parent)
    assert cmd["id"] == cid and _feed.take_commands(path.parent) == []
    _feed.write_reply(path.parent, cid, True, "done")
    assert _feed.read_reply(path.parent, cid)["message"] == "done"
    assert _feed.read_reply(path.parent, cid) is None
    os.environ.pop("GPU_NOTEBOOK_PANEL", None)


def test_the_ray_dashboard_goes_through_the_servers_proxy_when_it_can() -> None:
    from gpu_notebook.labpanel._collect import proxied_path

    assert proxied_path("http://127.0.0.1:8265", True) == "proxy/8265/"
    assert proxied_path("localhost:8266", True) == "proxy/8266/"
    assert proxied_path("http://127.0.0.1:8265", False) is None  # no jupyter-server-proxy: the direct link
    assert proxied_path("http://10.1.2.3:8265", True) is None  # another machine's: the proxy cannot reach it
    assert proxied_path("", True) is None and proxied_path(None, True) is None
    assert proxied_path("http://127.0.0.1:notaport", True) is None


def test_the_use_here_cell_asks_for_token_mode_where_the_owner_uses_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray sends its token to an address typed by hand only in token mode; a Ray that ray.init() started asks for
    it (the browser journey's second notebook failed to connect without it). The token never goes in the cell."""
    from types import SimpleNamespace

    from gpu_notebook.panel._card import attach_code

    c = SimpleNamespace(name="local")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "secret-token-value")
    code = attach_code(c, "10.0.0.5:6379")
    assert code.splitlines() == [
        "%load_ext gpu_notebook",
        "%env RAY_AUTH_MODE=token",
        "%gpu_cluster start --address 10.0.0.5:6379 --name local-here",
    ]
    assert "secret-token-value" not in code
    monkeypatch.delenv("RAY_AUTH_MODE")
    assert "RAY_AUTH_MODE" not in attach_code(c, "10.0.0.5:6379")
    assert attach_code(c, None) == "%load_ext gpu_notebook\n%gpu_cluster start --name local-here"
