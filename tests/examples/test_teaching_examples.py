"""The teaching notebooks (examples/ddp_training.ipynb, examples/workshop.ipynb) run end to end at their small size
in a real kernel, and say what a person reading them should see: per-epoch lines, an evaluation better than
chance, exercise checks that say "Right!" for the reference solutions and "Not yet" for the shipped blanks."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _run(name: str, tmp_path: Path, *options: str) -> tuple[str, Any]:
    """Run examples/NAME with scripts/run_notebook.py --small (its own local Ray, as a user's kernel has)."""
    work = tmp_path / name
    work.write_bytes((EXAMPLES / name).read_bytes())
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "run_notebook.py"),
            str(work),
            "--small",
            "--timeout",
            "240",
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=420,
        env=env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, nbformat.read(work.with_suffix(".executed.ipynb"), as_version=4)


def _cell(nb: Any, cell_id: str) -> Any:
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _text(cell: Any) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


def _errors(nb: Any) -> list[Any]:
    return [
        o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"
    ]


@pytest.mark.timeout(480)
def test_ddp_training_trains_evaluates_and_pulls_the_model_back(tmp_path: Path) -> None:
    stdout, nb = _run("ddp_training.ipynb", tmp_path)
    assert not _errors(nb), _errors(nb)
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert f"{len(code_cells)}/{len(code_cells)} code cells executed" in stdout
    train = _text(_cell(nb, "train"))
    for epoch in (0, 1, 2, 3):  # the small size trains 3 epochs; rank 0 prints each one
        assert f"[rank 0] epoch {epoch}/3" in train, train
    assert "[rank 1] epoch" not in train
    evaluation = re.search(
        r"EVALUATION: held-out accuracy ([\d.]+)% -> ([\d.]+)% \(chance ([\d.]+)%\); loss ([\d.]+) -> ([\d.]+) "
        r"\(chance ([\d.]+)\)",
        _text(_cell(nb, "curves")),
    )
    assert evaluation, _text(_cell(nb, "curves"))
    acc0, acc, chance, loss0, loss, chance_loss = map(float, evaluation.groups())
    assert acc > 5 * chance and acc > acc0 and loss < loss0 and loss < chance_loss - 1, evaluation.group(0)
    plots = [
        o for c in code_cells for o in c.outputs if "application/vnd.plotly.v1+json" in o.get("data", {})
    ]
    assert len(plots) == 3  # two learning curves and the next-character bars
    assert len(_text(_cell(nb, "pull"))) > 200  # the pulled model wrote its sample
    assert "weights identical to the pulled model: True" in _text(_cell(nb, "ckpt-restore"))
    assert "SUMMARY: 2 workers trained a character transformer with DDP for 3 epochs" in stdout


@pytest.mark.timeout(480)
def test_workshop_with_the_reference_solutions_says_right_to_every_exercise(tmp_path: Path) -> None:
    stdout, nb = _run("workshop.ipynb", tmp_path, "--solutions")
    assert "5 exercise cell(s) run with their reference solutions" in stdout
    assert not _errors(nb), _errors(nb)
    ranks = _text(_cell(nb, "ranks"))
    assert "[rank 0] I am rank 0 of WORLD_SIZE=2" in ranks and "[rank 1] I am rank 1 of WORLD_SIZE=2" in ranks
    assert "[rank 1] dist.all_reduce [3.0, 6.0, 9.0]" in _text(_cell(nb, "by-hand"))
    assert "differ by at most 0.0e+00" in _text(_cell(nb, "ddp"))
    for n in range(1, 6):
        said = _text(_cell(nb, f"ex{n}-check"))
        assert said.strip().splitlines()[-1].startswith("Right! "), (n, said)
    assert "SUMMARY: workshop: 5/5 exercises right" in stdout


def _workshop_checks() -> dict[str, Any]:
    """The workshop's check functions, defined by running its checks cell in a plain namespace."""
    nb = nbformat.read(EXAMPLES / "workshop.ipynb", as_version=4)
    namespace: dict[str, Any] = {}
    exec(_cell(nb, "checks").source, namespace)  # noqa: S102 - the notebook's own cell, as the kernel runs it
    return namespace


def test_workshop_ships_blank_exercises_each_with_a_solution_and_a_check() -> None:
    nb = nbformat.read(EXAMPLES / "workshop.ipynb", as_version=4)
    exercises = [c for c in nb.cells if "exercise" in c.metadata.get("tags", [])]
    assert [c.id for c in exercises] == [f"ex{n}" for n in range(1, 6)]
    for cell in exercises:
        assert "EXERCISE" in cell.source and cell.metadata["solution"] != cell.source
        following = nb.cells[nb.cells.index(cell) + 1]
        assert following.id == f"{cell.id}-check" and "check" in following.metadata["tags"]
    assert nb.cells[1].id == "parameters" and "GPU_NOTEBOOK_EXAMPLE_SIZE" in nb.cells[1].source


def test_workshop_start_cell_shows_a_students_real_start_and_runs_locally_as_shipped() -> None:
    """A student sees the line to fill in (the teacher's address, the workshop, their ID; tests/test_docs_options.py
    parses it with the magic's parser); run as shipped (alone, the test suite) the cell starts a local cluster."""
    nb = nbformat.read(EXAMPLES / "workshop.ipynb", as_version=4)
    lines = _cell(nb, "start").source.splitlines()
    student = [line.lstrip("# ") for line in lines if line.startswith("# %gpu_cluster start")]
    assert len(student) == 1 and all(f" {o} " in student[0] for o in ("--address", "--workshop", "--student"))
    assert [line for line in lines if not line.startswith("#") and line.strip()] == ["%gpu_cluster start"]
    part1 = _cell(nb, "part1").source
    assert "address" in part1 and "workshop's name" in part1 and "student ID" in part1


def test_workshop_checks_say_not_yet_in_plain_words(capsys: pytest.CaptureFixture[str]) -> None:
    checks = _workshop_checks()
    assert capsys.readouterr().out == "checks ready\n"
    checks["check_exercise_1"]([None, None])  # the shipped blank
    checks["check_exercise_1"]([[0, 1, 2, 3, 4, 5], [5, 6, 7, 8, 9, 10]])
    checks["check_exercise_1"]([[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 11]])
    checks["check_exercise_2"]([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]])  # the shipped blank: each rank's own
    checks["check_exercise_2"]([[3.0, 6.0, 9.0], [3.0, 6.0, 9.0]])  # the sum, not the mean
    checks["check_exercise_2"]([[1.5, 3.0, 4.5], [1.5, 3.0, 4.5]])
    checks["check_exercise_3"]([[0.1, 0.2], [0.3, 0.2]])
    checks["check_exercise_3"]([[0.1, 0.2], [0.1, 0.2]])
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "Not yet: replace None with this rank's part of `data` (use `rank` and `world_size`)."
    assert said[1] == "Not yet: the parts must hold every item once; missing [11], more than once [5]."
    assert said[2].startswith("Right! 2 ranks, 6 items each")
    assert said[3].startswith("Not yet: `avg` is still this rank's own gradient")
    assert said[4].startswith("Not yet: that is the sum over the ranks")
    assert said[5] == "Right! every rank has the mean gradient [1.5, 3.0, 4.5]."
    assert said[6].startswith("Not yet: the ranks ended with different weights (they differ by up to 0.200)")
    assert said[7].startswith("Right! all 2 ranks hold the same weights")
    assert checks["RESULTS"] == {1: True, 2: True, 3: True}


def test_workshop_cost_check_prices_the_idle_share_of_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    checks = _workshop_checks()
    capsys.readouterr()

    class Flagged:
        def __init__(self, gpu: int) -> None:
            self.gpu = gpu

    checks.update(
        sim=type("Sim", (), {"advice": staticmethod(lambda: [Flagged(2), Flagged(3)])}),
        UTILISATION=[96, 93, 35, 40],
        PRICE_PER_GPU_HOUR=4.0,
    )
    checks["check_exercise_4"]([], 0.0)
    checks["check_exercise_4"]([2, 3], 4.0 * (0.65 + 0.60))  # only the flagged GPUs' idle share
    checks["check_exercise_4"]([3, 2], 4.0 * (0.04 + 0.07 + 0.65 + 0.60))
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith("Not yet: you flagged GPUs []")
    assert said[1].startswith("Not yet: GPUs [2, 3] are right; the dollars per hour are not yet (5.00)")
    assert said[2] == (
        "Right! GPUs [2, 3] are under-used, and $5.44 an hour of $16.00 pays for GPU time that does no work."
    )
    assert math.isclose(4.0 * (0.04 + 0.07 + 0.65 + 0.60), 5.44)


def test_workshop_checkpoint_check_reads_the_bytes_the_last_checkpoint_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    from gpu_notebook.checkpoint import Checkpointer

    checks = _workshop_checks()
    capsys.readouterr()
    checks["STORE"] = str(tmp_path / "store")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))
    ckpt = Checkpointer(checks["STORE"], current=False)
    for step, layers in (
        (0, net),
        (1, net),
        (2, net),
        (2, net[-1]),
    ):  # the last save: only the last layer moved
        with torch.no_grad():
            for p in layers.parameters():
                p.add_(0.01 * torch.randn_like(p))
        ckpt.save({"model": net}, step=step)
        ckpt.wait()
        if step:
            checks["check_exercise_5"]()
    said = capsys.readouterr().out.splitlines()
    assert said[0] == "Not yet: run the exercise cell: it saves the checkpoint of step 2."
    assert (
        said[1].startswith("Not yet: the checkpoint of step 2 wrote ")
        and "every layer still changes" in said[1]
    )
    assert (
        said[2].startswith("Right! the checkpoint of step 2 wrote ")
        and "only the last layer changed" in said[2]
    )
    assert checks["RESULTS"] == {5: True}
