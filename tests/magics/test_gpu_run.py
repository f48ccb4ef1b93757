"""``%gpu_run``: a script or module runs on every rank of the shared gloo cluster as real torchrun runs it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(240)

DUMP = textwrap.dedent(
    """
    import json, os, sys
    # one write with its newline: under PYTHONUNBUFFERED print() writes the line and its end apart, and torchrun's
    # two ranks share one pipe
    sys.stdout.write("DUMP " + json.dumps({
        "argv": sys.argv, "file": __file__, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
        "rank": os.environ.get("RANK"), "world": os.environ.get("WORLD_SIZE"),
    }) + "\\n")
    sys.stdout.flush()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dumps(text: str) -> dict[str, dict]:
    """The DUMP lines by rank, from torchrun's output or the cell's ``[rank N] DUMP {...}`` lines."""
    out = {}
    for line in text.splitlines():
        if "DUMP " in line:
            d = json.loads(line.split("DUMP ", 1)[1])
            out[d["rank"]] = d
    return out


def _torchrun(cwd, *target: str) -> dict[str, dict]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            str(_free_port()),
            *target,
            "--lr",
            "0.1",
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")},
    )
    assert proc.returncode == 0, proc.stderr
    return _dumps(proc.stdout)


@pytest.fixture()
def project(tmp_path):
    """A launch directory with a script in a subdirectory and a package with a module."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "dump.py").write_text(DUMP)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "dump.py").write_text(DUMP)
    return tmp_path


@pytest.mark.parametrize(
    ("magic_args", "torchrun_args"),
    [("scripts/dump.py --lr 0.1", ("scripts/dump.py",)), ("-m pkg.dump --lr 0.1", ("-m", "pkg.dump"))],
    ids=["file", "module"],
)
def test_a_script_sees_argv_file_name_and_cwd_as_under_torchrun(
    ip, shared, project, capsys, monkeypatch, magic_args, torchrun_args
):
    expected = _torchrun(project, *torchrun_args)
    assert set(expected) == {"0", "1"}
    monkeypatch.chdir(project)
    ip.run_cell(
        "%%distributed\nimport os, sys\nbefore = (list(sys.argv), os.getcwd(), sys.modules['__main__'])\n"
    )
    capsys.readouterr()
    res = ip.run_line_magic("gpu_run", magic_args)
    assert res is None
    got = _dumps(capsys.readouterr().out)
    assert set(got) == {"0", "1"}
    for rank in ("0", "1"):
        for key in ("argv", "file", "name", "cwd", "path0", "rank", "world"):
            assert got[rank][key] == expected[rank][key], (rank, key)
    # the rank's own state is back: argv, working directory, its __main__ (the cells' namespace)
    res = ip.run_cell(
        "%%distributed -o same\nimport os, sys\n(list(sys.argv), os.getcwd(), sys.modules['__main__']) == before\n"
    )
    assert res.success and list(ip.user_ns["same"]) == [True, True]


def test_a_failing_script_is_one_report_naming_the_ranks_and_the_script_line(
    ip, shared, tmp_path, monkeypatch
):
    (tmp_path / "bad.py").write_text(
        "import os\nx = 1\nraise ValueError('boom on ' + os.environ['RANK'][:0] + 'rank')\n"
    )
    monkeypatch.chdir(tmp_path)
    res = ip.run_cell("%gpu_run bad.py\n")
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert "2 of 2 rank(s) failed (0-1)" in text
    assert "--- ranks 0-1: ValueError: boom on rank" in text
    assert f'File "{tmp_path / "bad.py"}", line 3, in <module>' in text
    assert "raise ValueError" in text  # the script's own line is shown
    assert "_script.py" not in text and "_worker.py" not in text  # none of our frames
    res = ip.run_cell("%%distributed -o alive\n1\n")  # the workers are still usable
    assert res.success and list(ip.user_ns["alive"]) == [1, 1]


def test_sys_exit_0_ends_a_script_cleanly_and_a_code_fails_it(ip, shared, tmp_path, monkeypatch, capsys):
    (tmp_path / "done.py").write_text("import sys\nprint('trained')\nsys.exit(0)\nprint('not reached')\n")
    (tmp_path / "fail.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.chdir(tmp_path)
    res = ip.run_cell("%gpu_run done.py\n")
    assert res.success, res.error_in_exec
    text = capsys.readouterr().out
    assert "[rank 0] trained" in text and "[rank 1] trained" in text and "not reached" not in text
    res = ip.run_cell("%gpu_run --ranks 1 fail.py\n")
    assert res.error_in_exec is not None
    assert "exit code 3" in "\n".join(res.error_in_exec._render_traceback_())


def test_an_edited_script_and_its_helper_module_run_afresh(ip, shared, tmp_path, monkeypatch, capsys):
    (tmp_path / "helper.py").write_text("VALUE = 'one'\n")
    (tmp_path / "main.py").write_text("import helper\nprint('helper says', helper.VALUE)\n")
    monkeypatch.chdir(tmp_path)
    ip.run_line_magic("gpu_run", "main.py")
    assert "[rank 1] helper says one" in capsys.readouterr().out
    (tmp_path / "helper.py").write_text("VALUE = 'two'\n")  # as a new torchrun would, the next run sees it
    ip.run_line_magic("gpu_run", "main.py")
    assert "[rank 1] helper says two" in capsys.readouterr().out


def test_quoted_arguments_and_a_rank_selection(ip, shared, tmp_path, monkeypatch, capsys):
    (tmp_path / "args.py").write_text("import sys, os\nprint('ARGS', os.environ['RANK'], sys.argv[1:])\n")
    monkeypatch.chdir(tmp_path)
    ip.run_line_magic("gpu_run", "--ranks 1 args.py --name 'a b' -w 0")
    out = capsys.readouterr().out
    assert "[rank 1] ARGS 1 ['--name', 'a b', '-w', '0']" in out
    assert "[rank 0]" not in out


def test_a_timeout_interrupts_the_script_and_keeps_the_workers(ip, shared, tmp_path, monkeypatch):
    (tmp_path / "slow.py").write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n")
    monkeypatch.chdir(tmp_path)
    res = ip.run_cell("%gpu_run --timeout 2 slow.py\n")
    assert res.error_in_exec is not None
    assert "Timeout" in "\n".join(res.error_in_exec._render_traceback_())
    res = ip.run_cell("%%distributed -o argv\nimport sys\nsys.argv[0]\n")
    assert res.success and ip.user_ns["argv"][0] != "slow.py"


def test_a_missing_script_fails_the_cell_before_anything_runs(ip, shared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = ip.run_cell("%gpu_run nothere.py --lr 1\n")
    assert res.error_in_exec is not None
    assert "nothere.py: no such file" in str(res.error_in_exec)
