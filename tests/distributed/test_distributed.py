"""%%distributed on a real local Ray cluster with real gloo process groups, driven through a real IPython shell."""

from __future__ import annotations

import _thread
import os
import threading
import time

import pytest

pytestmark = pytest.mark.timeout(180)


def run(ip, cell):
    """Run a notebook cell; returns the ExecutionResult."""
    return ip.run_cell(cell)


def test_workers_keep_state_between_cells(ip, shared, capsys):
    run(ip, "%%distributed\ncounter = rank * 10\n")
    run(ip, "%%distributed\ncounter += 1\n")
    res = run(ip, "%%distributed -o got\ncounter\n")
    assert res.success
    assert list(ip.user_ns["got"]) == [1, 11]
    out = capsys.readouterr().out
    assert "Out[rank 0]: 1" in out and "Out[rank 1]: 11" in out


def test_torchrun_environment_and_rank_order(ip, shared):
    res = run(
        ip,
        "%%distributed -o env\nimport os, torch.distributed as dist\n"
        "({k: os.environ[k] for k in ('RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE','MASTER_ADDR','MASTER_PORT')},"
        " dist.get_rank(), dist.get_world_size(), dist.get_backend())\n",
    )
    assert res.success
    env = ip.user_ns["env"]
    for rank, (e, drank, world, backend) in enumerate(env):
        assert drank == rank and world == 2 and backend == "gloo"
        assert e["RANK"] == str(rank) and e["LOCAL_RANK"] == str(rank)  # one node: local == global
        assert e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2"
    assert env[0][0]["MASTER_ADDR"] == env[1][0]["MASTER_ADDR"]
    assert env[0][0]["MASTER_PORT"] == env[1][0]["MASTER_PORT"] and int(env[0][0]["MASTER_PORT"]) > 0


def test_ddp_and_all_reduce_work(ip, shared, capsys):
    res = run(
        ip,
        "%%distributed -o red\nimport torch, torch.distributed as dist\n"
        "model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))\n"
        "print(dist.get_rank(), dist.get_world_size())\n"
        "t = torch.tensor([float(rank + 1)]); dist.all_reduce(t); t.item()\n",
    )
    assert res.success
    assert list(ip.user_ns["red"]) == [3.0, 3.0]
    out = capsys.readouterr().out
    assert "[rank 0] 0 2" in out and "[rank 1] 1 2" in out
    assert "Out[ranks 0-1]: 3.0" in out  # identical values shown once


TORCHRUN_SCRIPT = """
import os
import torch
import torch.distributed as dist

def main():
    dist.init_process_group("gloo")          # torchrun code initialises the group itself
    local_rank = int(os.environ["LOCAL_RANK"])
    x = torch.ones(2) * (dist.get_rank() + 1)
    dist.all_reduce(x)
    print(f"script rank {dist.get_rank()} local {local_rank} sum {x.tolist()}")
    dist.barrier()
    dist.destroy_process_group()              # ...and tears it down at the end

if __name__ == "__main__":
    main()
"""


def test_a_torchrun_style_script_runs_unchanged_twice(ip, shared, capsys):
    for _ in range(2):  # the second run proves destroy_process_group did not break the group
        res = run(ip, "%%distributed\n" + TORCHRUN_SCRIPT)
        assert res.success, res.error_in_exec
    out = capsys.readouterr().out
    assert out.count("[rank 0] script rank 0 local 0 sum [3.0, 3.0]") == 2
    assert out.count("[rank 1] script rank 1 local 1 sum [3.0, 3.0]") == 2


def test_output_from_threads_and_subprocesses_is_prefixed(ip, shared, capsys):
    res = run(
        ip,
        "%%distributed\nimport threading, subprocess, sys\n"
        "t = threading.Thread(target=lambda: print('from a thread', rank)); t.start(); t.join()\n"
        "subprocess.run(['echo', f'from a subprocess {rank}'])\n"
        "print('to stderr', file=sys.stderr)\n",
    )
    assert res.success
    out = capsys.readouterr().out
    for r in (0, 1):
        assert f"[rank {r}] from a thread {r}" in out
        assert f"[rank {r}] from a subprocess {r}" in out
        assert f"[rank {r}] to stderr" in out


def test_no_stream_groups_output_by_rank_after_the_cell(ip, shared, capsys):
    res = run(ip, "%%distributed --no-stream\nfor i in range(3): print('line', i)\n")
    assert res.success
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("[rank")]
    assert lines == [f"[rank {r}] line {i}" for r in (0, 1) for i in range(3)]


def test_a_subset_of_ranks(ip, shared, capsys):
    res = run(ip, "%%distributed --ranks 1 -o only\nrank\n")
    assert res.success
    only = ip.user_ns["only"]
    assert only.ranks == [1] and only[1] == 1 and list(only) == [1]


def test_dollar_and_braces_are_not_expanded_by_the_notebook(ip, shared):
    ip.user_ns["x"] = "NOTEBOOK"
    res = run(ip, "%%distributed -o s\nx = 'worker'\nf'{x}'\n")
    assert res.success and list(ip.user_ns["s"]) == ["worker", "worker"]


def test_push_and_pull(ip, shared, capsys):
    ip.user_ns["lr"] = 0.25
    run(ip, "%gpu_push lr")
    run(ip, "%%distributed\nscaled = lr * (rank + 1)\n")
    run(ip, "%gpu_pull scaled --rank 1")
    assert ip.user_ns["scaled"] == 0.5
    run(ip, "%gpu_pull scaled --rank 0 --as s0")
    assert ip.user_ns["s0"] == 0.25


def test_pushing_an_unpicklable_object_names_the_variable(ip, shared, capsys):
    ip.user_ns["lock"] = threading.Lock()
    res = run(ip, "%gpu_push lock")
    assert not res.success  # the cell fails, with a one-line message, not a traceback
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert "'lock'" in err and "pickle" in err


def test_pulling_a_missing_or_unpicklable_variable_is_a_clear_error(ip, shared, capsys):
    assert not run(ip, "%gpu_pull no_such_var").success
    captured = capsys.readouterr()
    assert "no_such_var" in captured.err + captured.out
    run(ip, "%%distributed\nimport threading\nwlock = threading.Lock()\n")
    assert not run(ip, "%gpu_pull wlock").success
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert "wlock" in err and "pickle" in err


def test_an_error_on_one_rank_is_one_report_pointing_at_the_cell_line(ip, shared, capsys):
    res = run(ip, "%%distributed\nx = 1\nif rank == 1:\n    raise ValueError('bad shard')\n")
    err = res.error_in_exec
    assert err is not None and type(err).__name__ == "DistributedError"
    assert err.ranks == [1]
    text = "\n".join(err._render_traceback_())
    assert "rank 1: ValueError: bad shard at cell line 4" in text
    assert "raise ValueError('bad shard')" in text  # the user's source line
    assert "_worker.py" not in text  # none of our frames


def test_the_same_error_on_every_rank_is_shown_once(ip, shared):
    res = run(ip, "%%distributed\n1 / 0\n")
    err = res.error_in_exec
    text = "\n".join(err._render_traceback_())
    assert text.count("ZeroDivisionError: division by zero at cell line 2") == 1
    assert "ranks 0-1" in text


def test_a_collective_left_hanging_by_a_failed_rank_does_not_hang_the_notebook(ip, shared):
    run(ip, "%%distributed\nbefore = 'kept?'\n")
    pids_before = [w.pid for w in shared.status().workers]
    res = run(
        ip,
        "%%distributed\nimport torch, torch.distributed as dist\n"
        "if rank == 1:\n    raise RuntimeError('rank 1 fails before the all_reduce')\n"
        "dist.all_reduce(torch.ones(1))\n",
    )
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert "rank 1: RuntimeError: rank 1 fails before the all_reduce" in text
    assert "rank 0: hung" in text
    assert "Worker state was reset" in text and "rebuilt" in text
    # the group works again, with fresh processes and no old state
    res = run(
        ip,
        "%%distributed -o alive\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); (t.item(), 'before' in dir())\n",
    )
    assert res.success and list(ip.user_ns["alive"]) == [(2.0, False), (2.0, False)]
    assert set(w.pid for w in shared.status().workers).isdisjoint(pids_before)


def test_a_killed_worker_is_reported_with_its_rank_and_last_output_and_the_group_recovers(ip, shared, capsys):
    res = run(ip, "%%distributed -o pids\nimport os\nos.getpid()\n")
    assert res.success
    killed = ip.user_ns["pids"][1]  # the process that kills itself below, as it names itself
    assert killed == shared.status().workers[1].pid
    res = run(
        ip,
        "%%distributed\nimport os, time\nprint('working on shard', rank, flush=True)\n"
        "if rank == 1:\n    time.sleep(0.6)\n    os.kill(os.getpid(), 9)\ntime.sleep(1.5)\n",
    )
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert "rank 1: died" in text
    assert f"--- rank 1: died: the worker process (pid {killed} on " in text  # rank and real pid, one line
    assert "| working on shard 1" in text  # its last output
    assert "Worker state was reset" in text
    logs = shared.logs(rank=1, tail=20)
    assert "working on shard 1" in logs[1]
    res = run(
        ip,
        "%%distributed -o ok\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); t.item()\n",
    )
    assert res.success and list(ip.user_ns["ok"]) == [2.0, 2.0]
    assert all(w.alive for w in shared.status().workers)


def test_a_kernel_interrupt_stops_every_rank_and_keeps_the_workers(ip, shared, capsys):
    run(ip, "%%distributed\nkeep = 'me'\n")
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    t0 = time.monotonic()
    res = run(ip, "%%distributed\nimport time\nwhile True:\n    time.sleep(0.01)\n")
    elapsed = time.monotonic() - t0
    timer.cancel()
    assert elapsed < 60
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert "interrupted" in text and "still usable" in text
    assert text.startswith("Interrupted: the cell was stopped on 2 of 2 rank(s) (0-1)"), text  # not "failed"
    res = run(ip, "%%distributed -o k\nkeep\n")
    assert res.success and list(ip.user_ns["k"]) == ["me", "me"]


def test_timeout_interrupts_a_long_cell(ip, shared):
    res = run(ip, "%%distributed --timeout 1\nimport time\nfor _ in range(3000):\n    time.sleep(0.01)\n")
    text = "\n".join(res.error_in_exec._render_traceback_())
    assert "timeout" in text and text.startswith("Timeout: the cell ran past --timeout on 2 of 2 rank(s)"), (
        text
    )
    assert run(ip, "%%distributed\n1\n").success


def test_python_api_call_runs_a_function_on_every_rank(shared):
    def where():
        import os

        import torch.distributed as dist

        return dist.get_rank(), os.getpid()

    out = shared.call(where)
    assert [r for r, _ in out] == [0, 1]
    assert out[0][1] != out[1][1] and os.getpid() not in (out[0][1], out[1][1])


def test_python_api_call_raises_a_grouped_error(shared):
    from gpu_notebook.distributed import DistributedError

    def fail():
        raise KeyError("missing")

    with pytest.raises(DistributedError) as info:
        shared.call(fail)
    assert info.value.ranks == [0, 1] and "KeyError" in str(info.value)


def test_a_trailing_semicolon_hides_the_values_like_ipython(ip, shared, capsys):
    res = run(ip, "%%distributed -o v\n41 + rank;\n")
    assert res.success and list(ip.user_ns["v"]) == [41, 42]
    assert "Out[" not in capsys.readouterr().out


def test_a_semicolon_before_a_comment_hides_the_values_and_one_inside_a_comment_does_not(ip, shared, capsys):
    # the quickstart's `losses;   # ... ; hides them` printed every rank's 60 losses: only the raw text's last
    # character was looked at, not the last token as IPython does
    res = run(ip, "%%distributed -o v\n41 + rank;   # -o keeps them; ; hides them\n")
    assert res.success and list(ip.user_ns["v"]) == [41, 42]
    assert "Out[" not in capsys.readouterr().out
    res = run(ip, "%%distributed\n41 + rank   # shown;\n")
    out = capsys.readouterr().out
    assert "Out[rank 0]: 41" in out and "Out[rank 1]: 42" in out
