"""The rank side of ``%gpu_run`` in this process: how a script is found or sent, and what is put back after it."""

from __future__ import annotations

import os
import sys
from dataclasses import replace

import pytest

from gpu_notebook.distributed._script import ScriptError, run_script, script_for

BODY = "import os, sys\nRESULT.append((sys.argv, __file__, __name__, os.getcwd(), sys.path[0]))\n"


@pytest.fixture()
def results(monkeypatch):
    """Where the scripts report to (a builtin, so the script's fresh __main__ sees it)."""
    import builtins

    got: list = []
    monkeypatch.setattr(builtins, "RESULT", got, raising=False)
    return got


def test_a_script_not_on_this_node_runs_from_the_source_sent_with_it(tmp_path, results):
    (tmp_path / "train.py").write_text(BODY)
    script = script_for("train.py", ["--lr", "0.1"], cwd=str(tmp_path))
    assert script.source is not None and script.size == len(BODY)
    (tmp_path / "train.py").unlink()  # as on a worker's node that never had it
    main, argv, cwd = sys.modules["__main__"], list(sys.argv), os.getcwd()
    run_script(script)
    (got_argv, got_file, name, got_cwd, path0) = results[0]
    assert got_argv == ["train.py", "--lr", "0.1"] and name == "__main__"
    assert os.path.basename(got_file) == "train.py" and got_file != str(tmp_path / "train.py")
    assert open(got_file).read() == BODY  # a real file: tracebacks show its lines
    assert path0 == os.path.dirname(got_file) and got_cwd == str(tmp_path)
    assert sys.modules["__main__"] is main and sys.argv == argv and os.getcwd() == cwd


def test_a_changed_copy_is_not_run_and_a_large_script_is_not_sent(tmp_path, results):
    (tmp_path / "big.py").write_text(BODY + "#" * 2000 + "\n")
    script = script_for("big.py", cwd=str(tmp_path), max_bytes=1000)
    assert script.source is None
    run_script(script)  # the same bytes at the same path: run in place
    assert results[0][1] == str(tmp_path / "big.py")
    (tmp_path / "big.py").write_text(BODY)  # this node's copy differs from what the notebook had
    with pytest.raises(ScriptError, match="big.py is 2.0 KiB, over the 1000 bytes .*--working-dir"):
        run_script(script)


def test_inside_the_working_dir_the_rank_runs_its_copy_in_its_own_cwd(tmp_path, results, monkeypatch):
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / "sub" / "job.py").write_text(BODY)
    script = script_for("sub/job.py", cwd=str(project), working_dir=str(project))
    assert script.cwd is None and script.relpath == os.path.join("sub", "job.py")
    copy = tmp_path / "ray_copy"  # Ray's copy of the working dir, where the worker runs
    (copy / "sub").mkdir(parents=True)
    (copy / "sub" / "job.py").write_text(BODY)
    monkeypatch.chdir(copy)
    run_script(replace(script, path=None))
    assert results[0][1] == str(copy / "sub" / "job.py") and results[0][3] == str(copy)


def test_what_cannot_be_run_is_said_before_anything_is_sent(tmp_path):
    with pytest.raises(ScriptError, match="nope.py: no such file"):
        script_for("nope.py", cwd=str(tmp_path))
    with pytest.raises(ScriptError, match="is a directory"):
        script_for(".", cwd=str(tmp_path))
    with pytest.raises(ScriptError, match="not a module name"):
        script_for("pkg/mod.py", module=True)


def test_system_exit_leaves_the_runner_as_it_leaves_a_script(tmp_path):
    (tmp_path / "bye.py").write_text("import sys\nsys.exit(0)\n")
    main = sys.modules["__main__"]
    with pytest.raises(SystemExit) as info:
        run_script(script_for("bye.py", cwd=str(tmp_path)))
    assert info.value.code == 0 and sys.modules["__main__"] is main
