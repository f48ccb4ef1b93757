"""README's "A session in 60 seconds", run as a new user would: its cells, in a real kernel, on the defaults.

The tour is the first code a newcomer copies. Its Python blocks become the cells of a notebook, executed headless
by scripts/run_notebook.py (a real kernel through nbclient, ``%load_ext gpu_notebook``, the default local Ray),
and the output block README shows under a cell must appear in that cell's output. A magic, an option or an API
call that the tour names and the code no longer has fails here.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## A session in 60 seconds"


def tour() -> list[tuple[str, str | None]]:
    """The tour's (python cell, the output README shows under it or None), in order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    blocks = re.findall(r"```(\w*)\n(.*?)```", text[start : end if end > 0 else None], re.S)
    cells: list[tuple[str, str | None]] = []
    for lang, body in blocks:
        if lang == "python":
            cells.append((body.rstrip("\n"), None))
        elif cells and not lang:
            cells[-1] = (cells[-1][0], body.rstrip("\n"))
    return cells


def test_the_tour_is_found() -> None:
    cells = tour()
    assert cells[0][0].startswith("%load_ext gpu_notebook"), cells[0]
    assert any(shown for _, shown in cells), "the tour shows no output to check"


def _outputs(cell: object) -> str:
    parts = []
    for out in cell.get("outputs", []):  # type: ignore[attr-defined]
        assert out.get("output_type") != "error", f"{cell.source[:80]!r} failed: {out.get('evalue')}"  # type: ignore[attr-defined]
        if out.get("output_type") == "stream":
            parts.append(out["text"])
        for data in (out.get("data") or {}).values():
            parts.append(data if isinstance(data, str) else "")
    return "".join(parts)


def test_the_readme_tour_runs_in_a_real_kernel(tmp_path: Path) -> None:
    import nbformat

    cells = tour()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src, _ in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    work = tmp_path / "readme_tour.ipynb"
    nbformat.write(nb, work)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "run_notebook.py"), str(work), "--timeout", "240"],
        capture_output=True,
        text=True,
        timeout=560,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    done = nbformat.read(tmp_path / "readme_tour.executed.ipynb", as_version=4)
    for (src, shown), cell in zip(cells, done.cells, strict=True):
        got = _outputs(cell)
        for line in (shown or "").splitlines():
            assert line.strip() in got, (
                f"README shows {line!r} under {src[:60]!r}; the cell printed {got[-800:]!r}"
            )
    last = _outputs(done.cells[-1])
    assert "[0, 1]" in last, last  # the Python API's two ranks
