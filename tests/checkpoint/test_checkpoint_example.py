"""Run examples/checkpoint_resume.ipynb top to bottom in a real kernel (nbclient): a real 2-worker cluster,
a worker killed mid-training, the workers replaced, and the same training cell resuming bit-exactly."""

from __future__ import annotations

import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "checkpoint_resume.ipynb"


def _text(cell: dict) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            parts.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            parts.append(f"{o.get('ename')}: {o.get('evalue')}")
        elif "data" in o:
            parts.append(o["data"].get("text/plain", ""))
    return "".join(parts)


#: what a user would read as a bug in the expected failure: Ray's guesses at why a worker died (its notice of a
#: rank's death the cell reports itself) and gloo's socket error on the rank that lost its peer
NOISE = ("OOM killer", "A worker died or was killed", "(raylet)", "Connection reset by peer", "pair.cc")


def _everything(cell: dict) -> str:
    """All a person sees of a cell's outputs, an error's whole report included."""
    parts = [_text(cell)]
    parts += [
        "\n".join(o.get("traceback", [])) for o in cell.get("outputs", []) if o.get("output_type") == "error"
    ]
    return "\n".join(parts)


@pytest.mark.timeout(420)
def test_checkpoint_resume_example_runs(tmp_path: pathlib.Path) -> None:
    nb = nbformat.read(EXAMPLE, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    try:
        client.execute()
    finally:
        for c in nb.cells:  # shown by pytest when an assertion below fails
            if c.cell_type == "code":
                print(f">>> {c.source[:60]!r}\n{_text(c)[-1500:]}")
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [(c.source[:40], _text(c)) for c in code if any(o.output_type == "error" for o in c.outputs)]
    # exactly one cell fails: the training cell whose worker was killed (tagged raises-exception)
    assert len(errors) == 1, errors
    preempted = next(c for c in code if "raises-exception" in c.metadata.get("tags", []))
    assert "starting at step 0" in _text(preempted)
    assert "rank" in errors[0][1].lower()
    # the preemption's report names the rank that died, and nothing of the noise that follows a death
    report = _everything(preempted)
    assert "--- rank 1: died" in report and "its collective lost the connection to rank 1" in report, report
    noisy = [(c.source[:40], n) for c in code for n in NOISE if n in _everything(c)]
    assert noisy == [], noisy
    listing = _text(next(c for c in code if c.source.startswith("%gpu_checkpoint use")))
    steps = {int(s) for s in re.findall(r"^c\d{10}\s+(\d+)\s", listing, re.M)}  # (id, step, ... columns)
    assert {0, 10, 20, 30} <= steps, listing
    assert 40 not in steps  # nothing after the preemption
    rerun = next(c for c in code if "training-cell-rerun" in c.metadata.get("tags", []))
    assert rerun.source == preempted.source  # literally the same cell, re-run
    assert "[rank 0] starting at step 31" in _text(rerun) and "[rank 1] starting at step 31" in _text(rerun)
    # the preemption-notice drill: rank 1's node gets the notice, both ranks save at the same step and stop
    drill = _text(next(c for c in code if c.source.startswith("%%distributed -o drill")))
    assert "[rank 1] step" in drill and "notice (terminate)" in drill and "notice (peer)" in drill
    notice = _text(next(c for c in code if "NOTICE: both ranks" in c.source))
    m = re.search(
        r"NOTICE: both ranks stopped at step (\d+) and (\d+); the checkpoint of step (\d+) is a full base",
        notice,
    )
    assert m is not None, notice
    assert m.group(1) == m.group(2) == m.group(3) and int(m.group(1)) > 0
    summary = _text(code[-1])
    assert "SUMMARY: preempted after step 35, resumed at step 31" in summary
    assert "bit-identical to the uninterrupted run" in summary
