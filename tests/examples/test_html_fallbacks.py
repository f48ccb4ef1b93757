"""Every view of ours reads as HTML or text where widgets cannot render: an nbconvert HTML export.

GitHub, nbviewer, VS Code without a kernel and a plain ``jupyter nbconvert --to html`` show a saved notebook
without a widget manager: an output carrying a widget view is shown by the next type in its bundle (nbconvert
skips the widget view when the notebook holds no state for it), or as an empty box. So each live view
(monitor, cost) must carry an HTML snapshot, and every static result (cluster status, checkpoint list, price
catalog, rank environment, monitor snapshot, doctor report, all-reduce benchmark) its HTML and a text/plain
that says the same.

The test executes the quickstart headless (scripts/run_notebook.py, a real kernel and a local Ray) with the
views the quickstart does not show added before its ``%gpu_cluster stop`` (one kernel, one Ray start), exports
it with nbconvert's HTML exporter without the widget state, and reads the export as a person would: each
output of ours shows its numbers, none is empty, none says "Loading widget..." or leaks an object repr.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

# the views of ours the quickstart may not show, each with what its export must say (checked below)
EXTRA_CELLS = [
    "%gpu_monitor",
    "%gpu_cost",
    "%gpu_monitor snapshot",
    "%gpu_cost catalog --gpu H100",
    "%gpu_cluster env",
    "%gpu_cluster doctor",
    "%gpu_cluster bench allreduce --max-bytes 64K --iters 2",
    (
        "import tempfile, torch\n"
        "from gpu_notebook import checkpoint\n"
        "CKPT = tempfile.mkdtemp(prefix='gnb-html-')\n"
        "ck = checkpoint.Checkpointer(CKPT, current=False)\n"
        "ck.save({'w': torch.zeros(3), 'step': 1}, 1)\n"
        "ck.wait()\n"
        "ck"
    ),
    "%gpu_checkpoint use $CKPT\n%gpu_checkpoint list",
]

# (what a cell's source starts with, a pattern its exported output must show): one per view of ours
EXPECTED = [
    ("%gpu_cluster status", r"rank.*state"),
    ("%gpu_monitor snapshot", r"GPU monitor snapshot"),
    ("%gpu_monitor", r"nodes|GPU monitor snapshot"),
    ("%gpu_cost catalog", r"USD per hour"),
    ("%gpu_cost", r"\$\s*0|\$[0-9]"),
    ("%gpu_cluster env", r"RANK"),
    ("%gpu_cluster doctor", r"level.*check"),
    ("%gpu_cluster bench", r"busbw"),
    ("import tempfile, torch", r"Checkpointer"),
    ("%gpu_checkpoint use", r"c0000000000"),
]

# what a front end without widgets must never show in their place
LEAKS = re.compile(
    r"Loading widget|Error displaying widget|VBox\(|FigureWidget\(|HTML\(value=|<IPython\.core\.display|"
    r"object at 0x[0-9a-f]+"
)


def _with_every_view(src: Path, dst: Path) -> None:
    """The quickstart with :data:`EXTRA_CELLS` before its ``%gpu_cluster stop`` (at the end if it has none)."""
    import nbformat

    nb = nbformat.read(src, as_version=4)
    stop = next(
        (
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and c.source.lstrip().startswith("%gpu_cluster stop")
        ),
        len(nb.cells),
    )
    nb.cells[stop:stop] = [nbformat.v4.new_code_cell(s) for s in EXTRA_CELLS]
    nbformat.write(nb, dst)


def _export(nb: Any) -> Any:
    """The notebook as nbconvert's HTML exporter writes it without widget state, parsed."""
    import copy

    from bs4 import BeautifulSoup
    from nbconvert import HTMLExporter

    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)  # what GitHub and VS Code without a kernel have: no widget manager
    body, _ = HTMLExporter().from_notebook_node(nb)
    return BeautifulSoup(body, "html.parser")


def _source(cell: Any) -> str:
    return "".join(cell.source) if isinstance(cell.source, list) else str(cell.source)


def _check_export(nb: Any, soup: Any, expected: list[tuple[str, str]]) -> set[str]:
    """Check every display output of ``nb`` in its export ``soup``; returns the ``expected`` starts found."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    shown = soup.select(".jp-Cell.jp-CodeCell")
    assert len(shown) == len(code), (len(shown), len(code))
    found: set[str] = set()
    for cell, div in zip(code, shown, strict=True):
        src = _source(cell).lstrip()
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", f"{src[:60]!r} failed: {out.get('evalue')}"
            if out.get("output_type") not in ("display_data", "execute_result"):
                continue
            plain = out.get("data", {}).get("text/plain", "")
            plain = "".join(plain) if isinstance(plain, list) else plain
            assert plain.strip() and not LEAKS.search(plain), f"{src[:60]!r}: text/plain {plain[:200]!r}"
        if not any(
            o.get("output_type") in ("display_data", "execute_result") for o in cell.get("outputs", [])
        ):
            continue
        outputs = div.select(".jp-OutputArea-output")
        assert outputs, f"{src[:60]!r}: no output in the export"
        for o in outputs:
            text = o.get_text(" ", strip=True)
            assert text, f"{src[:60]!r}: an empty output in the export: {str(o)[:300]}"
            assert not LEAKS.search(text), f"{src[:60]!r}: {text[:300]!r}"
            assert not o.select("script[type='application/vnd.jupyter.widget-view+json']"), src[:60]
        text = div.select_one(".jp-Cell-outputWrapper").get_text(" ", strip=True)
        for start, pattern in expected:
            if src.startswith(start):
                assert re.search(pattern, text, re.S), (
                    f"{src[:60]!r}: export lacks {pattern!r}: {text[:500]!r}"
                )
                found.add(start)
                break
    return found


def _quickstart_checks(stdout: str, nb: Any, code_cells: int) -> None:
    """What the quickstart itself must show: every cell ran, both ranks, training, the saved monitor and cost."""
    assert f"{code_cells}/{code_cells} code cells executed" in stdout, stdout[-2000:]
    assert "SUMMARY: 2 workers trained a DDP model" in stdout
    text = "\n".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )
    assert "[rank 0] rank 0 of 2" in text and "[rank 1] rank 1 of 2" in text
    assert "[rank 0] step   0" in text
    assert not any(o.get("output_type") == "error" for c in nb.cells for o in c.get("outputs", []))
    # monitoring and cost: the saved views (what a notebook without widgets shows) have a reading and a price
    shown = {
        c.source.strip(): "".join(
            str(o.get("data", {}).get("text/html", "")) for o in c.get("outputs", []) if "data" in o
        )
        for c in nb.cells
        if c.cell_type == "code" and c.source.strip() in ("%gpu_monitor", "%gpu_cost")
    }
    assert "GPU monitor" in shown["%gpu_monitor"] and "CPU %" in shown["%gpu_monitor"], shown["%gpu_monitor"]
    assert "did not start" not in shown["%gpu_monitor"]
    assert "$0" in shown["%gpu_cost"] or "0.00" in shown["%gpu_cost"], shown["%gpu_cost"]


@pytest.mark.timeout(600)
def test_the_quickstart_runs_and_trains_and_every_view_reads_as_html(tmp_path: Path) -> None:
    """The quickstart end to end in a real kernel (nbclient) on the default local cluster, as a new user runs it
    (scripts/quickstart.sh runs it unchanged), with the views it does not show added before its stop: one
    kernel and one Ray start for both checks."""
    import nbformat

    work = tmp_path / "quickstart.ipynb"
    _with_every_view(ROOT / "examples" / "quickstart.ipynb", work)
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(work, as_version=4).cells)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(work), "--timeout", "300"],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    nb = nbformat.read(tmp_path / "quickstart.executed.ipynb", as_version=4)
    _quickstart_checks(proc.stdout, nb, code_cells)
    soup = _export(nb)
    (tmp_path / "quickstart.html").write_text(str(soup))
    print(f"HTML export: {tmp_path / 'quickstart.html'}")

    found = _check_export(nb, soup, EXPECTED)
    assert found == {s for s, _ in EXPECTED}, f"views never shown: {sorted({s for s, _ in EXPECTED} - found)}"


def test_the_committed_cloud_example_reads_as_html() -> None:
    """examples/cloud_cluster.ipynb is committed with its outputs (dry runs): what GitHub shows of it."""
    import nbformat

    nb = nbformat.read(ROOT / "examples" / "cloud_cluster.ipynb", as_version=4)
    found = _check_export(nb, _export(nb), [("%gpu_cluster start --cloud", r"(?i)plan|dry run")])
    assert found == {"%gpu_cluster start --cloud"}
