"""Pure parts of recovery: how each rank's failure is named, and the notes a rebuild leaves (no Ray needed)."""

from __future__ import annotations

import pytest

from gpu_notebook.distributed import Worker, WorkerGroup, plan_ranks
from gpu_notebook.distributed._recovery import died_failure, lost_ranks, rebuild, reply_failure


def _worker(pid: int = 4242, ip: str = "10.0.0.5") -> Worker:
    meta = {"node_id": "n", "ip": ip, "gpu_ids": [], "pid": pid}
    plan = plan_ranks([meta])[0]
    return Worker(actor=object(), plan=plan, meta=meta)  # type: ignore[arg-type]


def test_a_dead_worker_is_named_by_rank_pid_and_node_with_its_last_output():
    f = died_failure(0, _worker(), RuntimeError("The actor died unexpectedly\nmore"), ["epoch 3"])
    assert (f.rank, f.kind) == (0, "died")
    assert f.detail == "the worker process (pid 4242 on 10.0.0.5) died: The actor died unexpectedly"
    assert f.last_output == ["epoch 3"]
    assert (f.etype, f.evalue) == ("", "")
    assert _worker(pid=7).pid == 7 and _worker().rank == 0


def test_a_fatal_signal_names_faulthandlers_error_and_the_cell_line():
    fault = (
        "Fatal Python error: Segmentation fault\n\nCurrent thread 0x7f (most recent call first):\n"
        '  File "/usr/lib/python3.11/ctypes/__init__.py", line 519 in string_at\n'
        '  File "<cell In[7]>", line 4 in <module>\n'
        '  File "/x/gpu_notebook/distributed/_worker.py", line 410 in work\n'
    )
    f = died_failure(1, _worker(), RuntimeError("The actor died unexpectedly"), [], fault)
    assert (f.etype, f.evalue) == ("Fatal Python error", "Segmentation fault in string_at, at cell line 4")


def test_a_keyboard_interrupt_is_the_groups_own_only_when_it_sent_one():
    reply = {"ok": False, "etype": "KeyboardInterrupt", "evalue": "", "traceback": "tb", "cell_lines": [3]}
    assert reply_failure(1, reply, "").kind == "error"  # the user's code raised it
    f = reply_failure(1, reply, "timeout")
    assert (f.kind, f.detail, f.cell_lines) == ("timeout", "interrupted: the timeout expired", [3])


def test_rebuild_notes_say_what_became_of_the_workers():
    said: list[str] = []
    note = rebuild("rank(s) 1 died", 2, lambda: None, lambda: None, said.append)
    assert note.startswith("Worker state was reset: rank(s) 1 died") and "2 fresh worker(s)" in note
    assert said == ["rebuilding the worker group: rank(s) 1 died"]

    def fail() -> None:
        raise RuntimeError("no resources")

    note = rebuild("x", 3, lambda: None, fail, said.append)
    assert note.startswith("Worker state was lost: x") and "no resources" in note and "scale 3" in note
    restarted: list[int] = []
    note = rebuild("x", 3, lambda: "budget", lambda: restarted.append(1), said.append)
    assert note == "Cluster stopped: budget (x); nothing was restarted." and restarted == []
    assert lost_ranks([], []) == ""


def test_a_bad_gpu_visibility_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="gpu_visibility"):
        WorkerGroup(1, gpu_visibility="all")
