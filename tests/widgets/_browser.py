"""Helpers of the real-browser tests: Debian's Chromium through Playwright, driving JupyterLab 4 or Notebook 7.

The tests start the Jupyter server themselves (127.0.0.1, a random token, a free port, a temporary root
directory and settings), open a notebook, accept the "Select Kernel" dialog if one comes, run all cells from
the Run menu as a person would, and read what the page shows (plotly's ``element.data`` for charts).

Browser downloads do not work here, so Playwright drives ``/usr/bin/chromium`` (``executable_path``). On a
developer's machine without it the tests skip; under ``CI=true`` they fail, so CI cannot pass by skipping.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

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
ROOT = pathlib.Path(__file__).resolve().parents[2]

#: the page path of a notebook, per front end
NOTEBOOK_URL = {"lab": "lab/tree/{name}", "notebook": "notebooks/{name}"}

# plotly keeps what it drew on the chart's DOM element: every trace's name and points
READ_PLOTLY = """(sel) => Array.from(document.querySelectorAll(sel || '.js-plotly-plot')).map((el) => ({
    traces: (el.data || []).map((t) => ({name: t.name || '', type: t.type || 'scatter',
        x: Array.from(t.x || []).map(String), y: Array.from(t.y || []).map(Number)})),
    title: Array.from(el.querySelectorAll('.gtitle, .annotation-text')).map((e) => e.textContent).join(' | '),
}))"""


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str) -> NoReturn:
    """Skip on a developer's machine without a browser; fail in CI, where the browser tests must run."""
    if in_ci():
        pytest.fail(f"{what} (CI=true: the browser test must run; scripts/test.sh installs chromium)")
    pytest.skip(what)


def playwright_sync_api() -> Any:
    """Playwright's sync API, with Debian's Chromium present (else :func:`missing`)."""
    if not os.path.exists(CHROMIUM):
        missing(f"Debian chromium is not installed at {CHROMIUM}")
    try:
        from playwright import sync_api
    except ImportError as exc:
        missing(f"playwright is not installed ({exc})")
    return sync_api


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_notebook(path: pathlib.Path, cells: Sequence[str]) -> None:
    """A notebook of code cells (the ``python3`` kernel: this interpreter's)."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nbformat.write(nb, path)


@contextlib.contextmanager
def jupyter_server(
    tmp_path: pathlib.Path,
    root: pathlib.Path,
    app: str = "lab",
    env: dict[str, str] | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[str]:
    """Run ``jupyter lab`` or ``jupyter notebook`` (``app``) on ``root``; yields its base URL with the token
    as ``?token=`` query (``f"{base}/lab?token=..."`` is built by :func:`notebook_url`).

    ``env`` adds variables for the server and so for its kernels; ``extra_args`` go to its command line. The
    application object is exposed in the page (``window.jupyterapp``, read by :func:`notebook_json`). The log is
    ``tmp_path/jupyter-<app>.log``.
    """
    port, token = free_port(), secrets.token_hex(16)
    full = dict(os.environ)
    full.update(
        {
            "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / f"settings-{app}"),
            "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / f"workspaces-{app}"),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / f"runtime-{app}"),
            "PYTHONPATH": os.pathsep.join([str(ROOT), full.get("PYTHONPATH", "")]),
        }
    )
    full.update(env or {})
    # every cell stays in the page (JupyterLab 4 may detach cells scrolled out of view): the tests read them all
    tracker = (
        tmp_path / f"settings-{app}" / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    )
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text('{"windowingMode": "none"}')
    # and no "Would you like to get notified about Jupyter news?" toast over the screenshots
    notes = tracker.parents[1] / "apputils-extension" / "notification.jupyterlab-settings"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text('{"fetchNews": "false", "checkForUpdates": false}')
    args = [
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.port_retries=0",
        *(["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
    ]
    if app == "lab":
        args += [
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.expose_app_in_browser=True",
        ]
    else:
        args += ["--JupyterNotebookApp.expose_app_in_browser=True"]
    log_path = tmp_path / f"jupyter-{app}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter", app, *args, *extra_args],
            cwd=root,
            env=full,
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
                    pytest.fail(f"jupyter {app} did not start:\n" + log_path.read_text()[-3000:])
                time.sleep(0.5)
            yield f"{base}?token={token}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def notebook_url(server: str, app: str, name: str) -> str:
    """The page of notebook ``name`` (relative to the server's root) on ``server`` (from :func:`jupyter_server`)."""
    base, token = server.split("?token=")
    return f"{base}/{NOTEBOOK_URL[app].format(name=name)}?token={token}"


def launch(playwright: Any) -> Any:
    """Headless Debian Chromium."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


def open_notebook(page: Any, sync_api: Any, url: str) -> None:
    """Open a notebook page, accept the kernel dialog if one comes, and wait until its kernel is idle."""
    page.goto(url)
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    # JupyterLab 4 and Notebook 7 may ask which kernel to use; accept the default (the notebook's python3)
    try:
        page.wait_for_selector(".jp-Dialog .jp-mod-accept", timeout=10_000)
        page.click(".jp-Dialog .jp-mod-accept")
    except sync_api.TimeoutError:
        pass
    wait_kernel_idle(page, 120)


def kernel_idle(page: Any) -> bool:
    """Whether the notebook's kernel reports idle (JupyterLab's execution indicator; Notebook 7's kernel status)."""
    return bool(
        page.evaluate(
            """() => {
            const ind = document.querySelector('.jp-Notebook-ExecutionIndicator');
            if (ind) return ind.getAttribute('data-status') === 'idle';
            const k = document.querySelector('.jp-NotebookKernelStatus, #jp-NotebookKernelStatus, .jp-KernelStatus');
            return k ? /idle/i.test(k.getAttribute('title') || k.className || k.textContent || '') : false;
        }"""
        )
    )


def wait_kernel_idle(page: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not kernel_idle(page):
        if time.monotonic() > deadline:
            raise AssertionError(f"the kernel did not become idle within {timeout_s} s")
        page.wait_for_timeout(250)


def run_all_cells(page: Any) -> None:
    """Run ▸ Run All Cells, from the menu bar (the same menu in JupyterLab 4 and Notebook 7)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()


def plotly_charts(page: Any, selector: str = ".js-plotly-plot") -> list[dict[str, Any]]:
    """What plotly drew in every chart matching ``selector``: traces (name, x, y) and the subplot titles."""
    return list(page.evaluate(READ_PLOTLY, selector))


def notebook_json(page: Any) -> dict[str, Any]:
    """The open notebook as the front end holds it (nbformat JSON: every cell with its outputs).

    Read from the application object that :func:`jupyter_server` exposes (``expose_app_in_browser``), so a test
    can tell an error output from a line on stderr, which the page renders alike.
    """
    return dict(page.evaluate("() => window.jupyterapp.shell.currentWidget.context.model.toJSON()"))


def errors_in(nb: dict[str, Any]) -> list[str]:
    """Every error output of a notebook JSON, as ``"ename: evalue"``."""
    return [
        f"{o.get('ename')}: {o.get('evalue')}"
        for c in nb.get("cells", [])
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]


def output_text(page: Any) -> str:
    """All rendered output of the notebook, as the text a person reads."""
    return str(
        page.evaluate(
            "() => Array.from(document.querySelectorAll('.jp-OutputArea-output'))"
            ".map((e) => e.innerText).join('\\n')"
        )
    )


def shutdown_kernels(server: str) -> int:
    """Shut down every kernel session of ``server`` (from :func:`jupyter_server`); returns how many.

    The next notebook then starts its own kernel, and so its own local Ray, with the first one gone.
    """
    import json

    base, token = server.split("?token=")
    headers = {"Authorization": f"token {token}"}
    with urllib.request.urlopen(
        urllib.request.Request(f"{base}/api/sessions", headers=headers), timeout=30
    ) as r:
        sessions = json.load(r)
    for s in sessions:
        req = urllib.request.Request(f"{base}/api/sessions/{s['id']}", method="DELETE", headers=headers)
        with urllib.request.urlopen(req, timeout=60):
            pass
    return len(sessions)


def cells_ran(nb: dict[str, Any]) -> bool:
    """Every code cell of a notebook JSON has an execution count (none waits or runs)."""
    code = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
    return bool(code) and all(c.get("execution_count") for c in code)
