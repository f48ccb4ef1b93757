"""The JupyterLab panel in a real browser: JupyterLab 4 and Notebook 7 in headless Debian Chromium (Playwright),
driven as a person would, on a real kernel's local Ray cluster started with ``%gpu_cluster start``'s defaults.

JupyterLab: a cluster started in a cell appears in the "GPU clusters" sidebar within 2 s of the cell ending, with
its owner notebook; the status bar shows the fake NVML's GPU count; a 30 s blocking training cell runs while the
cluster's dashboard pane updates (its latest values, read from the page, change); "Stop" in the sidebar (after its
question) ends that cell with "Cluster stopped: from the JupyterLab panel" and the row goes within 2 s. Then the
cluster is started again, a second notebook gets its "Use here" cell from the sidebar and runs it: both kernels'
clusters are listed; a restart of the first notebook's kernel removes its local cluster from the sidebar.

Notebook 7: the status item (in its top area: Notebook 7 has no status bar) shows the GPU count and opens the
sidebar, whose row appears within 2 s; the dashboard (in the bottom panel) updates during a blocking cell, and
"Stop" in the sidebar ends it with the same message.

The machine has no GPU: a cell the test adds gives the cluster's shared monitor two simulated GPUs per node
(:class:`gpu_notebook.testing.nvml.FakeNVML`); everything else (Ray, the kernels, the server extension, the built
front end, the browser) is real. Screenshots go to the test's folder (printed); with ``GNB_README_SCREENSHOT=1``
the JupyterLab run also writes the panel's screenshots to ``docs/img/panel-sidebar.png`` and
``docs/img/panel-dashboard.png``.

Each front end's kernel starts its own local Ray: run it under the Ray lock (tests/own_ray_files.txt).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import time
from typing import Any

import _browser
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

ROOT = _browser.ROOT
DOCS_IMG = ROOT / "docs" / "img"
LISTED_S = 2.0  # the bound: a cluster appears, and disappears, within this of the cell that made it

FAKE_GPUS_CELL = """\
# test only: this CPU machine has no GPU, so the cluster's shared monitor gets two simulated GPUs per node
import math
from gpu_notebook.monitor import monitor_for, stop_monitors
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML


def simulated_gpus():
    return FakeNVML([
        FakeGPU(util=lambda t: 88 + 8 * math.sin(t / 2), mem_used_mib=lambda t: 61_000 + 900 * math.sin(t / 5)),
        FakeGPU(util=lambda t: 60 + 30 * math.sin(t / 3), mem_used_mib=lambda t: 43_000 + 600 * math.sin(t / 4)),
    ])


_mon = monitor_for(nvml=simulated_gpus, interval=0.5)
if _mon.nvml is not simulated_gpus:  # the panel had started the shared monitor first, with this machine's NVML
    stop_monitors()
    _mon = monitor_for(nvml=simulated_gpus, interval=0.5)
print("simulated GPUs:", _mon.nvml is simulated_gpus)"""

TRAIN_CELL = """\
%%distributed
import time
import torch
import torch.distributed as dist

w = torch.zeros(4)
for step in range({steps}):
    g = torch.ones(4) * (rank + 1)
    dist.all_reduce(g)
    w -= 0.01 * g
    time.sleep(1)
print(f"rank {{rank}} trained {{step + 1}} steps")"""

# %gpu_cluster start's defaults take every CPU of this 2-CPU machine for its two workers; the JupyterLab run gives
# them half a CPU each, so that the second notebook's cluster on the same Ray (its "Use here" cell, sized by what
# is free) fits beside them. Notebook 7's run starts with the defaults.
START_HALF = "%load_ext gpu_notebook\n%gpu_cluster start --cpus-per-worker 0.5"
TRAIN_NOTEBOOK = [
    "%load_ext gpu_notebook\n%gpu_cluster start",
    FAKE_GPUS_CELL,
    TRAIN_CELL.format(steps=60),
    "import ray\nprint('GCS', ray.get_runtime_context().gcs_address)",
]

# JS: the notebook panel open on ``path`` (JupyterLab's main area, Notebook 7's one notebook)
FIND_PANEL = """(path) => {
    const app = window.jupyterapp;
    for (const w of app.shell.widgets('main')) {
        if (w.context && w.context.path === path) { return w; }
    }
    return null;
}"""

RUN_CELL = """async ([path, index]) => {
    const app = window.jupyterapp;
    const panel = (FIND_PANEL)(path);
    if (!panel) { throw new Error('no notebook open on ' + path); }
    app.shell.activateById(panel.id);
    // notebook:run-cell runs the current notebook's cell: wait until the activation made it current
    for (let i = 0; i < 200 && app.shell.currentWidget !== panel; i++) {
        await new Promise((r) => setTimeout(r, 25));
    }
    if (app.shell.currentWidget !== panel) { throw new Error(path + ' did not become the current notebook'); }
    panel.content.activeCellIndex = index;
    window.__gnbRuns = window.__gnbRuns || {};
    const key = path + '#' + index;
    window.__gnbRuns[key] = 'running';
    // not awaited: a blocking cell runs on while the test watches the page
    app.commands.execute('notebook:run-cell').then(
        () => { window.__gnbRuns[key] = 'done'; }, (e) => { window.__gnbRuns[key] = 'failed: ' + e; });
    return key;
}""".replace("FIND_PANEL", FIND_PANEL)

CELL_STATE = """([path, index]) => {
    const panel = (FIND_PANEL)(path);
    if (!panel) { return null; }
    const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
    const cell = panel.context.model.toJSON().cells[index];
    return {
        run: (window.__gnbRuns || {})[path + '#' + index] || null,
        kernel: kernel ? kernel.status : null,
        kernelId: kernel ? kernel.id : null,
        count: cell.execution_count,
        outputs: cell.outputs,
        cells: panel.context.model.toJSON().cells.length,
    };
}""".replace("FIND_PANEL", FIND_PANEL)

ROWS = """() => Array.from(document.querySelectorAll('.gnb-sidebar .gnb-cluster-row')).map((r) => {
    const f = {};
    r.querySelectorAll('[data-field]').forEach((e) => { f[e.dataset.field] = e.textContent; });
    return {id: r.dataset.id, kernel: r.dataset.kernel, state: r.dataset.state, fields: f,
            visible: r.offsetParent !== null};
})"""

DASH_VALUES = """(id) => {
    const pane = Array.from(document.querySelectorAll('.gnb-dashboard')).find((p) => p.dataset.id === id);
    if (!pane) { return null; }
    const v = {};
    pane.querySelectorAll('[data-metric]').forEach((e) => {
        const key = e.dataset.metric + ':' + (e.dataset.gpu || e.dataset.host || '');
        v[key] = e.dataset.value !== undefined ? e.dataset.value : e.textContent;
    });
    const status = pane.querySelector('.gnb-dash-status');
    const util = pane.querySelector('.gnb-chart[data-chart="GPU utilisation"]');
    return {values: v, updates: Number(status && status.dataset.updates || 0),
            samples: Number(((status && status.textContent) || '').split(' ')[0]) || 0,
            visible: pane.offsetParent !== null, lines: pane.querySelectorAll('svg path[data-label]').length,
            utilPaths: util ? Array.from(util.querySelectorAll('path[data-label]')).map((p) => p.getAttribute('d'))
                            : []};
}"""


@pytest.fixture(scope="module")
def sync_api() -> Any:
    """Playwright's sync API, with Debian's Chromium present (skips, or fails under CI=true, without)."""
    return _browser.playwright_sync_api()


def _text_of(outputs: list[dict[str, Any]]) -> str:
    parts = []
    for o in outputs:
        if o.get("output_type") == "stream":
            t = o.get("text", "")
        elif o.get("output_type") == "error":
            t = f"{o.get('ename')}: {o.get('evalue')}"
        else:
            t = o.get("data", {}).get("text/plain", "")
        parts.append("".join(t) if isinstance(t, list) else str(t))
    return "\n".join(parts)


class Notebook:
    """One open notebook of the page, its cells run by index, as Shift+Enter would."""

    def __init__(self, page: Any, path: str) -> None:
        self.page, self.path = page, path

    def state(self, index: int) -> dict[str, Any]:
        s = self.page.evaluate(CELL_STATE, [self.path, index])
        assert s is not None, f"{self.path} is not open"
        return dict(s)

    def start(self, index: int) -> None:
        self.page.evaluate(RUN_CELL, [self.path, index])

    def wait(self, index: int, timeout_s: float = 180) -> str:
        """Wait for cell ``index`` to end; its output text (an error output as ``ename: evalue``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            s = self.state(index)
            if s["run"] != "running" and s["kernel"] == "idle":
                return _text_of(s["outputs"])
            assert time.monotonic() < deadline, f"{self.path} cell {index} did not end in {timeout_s} s: {s}"
            self.page.wait_for_timeout(200)

    def run(self, index: int, timeout_s: float = 180) -> str:
        self.start(index)
        out = self.wait(index, timeout_s)
        assert "Error" not in out or "Cluster stopped" in out, f"{self.path} cell {index}: {out}"
        return out

    def kernel_id(self) -> str:
        return str(self.state(0)["kernelId"])


def rows(page: Any) -> list[dict[str, Any]]:
    return list(page.evaluate(ROWS))


def wait_rows(page: Any, cond: Any, timeout_s: float, what: str) -> tuple[list[dict[str, Any]], float]:
    """Poll the sidebar until ``cond(rows)``; the rows and the seconds it took (fails after ``timeout_s``)."""
    t0 = time.monotonic()
    while True:
        r = rows(page)
        if cond(r):
            return r, time.monotonic() - t0
        assert time.monotonic() - t0 < timeout_s, f"{what}: not within {timeout_s} s; the sidebar shows {r}"
        page.wait_for_timeout(100)


def wait_status(page: Any, selector: str, text: str, timeout_s: float = 30) -> Any:
    """The status item (``selector``) once it shows ``text``; fails after ``timeout_s``."""
    status = page.locator(selector).first
    deadline = time.monotonic() + timeout_s
    while text not in (status.text_content() or "") and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    assert text in (status.text_content() or ""), status.text_content()
    return status


def row_of(page: Any, kernel_id: str) -> Any:
    return page.locator(f'.gnb-sidebar .gnb-cluster-row[data-kernel="{kernel_id}"]').first


def watch_dashboard(page: Any, entry_id: str, seconds: float) -> list[dict[str, Any]]:
    """The dashboard pane's latest values, read once a second for ``seconds``."""
    seen = []
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        v = page.evaluate(DASH_VALUES, entry_id)
        if v is not None:
            seen.append(v)
        page.wait_for_timeout(1000)
    return seen


def check_dashboard_updates(seen: list[dict[str, Any]], where: str) -> None:
    assert len(seen) >= 8, f"{where}: the dashboard pane was not there: {seen}"
    gpu_util = [
        {k: v for k, v in s["values"].items() if k.startswith("util_gpu:") and k != "util_gpu:"} for s in seen
    ]
    assert all(len(u) == 2 for u in gpu_util[-3:]), f"{where}: not two GPUs' utilisation: {seen[-1]}"
    distinct = {tuple(sorted(u.items())) for u in gpu_util if u}
    assert len(distinct) >= 3, f"{where}: the GPUs' utilisation did not change while the cell ran: {distinct}"
    updates = [s["updates"] for s in seen]
    # at least one update a second (a little slack for the page's own timers on a loaded machine)
    assert updates[-1] - updates[0] >= 0.7 * (len(seen) - 1), f"{where}: updates {updates}"
    assert seen[-1]["visible"], f"{where}: the dashboard pane is not shown"
    # the charts draw: a line per GPU in the utilisation chart, over a shared time axis of several samples,
    # and the lines move as samples arrive
    last = seen[-1]
    assert last["samples"] >= 5 and len(last["utilPaths"]) == 2 and all(last["utilPaths"]), (where, last)
    assert len({tuple(s["utilPaths"]) for s in seen if s["utilPaths"]}) >= 3, (
        f"{where}: the lines did not move"
    )
    assert last["lines"] >= 2 + 3, f"{where}: the host charts drew no line: {last}"  # CPU, memory, network


def open_sidebar_lab(page: Any) -> None:
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="gpu-notebook:sidebar"]').first
    tab.click()
    page.wait_for_selector(".gnb-sidebar .gnb-empty, .gnb-sidebar .gnb-cluster-row", state="attached")


def stop_from_sidebar(page: Any, kernel_id: str) -> None:
    row_of(page, kernel_id).locator(".gnb-stop").click()
    page.wait_for_selector(".jp-Dialog .jp-mod-accept")
    assert "Stop cluster" in page.locator(".jp-Dialog").inner_text()
    page.click(".jp-Dialog .jp-mod-accept")


def shot(page: Any, path: pathlib.Path, selector: str | None = None) -> None:
    try:
        if selector:
            page.locator(selector).first.screenshot(path=str(path), timeout=10_000)
        else:
            page.screenshot(path=str(path))
    except Exception as exc:  # noqa: BLE001 - a screenshot is for a human; its failure is not the test's
        print(f"screenshot {path.name} failed: {type(exc).__name__}: {exc}")


def _server(tmp_path: pathlib.Path, app: str) -> Any:
    root = tmp_path / f"root-{app}"
    root.mkdir()
    cells = [START_HALF, *TRAIN_NOTEBOOK[1:]] if app == "lab" else TRAIN_NOTEBOOK
    _browser.write_notebook(root / "train.ipynb", cells)
    _browser.write_notebook(
        root / "second.ipynb", ["# a second notebook: the sidebar's 'Use here' cell goes below"]
    )
    return _browser.jupyter_server(tmp_path, root, app)


def test_panel_in_jupyterlab(sync_api: Any, tmp_path: pathlib.Path) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    readme = os.environ.get("GNB_README_SCREENSHOT", "").strip() not in ("", "0")
    print("screenshots:", shots)
    with _server(tmp_path, "lab") as server, sync_api.sync_playwright() as p:
        browser = _browser.launch(p)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 950})
            page.set_default_timeout(60_000)
            _browser.open_notebook(
                page, sync_api, _browser.notebook_url(server, "lab", "train.ipynb") + "&reset"
            )
            open_sidebar_lab(page)
            empty = page.locator(".gnb-sidebar .gnb-empty")
            deadline = time.monotonic() + 30
            while "No cluster" not in empty.inner_text() and time.monotonic() < deadline:
                page.wait_for_timeout(200)
            assert "No cluster" in empty.inner_text() and rows(page) == [], empty.inner_text()
            train = Notebook(page, "train.ipynb")
            kid = train.kernel_id()

            # a cluster started in a cell: listed within 2 s of the cell's end, with its notebook
            out = train.run(0)
            assert "cluster 'local' ready" in out and "0.5 CPU each" in out, out
            listed, took = wait_rows(page, lambda r: any(x["kernel"] == kid for x in r), LISTED_S, "listed")
            print(f"listed {took:.2f} s after the start cell ended")
            row = next(x for x in listed if x["kernel"] == kid)
            assert row["fields"]["notebook"] == "train.ipynb" and row["fields"]["kind"].startswith("local"), (
                row
            )
            assert row["visible"], "the row is not shown in the sidebar"
            assert "True" in train.run(1), "the simulated GPUs did not reach the cluster's monitor"

            # the status bar: the fake NVML's GPU count (2 per node, one node)
            wait_status(page, ".jp-StatusBar-Widget .gnb-status, .gnb-status", "2 GPUs")
            _, _ = wait_rows(
                page,
                lambda r: any(x["kernel"] == kid and x["fields"].get("gpus") == "2" for x in r),
                30,
                "the row's GPU count",
            )

            # the dashboard pane, beside the notebook, while a blocking training cell runs
            entry_id = row["id"]
            row_of(page, kid).locator(".gnb-dashboard-btn").click()
            page.wait_for_selector(f'.gnb-dashboard[data-id="{entry_id}"]')
            train.start(2)
            page.wait_for_timeout(2000)
            assert train.state(2)["kernel"] == "busy", "the training cell is not running"
            assert (
                page.locator(f'.gnb-cluster-row[data-kernel="{kid}"]')
                .get_attribute("class")
                .count("gnb-busy")
            )
            seen = watch_dashboard(page, entry_id, 30)
            check_dashboard_updates(seen, "JupyterLab")
            shot(page, shots / "lab-dashboard.png")
            shot(page, shots / "lab-sidebar.png", ".gnb-sidebar")
            if readme:
                DOCS_IMG.mkdir(parents=True, exist_ok=True)
                shutil.copy(shots / "lab-dashboard.png", DOCS_IMG / "panel-dashboard.png")
                shutil.copy(shots / "lab-sidebar.png", DOCS_IMG / "panel-sidebar.png")
            assert train.state(2)["run"] == "running", "the 60 s cell ended before the stop"

            # stop from the sidebar: the running cell ends with the panel's reason, the row goes within 2 s
            stop_from_sidebar(page, kid)
            out = train.wait(2, 60)
            assert "Cluster stopped: from the JupyterLab panel" in out, out
            _, took = wait_rows(page, lambda r: not any(x["kernel"] == kid for x in r), LISTED_S, "gone")
            print(f"gone {took:.2f} s after the stopped cell ended")
            assert "Stop" in page.locator(".gnb-sidebar .gnb-message").inner_text()

            # two kernels: the cluster again, and a second notebook that uses it through "Use here"
            train.run(0)
            wait_rows(page, lambda r: any(x["kernel"] == kid for x in r), LISTED_S, "listed again")
            gcs = train.run(3).split("GCS", 1)[1].split()[0]
            # the pane left open shows the new cluster's samples (it is the same name in the same kernel)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                v = page.evaluate(DASH_VALUES, entry_id)
                if v and any(k.startswith("cpu_percent:") and k != "cpu_percent:" for k in v["values"]):
                    break
                page.wait_for_timeout(500)
            else:
                feed = tmp_path / "runtime-lab" / "gpu_notebook"
                files = {str(f): f.read_text()[:1500] for f in feed.rglob("*.json")}
                raise AssertionError(
                    f"the dashboard got no samples of the restarted cluster: {v}; feed: {files}"
                )
            page.evaluate(
                "() => window.jupyterapp.commands.execute('docmanager:open', {path: 'second.ipynb'})"
            )
            second = Notebook(page, "second.ipynb")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                s = page.evaluate(CELL_STATE, ["second.ipynb", 0])
                if s and s["kernel"] == "idle":
                    break
                if page.locator(".jp-Dialog .jp-mod-accept").count():
                    page.click(".jp-Dialog .jp-mod-accept")
                page.wait_for_timeout(250)
            kid2 = second.kernel_id()
            assert kid2 and kid2 != kid
            row_of(page, kid).locator(".gnb-use").click()
            deadline = time.monotonic() + 10
            while second.state(0)["cells"] < 2 and time.monotonic() < deadline:
                page.wait_for_timeout(100)
            cells = page.evaluate(
                f"() => ({FIND_PANEL})('second.ipynb').context.model.toJSON().cells.map((c) => c.source)"
            )
            code = "".join(cells[1]) if isinstance(cells[1], list) else cells[1]
            assert "%gpu_cluster start" in code and f"--address {gcs}" in code, (cells, gcs)
            second.run(1, 240)
            both, _ = wait_rows(
                page, lambda r: {kid, kid2} <= {x["kernel"] for x in r}, 10, "both kernels' clusters listed"
            )
            shot(page, shots / "lab-two-kernels.png", ".gnb-sidebar")
            names = {x["kernel"]: x["fields"]["notebook"] for x in both}
            assert names[kid] == "train.ipynb" and names[kid2] == "second.ipynb", names

            # a restart of the first kernel removes its local cluster
            page.evaluate(
                f"async () => {{ const p = ({FIND_PANEL})('train.ipynb');"
                " await p.sessionContext.session.kernel.restart(); }"
            )
            _, took = wait_rows(
                page, lambda r: not any(x["kernel"] == kid for x in r), 30, "gone after restart"
            )
            print(f"gone {took:.2f} s after the kernel restart")
        finally:
            shot(page, shots / "lab-end.png")
            browser.close()
            _browser.shutdown_kernels(server)


def test_panel_in_notebook7(sync_api: Any, tmp_path: pathlib.Path) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print("screenshots:", shots)
    with _server(tmp_path, "notebook") as server, sync_api.sync_playwright() as p:
        browser = _browser.launch(p)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            _browser.open_notebook(page, sync_api, _browser.notebook_url(server, "notebook", "train.ipynb"))
            train = Notebook(page, "train.ipynb")
            kid = train.kernel_id()
            assert "cluster 'local' ready" in train.run(0)
            assert "True" in train.run(1), "the simulated GPUs did not reach the cluster's monitor"

            # the status item, in the top area, shows the GPU count; a click opens the sidebar
            status = wait_status(page, ".gnb-status", "2 GPUs")
            status.click()
            listed, took = wait_rows(
                page, lambda r: any(x["kernel"] == kid and x["visible"] for x in r), LISTED_S, "listed"
            )
            print(f"the sidebar showed the row {took:.2f} s after the click")
            row = next(x for x in listed if x["kernel"] == kid)
            assert row["fields"]["notebook"] == "train.ipynb", row

            # the dashboard (Notebook 7: the bottom panel) during a blocking cell, then stop from the sidebar
            row_of(page, kid).locator(".gnb-dashboard-btn").click()
            page.wait_for_selector(f'.gnb-dashboard[data-id="{row["id"]}"]')
            train.start(2)
            seen = watch_dashboard(page, row["id"], 15)
            check_dashboard_updates(seen, "Notebook 7")
            shot(page, shots / "notebook7-panel.png")
            assert train.state(2)["run"] == "running"
            stop_from_sidebar(page, kid)
            out = train.wait(2, 60)
            assert "Cluster stopped: from the JupyterLab panel" in out, out
            wait_rows(page, lambda r: not any(x["kernel"] == kid for x in r), LISTED_S, "gone")
        finally:
            shot(page, shots / "notebook7-end.png")
            browser.close()
            _browser.shutdown_kernels(server)
