"""``%load_ext gpu_notebook`` provides every magic, in a fresh shell; a missing optional package leaves the magic
there, saying which extra to install (never ``Line magic function ... not found``)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

LINE_MAGICS = ["gpu_cluster", "gpu_push", "gpu_pull", "gpu_monitor", "gpu_cost", "gpu_checkpoint"]
CELL_MAGICS = ["distributed"]
HEAVY = ["ray", "torch", "boto3", "pynvml", "plotly", "ipywidgets"]

# A fresh process: modules named in argv[1] are made unimportable first (what `import x` meets where x is not
# installed), then a new InteractiveShell runs `%load_ext gpu_notebook` and the cells in argv[2].
SCRIPT = textwrap.dedent(
    """
    import json, sys
    for name in json.loads(sys.argv[1]):
        sys.modules[name] = None
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "gpu_notebook")
    out = {
        "line": sorted(shell.magics_manager.magics["line"]),
        "cell": sorted(shell.magics_manager.magics["cell"]),
        "imported": sorted(m for m in sys.modules if sys.modules[m] is not None),
        "cells": [],
    }
    for cell in json.loads(sys.argv[2]):
        with capture_output() as cap:
            res = shell.run_cell(cell)
        out["cells"].append(
            {"ok": res.error_in_exec is None, "stdout": cap.stdout, "stderr": cap.stderr}
        )
    shell.run_line_magic("unload_ext", "gpu_notebook")
    out["after_unload"] = sorted(shell.magics_manager.magics["line"]) + sorted(shell.magics_manager.magics["cell"])
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def _fresh(missing: list[str], cells: list[str]) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(missing), json.dumps(cells)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def _magics_present(out: dict) -> None:
    assert set(LINE_MAGICS) <= set(out["line"]), sorted(set(LINE_MAGICS) - set(out["line"]))
    assert set(CELL_MAGICS) <= set(out["cell"])
    assert not set(LINE_MAGICS + CELL_MAGICS) & set(out["after_unload"])  # %unload_ext removes them all


def test_the_conftest_shell_has_every_magic(ip) -> None:
    for name in LINE_MAGICS:
        assert ip.find_line_magic(name) is not None, name
    for name in CELL_MAGICS:
        assert ip.find_cell_magic(name) is not None, name


@pytest.mark.timeout(300)
def test_load_ext_in_a_fresh_shell_provides_every_magic_and_imports_nothing_heavy() -> None:
    out = _fresh([], ["%gpu_cluster frobnicate"])
    _magics_present(out)
    assert not set(HEAVY) & set(out["imported"]), sorted(set(HEAVY) & set(out["imported"]))
    (bad,) = out["cells"]
    assert not bad["ok"] and "invalid choice: 'frobnicate'" in bad["stderr"]  # the cell fails


@pytest.mark.timeout(300)
def test_a_missing_optional_package_leaves_the_magic_saying_which_extra_to_install() -> None:
    out = _fresh(
        ["plotly", "ipywidgets", "ray"],
        [
            "%gpu_monitor --local --interval 0.5",
            "%gpu_monitor stop --local",
            "%gpu_cluster start --workers 1",
        ],
    )
    _magics_present(out)
    show, stop, start = out["cells"]
    assert not show["ok"] and "pip install 'gpu_notebook[widgets]'" in show["stdout"] + show["stderr"], show
    assert "Traceback" not in show["stderr"] + show["stdout"]
    assert stop["ok"] and "GPU monitor stopped." in stop["stdout"]
    assert not start["ok"] and "pip install 'gpu_notebook[ray]'" in start["stdout"] + start["stderr"], start
    assert "Traceback" not in start["stderr"] + start["stdout"]


@pytest.mark.timeout(300)
def test_a_magics_module_that_cannot_import_is_replaced_by_magics_that_say_so() -> None:
    # register() used to print a note and leave %gpu_monitor and %gpu_checkpoint out altogether
    out = _fresh(
        ["gpu_notebook.magics._monitor", "gpu_notebook.magics._checkpoint"],
        ["%gpu_monitor --local", "%gpu_checkpoint list", "%gpu_cluster list"],
    )
    _magics_present(out)
    monitor, checkpoint, cluster = out["cells"]
    shown = monitor["stdout"] + monitor["stderr"]
    assert not monitor["ok"] and "%gpu_monitor could not be loaded" in shown
    assert "pip install 'gpu_notebook[monitor]'" in shown and "Traceback" not in shown
    assert not checkpoint["ok"]
    assert "pip install 'gpu_notebook[checkpoint]'" in checkpoint["stdout"] + checkpoint["stderr"]
    assert cluster["ok"] and "no clusters in this kernel" in cluster["stdout"]  # the others work as always
