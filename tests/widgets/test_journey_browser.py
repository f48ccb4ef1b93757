"""The whole journey in a real browser: the quickstart and the workshop notebook, run from the Run menu of
JupyterLab 4 and of Notebook 7 in headless Debian Chromium (Playwright), checked as a person reads them.

For each front end: one Jupyter server and one browser page; the two notebooks are copied to the server's root
and run one after the other (Notebook 7 runs the quickstart only) (each starts its own local Ray in its kernel, so the first kernel is shut down
before the second notebook opens), at the examples' small size (``GPU_NOTEBOOK_EXAMPLE_SIZE=small``). While a
notebook runs, the test watches the page: the live monitor's plotly chart must get data points (read from the
chart's ``element.data``) and the cost view its dollar figure; at the end every cell has run, none has an error
output, the status table lists the workers and every rank's output is there with its prefix.

Screenshots go to the test's output folder (printed; ``<tmp_path>/screenshots``). With
``GNB_README_SCREENSHOT=1`` the JupyterLab run also writes README's screenshot of the live monitor to
``docs/img/monitor.png``: the quickstart's own ``%gpu_monitor`` cell, on this CPU machine with two GPUs per
node simulated by :class:`gpu_notebook.testing.nvml.FakeNVML` (a cell the test adds before ``%gpu_monitor``
makes the shared monitor sample them), after some 25 s of samples.

Run it under the Ray lock: the notebooks start Ray.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import time
from typing import Any

import _browser
import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = _browser.ROOT
SMALL = {"GPU_NOTEBOOK_EXAMPLE_SIZE": "small"}
README_SHOT = ROOT / "docs" / "img" / "monitor.png"

# simulated GPUs for README's screenshot (this machine has none): a busy pair of A100s per node, one of them
# waiting for data now and then, so the chart shows what the monitor is for
FAKE_GPUS_CELL = """\
# README screenshot only: this CPU machine has no GPU, so two simulated A100s per node (gpu_notebook.testing)
import math
from gpu_notebook.monitor import monitor_for
from gpu_notebook.testing.nvml import FakeGPU, FakeNVML


def simulated_gpus():
    return FakeNVML([
        FakeGPU(util=lambda t: 90 + 6 * math.sin(t / 2), mem_used_mib=lambda t: 61_000 + 800 * math.sin(t / 5)),
        FakeGPU(util=lambda t: 55 + 35 * math.sin(t / 3), mem_used_mib=lambda t: 43_000 + 500 * math.sin(t / 4)),
    ])


monitor_for(nvml=simulated_gpus, interval=0.5);"""


# The test's own cell after %gpu_monitor: at the small size a run can reach `%gpu_cluster stop` (which ends the
# live chart) before the chart drew two points, on a fast machine as on a loaded one. It waits for the monitor's
# samples in the kernel, then for the page to draw them.
WAIT_FOR_SAMPLES_CELL = """\
# test only: let the live chart draw a few samples before the notebook moves on
import time
from gpu_notebook.monitor import running_monitor
_mon, _t0 = running_monitor(), time.monotonic()
while _mon is not None and _mon.aggregator.rows_in < 3 and time.monotonic() - _t0 < 60:
    time.sleep(0.5)
time.sleep(3)"""


@pytest.fixture(scope="module")
def sync_api() -> Any:
    """Playwright's sync API, with Debian's Chromium present (skips, or fails under CI=true, without)."""
    return _browser.playwright_sync_api()


def _readme_mode(app: str) -> bool:
    return app == "lab" and os.environ.get("GNB_README_SCREENSHOT", "").strip() not in ("", "0")


def _copy_examples(root: pathlib.Path, readme: bool) -> None:
    for name in ("quickstart.ipynb", "workshop.ipynb"):
        nb = nbformat.read(ROOT / "examples" / name, as_version=4)
        at = next((i for i, c in enumerate(nb.cells) if c.source.lstrip().startswith("%gpu_monitor")), None)
        if at is not None and not readme:
            nb.cells.insert(at + 1, nbformat.v4.new_code_cell(WAIT_FOR_SAMPLES_CELL))
        elif (
            at is not None and name == "quickstart.ipynb"
        ):  # README's run: simulated GPUs, time for the chart
            nb.cells.insert(at, nbformat.v4.new_code_cell(FAKE_GPUS_CELL))
            nb.cells.insert(at + 3, nbformat.v4.new_code_cell("import time; time.sleep(30)"))
        nbformat.write(nb, root / name)


class Watch:
    """What the page showed while a notebook ran: the most monitor points, the cost figure, screenshots."""

    def __init__(self, shots: pathlib.Path, name: str, monitor_shot_points: int, readme: bool) -> None:
        self.shots, self.name = shots, name
        self.monitor_points = 0
        self.monitor_traces: list[str] = []
        self.monitor_header = ""
        self.cost = ""
        self.cost_chart_title = ""
        self.shot_at = monitor_shot_points
        self.readme = readme
        self.monitor_shot: pathlib.Path | None = None
        self.problems: list[str] = []

    def _shoot_monitor(self, page: Any, timeout_ms: int = 10_000) -> None:
        cell = page.locator(".jp-CodeCell", has=page.locator(".gpu-notebook-monitor")).first
        shot = self.shots / f"{self.name}-monitor.png"
        try:  # short: the cell can be re-rendered (its live view ending, the notebook scrolling) meanwhile
            cell.screenshot(path=str(shot), timeout=timeout_ms)
        except Exception as exc:  # noqa: BLE001 - playwright's TimeoutError: the next look tries again
            print(f"{self.name}: the monitor cell's screenshot failed ({type(exc).__name__}); trying again")
            return
        self.monitor_shot = shot
        if self.readme:
            README_SHOT.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(shot, README_SHOT)

    def look(self, page: Any) -> None:
        charts = _browser.plotly_charts(page, ".gpu-notebook-monitor .js-plotly-plot")
        points = max((len(t["y"]) for c in charts for t in c["traces"]), default=0)
        if points > self.monitor_points:
            self.monitor_points = points
            self.monitor_traces = sorted({t["name"] for c in charts for t in c["traces"]})
            self.monitor_header = " ".join(page.locator(".gpu-notebook-monitor-header").all_inner_texts())
        if points >= self.shot_at and self.monitor_shot is None:
            self._shoot_monitor(page)
        cost = page.locator(".gpu-notebook-cost").all_inner_texts()
        if cost and "$" in cost[0]:
            self.cost = cost[0]
            titles = " ".join(
                c["title"] for c in _browser.plotly_charts(page, ".gpu-notebook-cost .js-plotly-plot")
            )
            if titles:  # the live view leaves its static card (no chart) when its cluster stops
                self.cost_chart_title = titles


def _run(page: Any, sync_api: Any, server: str, app: str, name: str, watch: Watch, budget_s: float) -> dict:
    """Open ``name``, Run All Cells, watch the page until every cell ran; returns the notebook's JSON."""
    url = _browser.notebook_url(server, app, name)
    if app == "lab":
        url += "&reset"  # a fresh workspace: the notebook before this one is not reopened (with a kernel)
    _browser.open_notebook(page, sync_api, url)
    t0 = time.monotonic()
    _browser.run_all_cells(page)
    while True:
        page.wait_for_timeout(500)
        watch.look(page)
        nb = _browser.notebook_json(page)
        errors = _browser.errors_in(nb)
        done = _browser.cells_ran(nb) and _browser.kernel_idle(page)
        if errors or done or time.monotonic() - t0 > budget_s:
            break
    if watch.monitor_shot is None and watch.monitor_points >= 2:
        # the tries while it ran timed out (a loaded machine): once more, with time, on the cell as it ended
        watch._shoot_monitor(page, timeout_ms=45_000)
    stem = name.removesuffix(".ipynb")
    page.screenshot(path=str(watch.shots / f"{stem}-end.png"))
    # the cells a person looks at, each whole (the page scrolls inside the notebook)
    for view in ("status", "cost"):
        cell = page.locator(".jp-CodeCell", has=page.locator(f".gpu-notebook-{view}"))
        if cell.count():
            cell.first.screenshot(path=str(watch.shots / f"{stem}-{view}.png"))
    print(f"{app} {name}: {time.monotonic() - t0:.1f} s, monitor {watch.monitor_points} points")
    assert not errors, f"{name} in {app}: error outputs {errors}"
    assert done, f"{name} in {app}: not every cell ran within {budget_s} s"
    # a "$" pair in markdown is typeset as math: "$/hour ... $0" reads as one italic word without spaces
    # (collected, not asserted here: the test goes on to the next notebook and reports every problem at the end)
    math = page.locator(".jp-MarkdownCell", has=page.locator("mjx-container, .MathJax")).all_inner_texts()
    watch.problems += [
        f"{name}: markdown typeset as math (escape its $ as \\$): {m[:120]!r}..." for m in math
    ]
    return nb


def _text(nb: dict[str, Any]) -> str:
    """Every stream output and text/plain result of a notebook JSON."""
    parts = []
    for c in nb.get("cells", []):
        for o in c.get("outputs", []):
            t = o.get("text") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
            parts.append("".join(t) if isinstance(t, list) else str(t or ""))
    return "\n".join(parts)


def _status_workers(page: Any) -> list[str]:
    """The rows of the first status table's worker list, as the page shows them."""
    return list(
        page.evaluate(
            "() => { const t = document.querySelectorAll('.gpu-notebook-status')[0];"
            " if (!t) return []; const tables = t.querySelectorAll('table');"
            " return Array.from(tables[tables.length - 1].querySelectorAll('tbody tr')).map((r) => r.innerText); }"
        )
    )


def _check_monitor(watch: Watch, name: str, gpus: bool) -> None:
    assert watch.monitor_points >= 2, (
        f"{name}: the monitor chart never showed data points ({watch.monitor_points})"
    )
    assert "down" not in watch.monitor_header and "did not start" not in watch.monitor_header, (
        watch.monitor_header
    )
    if gpus:
        assert any("/gpu1" in t for t in watch.monitor_traces), watch.monitor_traces
    assert watch.monitor_shot is not None and watch.monitor_shot.stat().st_size > 0


@pytest.mark.timeout(900)
@pytest.mark.parametrize("app", ["lab", "notebook"])
def test_quickstart_and_workshop_in_the_browser(app: str, sync_api: Any, tmp_path: pathlib.Path) -> None:
    readme = _readme_mode(app)
    root = tmp_path / "root"
    root.mkdir()
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"screenshots: {shots}")
    _copy_examples(root, readme)
    with _browser.jupyter_server(tmp_path, root, app, env=SMALL) as server, sync_api.sync_playwright() as p:
        browser = _browser.launch(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(60_000)

            # the quickstart: a cluster, its status, the live monitor and cost, DDP training, the weights back
            quick = Watch(shots, "quickstart", 40 if readme else 3, readme)
            nb = _run(page, sync_api, server, app, "quickstart.ipynb", quick, 240)
            workers = _status_workers(page)
            assert len(workers) == 2 and all("alive" in w for w in workers), workers
            text = _text(nb)
            for rank in (0, 1):
                assert re.search(rf"\[rank {rank}\] rank {rank} of 2", text), text[:3000]
            assert "[rank 0] step   0" in text and "SUMMARY: 2 workers trained a DDP model" in text
            _check_monitor(quick, "quickstart", gpus=readme)
            assert quick.cost, "the cost view never showed its figure"
            assert "$" in quick.cost_chart_title, quick.cost_chart_title
            _browser.shutdown_kernels(server)

            # the workshop: ranks, all-reduce, DDP, the monitor, checkpoints; Run All leaves the exercises "not yet".
            # In JupyterLab only: its cells are the quickstart's kinds of output (ranks' text, the monitor, tables),
            # which Notebook 7 has just rendered, and a notebook run costs a Ray start (the suite's time budget)
            shop = Watch(shots, "workshop", 3, False)
            if app == "lab":
                nb = _run(page, sync_api, server, app, "workshop.ipynb", shop, 300)
                text = _text(nb)
                for rank in (0, 1):
                    assert re.search(rf"\[rank {rank}\] I am rank {rank} of WORLD_SIZE=2", text), text[:3000]
                assert "Not yet:" in text and "SUMMARY: workshop: 0/5 exercises right" in text
                _check_monitor(shop, "workshop", gpus=False)
                assert page.locator("table", has_text="restore reads").count() >= 1  # %gpu_checkpoint list
                _browser.shutdown_kernels(server)
        finally:
            browser.close()
    problems = quick.problems + shop.problems
    assert not problems, "\n".join(problems)
