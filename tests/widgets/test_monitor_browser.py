"""One real browser test: JupyterLab + headless Debian Chromium (Playwright) shows a live %gpu_monitor chart.

The test starts ``jupyter lab`` itself (tests/widgets/_browser.py: 127.0.0.1, a random token, a free port, a
temporary root directory), opens a notebook that loads the extension and shows the monitor of this machine,
accepts JupyterLab's "Select Kernel" dialog, runs all cells, waits for the plotly chart to render and checks
that its data change over a few seconds (reading ``element.data`` in the page).
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from typing import Any

import _browser
import pytest

pytestmark = pytest.mark.browser

NOTEBOOK_CELLS = [
    "%load_ext gpu_notebook",
    "%gpu_monitor --local --interval 0.2 --refresh 0.5 --window 120",
]


@pytest.fixture(scope="module")
def sync_api() -> Any:
    """Playwright's sync API, with Debian's Chromium present (skips, or fails under CI=true, without)."""
    return _browser.playwright_sync_api()


@pytest.fixture
def jupyter_lab(tmp_path: pathlib.Path):
    root = tmp_path / "root"
    root.mkdir()
    _browser.write_notebook(root / "monitor.ipynb", NOTEBOOK_CELLS)
    with _browser.jupyter_server(tmp_path, root, "lab") as server:
        yield server


def _first_trace(page: Any) -> dict[str, Any] | None:
    charts = _browser.plotly_charts(page)
    if not charts or not charts[0]["traces"]:
        return None
    t = charts[0]["traces"][0]
    return {"n": len(charts[0]["traces"]), "y": t["y"], "x": t["x"], "name": t["name"]}


def test_gpu_monitor_chart_renders_and_updates_in_jupyterlab(sync_api, jupyter_lab) -> None:
    with sync_api.sync_playwright() as p:
        browser = _browser.launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            _browser.open_notebook(page, sync_api, _browser.notebook_url(jupyter_lab, "lab", "monitor.ipynb"))
            _browser.run_all_cells(page)
            page.wait_for_selector(".js-plotly-plot", timeout=150_000)

            deadline = time.monotonic() + 60
            first = _first_trace(page)
            while (first is None or not first["y"]) and time.monotonic() < deadline:
                page.wait_for_timeout(500)
                first = _first_trace(page)
            assert first is not None and first["y"], "the chart rendered without data"
            assert first["n"] == 3  # host CPU, memory, network on this GPU-less machine
            later = first
            deadline = time.monotonic() + 60
            while json.dumps(later) == json.dumps(first) and time.monotonic() < deadline:
                page.wait_for_timeout(1000)
                later = _first_trace(page)
            assert later is not None and json.dumps(later) != json.dumps(first), (
                "the chart data did not change"
            )
            assert len(later["y"]) >= len(first["y"]) and later["x"][-1] > first["x"][-1]
            if os.environ.get("GNB_SCREENSHOT"):  # for a human look: GNB_SCREENSHOT=/tmp/monitor.png
                page.screenshot(path=os.environ["GNB_SCREENSHOT"], full_page=True)
            header = page.locator(".gpu-notebook-monitor-header").first.inner_text()
            assert "nodes" in header and "mean CPU" in header
        finally:
            browser.close()
