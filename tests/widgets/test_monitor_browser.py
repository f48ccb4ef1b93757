"""One real browser test: JupyterLab + headless Debian Chromium (Playwright) shows a live %gpu_monitor chart.

The test starts ``jupyter lab`` itself (127.0.0.1, a random token, a free port, a temporary root directory),
opens a notebook that loads the extension and shows the monitor of this machine, accepts JupyterLab's
"Select Kernel" dialog, runs all cells, waits for the plotly chart to render and checks that its data change
over a few seconds (reading ``element.data[0].y`` in the page).
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from typing import NoReturn

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]

pytestmark = pytest.mark.browser

NOTEBOOK_CELLS = [
    "%load_ext gpu_notebook",
    "%gpu_monitor --local --interval 0.2 --refresh 0.5 --window 120",
]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _missing(what: str) -> NoReturn:
    """Skip on a developer's machine without a browser; fail in CI, where this test must run."""
    if _in_ci():
        pytest.fail(f"{what} (CI=true: the browser test must run; scripts/test.sh installs chromium)")
    pytest.skip(what)


@pytest.fixture(scope="module")
def sync_api():
    """Playwright's sync API, with Debian's Chromium present."""
    if not os.path.exists(CHROMIUM):
        _missing(f"Debian chromium is not installed at {CHROMIUM}")
    try:
        from playwright import sync_api
    except ImportError as exc:
        _missing(f"playwright is not installed ({exc})")
    return sync_api


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_notebook(path: pathlib.Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nbformat.write(nb, path)


@pytest.fixture
def jupyter_lab(tmp_path: pathlib.Path):
    root = tmp_path / "root"
    root.mkdir()
    _write_notebook(root / "monitor.ipynb")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        {
            "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "PYTHONPATH": os.pathsep.join(
                [str(pathlib.Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]
            ),
        }
    )
    log = open(tmp_path / "jupyter.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyter",
            "lab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--ServerApp.port_retries=0",
            *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail("jupyter lab did not start:\n" + (tmp_path / "jupyter.log").read_text()[-3000:])
            time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def test_gpu_monitor_chart_renders_and_updates_in_jupyterlab(sync_api, jupyter_lab) -> None:
    playwright = sync_api
    base, token = jupyter_lab
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(f"{base}/lab/tree/monitor.ipynb?token={token}")
            page.wait_for_selector(".jp-Notebook", timeout=120_000)
            # JupyterLab 4 may ask which kernel to use; accept the default (the notebook's python3)
            try:
                page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=20_000)
                page.click(".jp-Dialog .jp-mod-accept")
            except playwright.TimeoutError:
                pass
            page.wait_for_selector(
                ".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000, state="attached"
            )
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            page.wait_for_selector(".js-plotly-plot", timeout=150_000)

            read = """() => {
                const el = document.querySelector('.js-plotly-plot');
                if (!el || !el.data || !el.data.length) return null;
                return {n: el.data.length, y: Array.from(el.data[0].y || []), x: Array.from(el.data[0].x || []).map(String),
                        name: el.data[0].name};
            }"""
            deadline = time.monotonic() + 60
            first = page.evaluate(read)
            while (first is None or not first["y"]) and time.monotonic() < deadline:
                page.wait_for_timeout(500)
                first = page.evaluate(read)
            assert first is not None and first["y"], "the chart rendered without data"
            assert first["n"] == 3  # host CPU, memory, network on this GPU-less machine
            later = first
            deadline = time.monotonic() + 60
            while json.dumps(later) == json.dumps(first) and time.monotonic() < deadline:
                page.wait_for_timeout(1000)
                later = page.evaluate(read)
            assert json.dumps(later) != json.dumps(first), "the chart data did not change"
            assert len(later["y"]) >= len(first["y"]) and later["x"][-1] > first["x"][-1]
            if os.environ.get("GNB_SCREENSHOT"):  # for a human look: GNB_SCREENSHOT=/tmp/monitor.png
                page.screenshot(path=os.environ["GNB_SCREENSHOT"], full_page=True)
            header = page.locator(".gpu-notebook-monitor-header").first.inner_text()
            assert "nodes" in header and "mean CPU" in header
        finally:
            browser.close()
