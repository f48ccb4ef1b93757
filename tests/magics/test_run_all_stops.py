"""The journey of "Run All": a failing magic stops the notebook there, in a real kernel run by nbclient.

nbclient (as papermill and ``jupyter nbconvert --execute``) stops at the first cell whose execute reply is an
error; a magic that only printed its failure let every later cell run. None of these failures needs Ray.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def _run_all(cells: list[str], tmp_path: Path) -> tuple[BaseException | None, object]:
    """Execute a notebook of ``cells`` in a fresh kernel of this Python; the error nbclient raised, and the
    executed notebook."""
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    client = nbclient.NotebookClient(
        nb,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.km = client.create_kernel_manager()
    # the kernel runs this interpreter (the one with gpu_notebook), whatever python3 kernel spec is installed
    client.km.kernel_spec.argv[0] = sys.executable
    try:
        client.execute()
    except CellExecutionError as exc:
        return exc, nb
    return None, nb


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    "failing,ename,says",
    [
        ("%gpu_cluster scale not-a-number", "UsageError", "scale takes one argument"),
        ("%gpu_cluster use no-such-cluster", "UnknownClusterError", "no-such-cluster"),
        ("%gpu_checkpoint restore", "MagicError", "no current checkpoint store"),
    ],
)
def test_a_failing_magic_stops_run_all(tmp_path: Path, failing: str, ename: str, says: str) -> None:
    marker = tmp_path / "after-the-failing-cell"
    err, nb = _run_all(
        ["%load_ext gpu_notebook", failing, f"open({str(marker)!r}, 'w').write('ran')"], tmp_path
    )
    assert err is not None, "the notebook ran to its end"
    assert err.ename == ename  # type: ignore[attr-defined]  # (CellExecutionError's)
    assert not marker.exists()  # the cell after the failing one never ran
    failed_cell = nb.cells[1]  # type: ignore[attr-defined]
    shown = "".join(
        o.get("text", "") + "\n".join(o.get("traceback", [])) for o in failed_cell.get("outputs", [])
    )
    assert says in shown
    # one short message: no frames of gpu_notebook's internals (nor anyone's)
    assert "gpu_notebook/" not in shown and "Traceback" not in shown and "File " not in shown
