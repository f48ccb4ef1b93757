"""How a cell's exit is reported: ``sys.exit(0)`` and friends end the rank's cell cleanly, a non-zero code is a
failure that names it, and ``os._exit`` is a dead worker (real ranks of the shared gloo cluster)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("stmt", ["sys.exit(0)", "exit()", "quit()", "raise SystemExit(None)", "sys.exit()"])
def test_a_clean_exit_ends_the_cell_as_a_success(ip, shared, capsys, stmt):
    res = ip.run_cell(f"%%distributed\nimport sys\nprint('before')\n{stmt}\nprint('after')\n")
    assert res.success, res.error_in_exec
    out = capsys.readouterr()
    text = out.out + out.err
    assert "[rank 0] before" in text and "[rank 1] before" in text
    assert "after" not in text
    assert "[rank 1] exited with code 0" in text
    assert "Traceback" not in text and "DistributedError" not in text
    res = ip.run_cell("%%distributed -o alive\n1\n")  # the workers keep running
    assert res.success and list(ip.user_ns["alive"]) == [1, 1]


def test_an_exit_on_one_rank_leaves_the_others_values(ip, shared, capsys):
    res = ip.run_cell("%%distributed -o got\nimport sys\nif rank == 1:\n    sys.exit(0)\nrank + 10\n")
    assert res.success, res.error_in_exec
    assert ip.user_ns["got"][0] == 10 and ip.user_ns["got"][1] is None


@pytest.mark.parametrize(
    ("stmt", "named"), [("sys.exit(3)", "exit code 3"), ("sys.exit('bad input')", "bad input (exit code 1)")]
)
def test_a_nonzero_exit_is_a_failure_naming_the_code(ip, shared, stmt, named):
    res = ip.run_cell(f"%%distributed\nimport sys\nif rank == 1:\n    {stmt}\n")
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert "1 of 2 rank(s) failed (1)" in text
    assert f"--- rank 1: SystemExit: {named}" in text
    res = ip.run_cell("%%distributed -o alive\n1\n")  # a failure of the code, not of the worker
    assert res.success and list(ip.user_ns["alive"]) == [1, 1]


def test_os_exit_is_a_dead_worker_with_its_rank_pid_and_last_output(ip, shared):
    res = ip.run_cell("%%distributed -o pids\nimport os\nos.getpid()\n")
    assert res.success
    pid = ip.user_ns["pids"][1]
    res = ip.run_cell(
        "%%distributed\nimport os, time\nprint('last words of', rank, flush=True)\n"
        "if rank == 1:\n    time.sleep(0.6)\n    os._exit(5)\ntime.sleep(1.5)\n"
    )
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert f"--- rank 1: died: the worker process (pid {pid} on " in text
    assert "| last words of 1" in text
    res = ip.run_cell(
        "%%distributed -o alive\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); t.item()\n"
    )
    assert res.success and list(ip.user_ns["alive"]) == [2.0, 2.0]


def test_a_rank_whose_forked_child_outlives_it_is_reported_dead_all_the_same(ip, shared):
    """Ray hears of a worker's death when its connection to the raylet closes; a child the rank forked (a
    DataLoader worker of an interrupted cell, asleep in ``__getitem__``) keeps it open. The cell must still end,
    reporting the rank dead, instead of waiting for the child."""
    res = ip.run_cell("%%distributed -o pids\nimport os\nos.getpid()\n")
    assert res.success
    pid = ip.user_ns["pids"][1]
    res = ip.run_cell(
        "%%distributed\nimport os, time\nprint('forking', rank, flush=True)\n"
        "if rank == 1:\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(45)\n"
        "        os._exit(0)\n"
        "    time.sleep(0.5)\n"
        "    os._exit(7)\n"
        "time.sleep(1)\n"
    )
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert f"--- rank 1: died: the worker process (pid {pid} on " in text
    assert "its process is gone" in text and "| forking 1" in text
    res = ip.run_cell("%%distributed -o alive\nrank\n")
    assert res.success and list(ip.user_ns["alive"]) == [0, 1]
