"""Failure paths of the distributed workers on a real local Ray cluster with real gloo process groups.

Values the notebook cannot rebuild or should not receive, interrupts racing the end of a cell, the backend
choice, output written at the very end of a cell or redrawn with ``\\r``, and stopping the group under a cell.
"""

from __future__ import annotations

import os
import random
import threading
import time
import types

import pytest
from IPython.core.error import UsageError

from gpu_notebook.distributed import WorkerGroup, choose_backend, plan_ranks
from gpu_notebook.distributed._capture import split_sync
from gpu_notebook.distributed._output import RankLog, Streamer
from gpu_notebook.distributed._process_group import explain_backend
from gpu_notebook.distributed._worker import DEFAULT_MAX_RESULT_BYTES, _to_cpu

pytestmark = pytest.mark.timeout(120)


def _bad_value_code(driver_pid: int) -> str:
    """Cell code defining ``Bad``: it pickles on the worker, but rebuilding it raises in the notebook only."""
    return (
        "import os\n"
        "class Bad:\n"
        "    def __reduce__(self):\n"
        f"        def rebuild(driver={driver_pid}):\n"
        "            if os.getpid() == driver:\n"
        "                raise RuntimeError('cannot rebuild on the driver')\n"
        "            return 'rebuilt'\n"
        "        return (rebuild, ())\n"
    )


# ---- 1. values the notebook cannot rebuild, values too large to send -------------------------------------
def test_a_value_the_notebook_cannot_rebuild_fails_that_rank_only(ip, shared, capsys):
    pids = [w.pid for w in shared.status().workers]
    cell = "%%distributed -o v\n" + _bad_value_code(os.getpid()) + "Bad() if rank == 1 else 'fine'\n"
    res = ip.run_cell(cell)
    err = res.error_in_exec
    assert type(err).__name__ == "DistributedError", repr(err)
    assert err.ranks == [1]
    text = "\n".join(err._render_traceback_())
    assert "--- rank 1: value:" in text and "RuntimeError: cannot rebuild on the driver" in text
    assert "Worker state" not in text  # nothing died: no rebuild
    v = ip.user_ns["v"]
    assert v.ranks == [0] and v[0] == "fine"  # the other rank's value came back
    assert [w.pid for w in shared.status().workers] == pids
    assert ip.run_cell("%%distributed -o w\nrank\n").success and list(ip.user_ns["w"]) == [0, 1]
    # fetching such a value deliberately is a clear error naming it
    assert ip.run_cell("%%distributed\nbad = Bad()\n").success
    capsys.readouterr()
    assert not ip.run_cell("%gpu_pull bad --rank 1").success  # the cell fails, in one line
    captured = capsys.readouterr()
    err_text = captured.err + captured.out
    assert "'bad' from rank 1 cannot be rebuilt in the notebook" in err_text and "cannot rebuild" in err_text


def test_call_goes_through_the_same_checks_as_a_cell(shared):
    group = shared.group
    ns: dict = {}
    exec(_bad_value_code(os.getpid()), ns)  # noqa: S102 - the class is defined here, pickled by value
    bad_cls = ns["Bad"]

    def make(size):
        import torch.distributed as dist

        rank = dist.get_rank()
        return bad_cls() if rank == 1 else b"x" * size

    old = group.max_result_bytes
    group.max_result_bytes = 2**20
    try:
        res = group.call(make, (2 * 2**20,))
    finally:
        group.max_result_bytes = old
    assert [(f.rank, f.kind) for f in res.failures] == [(1, "value")]
    assert "cannot rebuild on the driver" in res.failures[0].detail
    placeholder = res.values[0]
    assert type(placeholder).__name__ == "TooLarge"
    text = repr(placeholder)
    assert "not sent: 2.0 MiB pickled" in text and "1.0 MiB limit" in text and "%gpu_pull" in text


def test_a_large_value_is_replaced_by_a_placeholder_and_a_small_state_dict_comes_back_whole(shared):
    assert WorkerGroup(1).max_result_bytes == DEFAULT_MAX_RESULT_BYTES == 64 * 2**20
    group = shared.group
    old = group.max_result_bytes
    group.max_result_bytes = 2**20
    try:
        res = shared.run(
            "import torch\ntorch.manual_seed(0)\n"
            "big = torch.nn.Linear(1000, 500).state_dict()\n"  # 2 MB of weights: over the limit
            "small = torch.nn.Linear(2, 3).state_dict()\n"
            "big if rank == 0 else small\n",
            stream=False,
        )
    finally:
        group.max_result_bytes = old
    assert res.ok, res.failures
    text = repr(res.values[0])
    assert type(res.values[0]).__name__ == "TooLarge"
    assert "OrderedDict" in text and "2 entries" in text and "%gpu_pull NAME --rank 0" in text
    small = res.values[1]
    assert type(small).__name__ == "OrderedDict" and list(small) == ["weight", "bias"]
    assert hasattr(small, "_metadata")  # load_state_dict needs it
    assert small["weight"].shape == (3, 2) and small["weight"].device.type == "cpu"


def test_the_value_size_limit_per_cell_and_per_cluster(ip, shared, capsys):
    """``%%distributed --max-result SIZE`` sets one cell's limit (0: none); ``Cluster(max_result_bytes=...)`` the
    group's default; a bad size prints the usage."""
    cell = "import torch\ntorch.zeros(64 * 1024, dtype=torch.uint8) if rank == 0 else 1\n"  # 64 KiB on rank 0
    assert ip.run_cell("%%distributed -o v --max-result 16K\n" + cell).success
    assert type(ip.user_ns["v"][0]).__name__ == "TooLarge" and ip.user_ns["v"][1] == 1
    assert "--max-result" in repr(ip.user_ns["v"][0])  # the placeholder says how to raise the limit
    group = shared.group
    old = group.max_result_bytes
    group.max_result_bytes = 16 * 1024  # what Cluster(max_result_bytes=16384) gives its group
    try:
        assert ip.run_cell("%%distributed -o v\n" + cell).success
        assert type(ip.user_ns["v"][0]).__name__ == "TooLarge"
        assert ip.run_cell("%%distributed -o v --max-result 0\n" + cell).success  # no limit for this cell
        assert ip.user_ns["v"][0].numel() == 64 * 1024
        assert ip.run_cell("%%distributed -o v --max-result 1M\n" + cell).success
        assert ip.user_ns["v"][0].numel() == 64 * 1024
    finally:
        group.max_result_bytes = old
    capsys.readouterr()
    ip.user_ns.pop("w", None)
    res = ip.run_cell("%%distributed -o w --max-result lots\n1\n")
    # a usage error fails the cell, with no traceback of ours
    assert isinstance(res.error_in_exec, UsageError)
    err = capsys.readouterr().err
    assert "usage" in err.lower() and "--max-result" in err and "w" not in ip.user_ns
    with pytest.raises(ValueError, match=">= 0"):
        shared.run("1", max_result_bytes=-1)


class _FakeTensor:
    """Stands in for a CUDA tensor (no GPU here) in the pure container walk of ``_to_cpu``."""

    def __init__(self, device: str) -> None:
        self.device = types.SimpleNamespace(type=device)
        self.requires_grad = False

    def detach(self):
        return self

    def cpu(self):
        return _FakeTensor("cpu")


def test_tensors_move_to_the_cpu_inside_the_containers_that_hold_them():
    import collections

    fake_torch = types.SimpleNamespace(
        Tensor=_FakeTensor, nn=types.SimpleNamespace(Parameter=type("Parameter", (_FakeTensor,), {}))
    )
    on_cpu = _FakeTensor("cpu")
    sd = collections.OrderedDict(weight=_FakeTensor("cuda"), bias=on_cpu)
    sd._metadata = {"": {"version": 1}}
    out = _to_cpu(sd, fake_torch)
    assert type(out) is collections.OrderedDict and out._metadata == {"": {"version": 1}}
    assert out["weight"].device.type == "cpu" and out["bias"] is on_cpu
    assert sd["weight"].device.type == "cuda"  # the worker's own state_dict is left alone
    groups = [{"lr": 0.1, "params": [0]}]
    opt = {"state": {0: {"exp_avg": _FakeTensor("cuda"), "step": 3}}, "param_groups": groups}
    moved = _to_cpu(opt, fake_torch)
    assert moved["state"][0]["exp_avg"].device.type == "cpu" and moved["state"][0]["step"] == 3
    assert moved["param_groups"] is groups  # unchanged parts are not copied
    pair = collections.namedtuple("pair", "a b")(_FakeTensor("cuda"), 1)
    assert type(_to_cpu(pair, fake_torch)) is type(pair) and _to_cpu(pair, fake_torch).a.device.type == "cpu"
    nested = _to_cpu((_FakeTensor("cuda"), [_FakeTensor("cuda")]), fake_torch)
    assert type(nested) is tuple and [t.device.type for t in nested[1]] == ["cpu"]
    everything_on_cpu = {"a": [on_cpu]}
    assert _to_cpu(everything_on_cpu, fake_torch) is everything_on_cpu


# ---- 2. interrupts racing the end of a cell ---------------------------------------------------------------
def test_interrupts_at_random_moments_never_escape_a_finished_cell(shared):
    import ray

    group = shared.group
    workers = list(group.workers)
    # frequent thread switches in the workers make the race windows far more likely to be hit
    assert group.run("import sys\nsys.setswitchinterval(1e-6)\n").ok
    stop = threading.Event()
    sent = [0]

    def hammer() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            ray.get([w.actor.interrupt.remote() for w in workers], timeout=30)
            sent[0] += 1
            time.sleep(rng.uniform(0, 0.001))

    thread = threading.Thread(target=hammer, daemon=True)
    thread.start()
    interrupted = 0
    try:
        deadline = time.monotonic() + 25
        for i in range(150):
            if time.monotonic() > deadline:
                break
            res = group.run(f"x = {i}\nx\n")
            for f in res.failures:  # an interrupt may stop a cell, but only as that cell's KeyboardInterrupt
                assert (f.kind, f.etype) == ("error", "KeyboardInterrupt"), f
                interrupted += 1
            for _rank, value in res.values.items():
                assert value == i
    finally:
        stop.set()
        thread.join(30)
    assert sent[0] > 20
    # nothing is left pending: cells after the last interrupt run clean, on the same processes
    for _ in range(5):
        res = group.run("import time\ntime.sleep(0.02)\n'ok'\n")
        assert res.ok, res.failures
        assert list(res.values) == ["ok", "ok"]
    assert group.run("import sys\nsys.setswitchinterval(0.005)\n").ok
    assert group.workers == workers


# ---- 3. the backend ---------------------------------------------------------------------------------------
def _meta(node, ip, gpus=()):
    return {"node_id": node, "ip": ip, "gpu_ids": list(gpus)}


def test_nccl_only_when_every_rank_has_cuda_and_its_own_gpu():
    own = plan_ranks([_meta("n", "x", ["0"]), _meta("n", "x", ["1"])])
    assert explain_backend(own, [True, True]) == ("nccl", "")
    assert choose_backend(own, cuda_available=True) == "nccl"  # one flag for all ranks still works

    backend, why = explain_backend(own, [True, False])
    assert backend == "gloo" and "rank 1" in why and "CUDA" in why

    shared_gpu = plan_ranks([_meta("n", "x", ["0"]), _meta("n", "x", ["0"])])  # --gpus-per-worker 0.5
    backend, why = explain_backend(shared_gpu, [True, True])
    assert backend == "gloo" and "ranks 0-1 share GPU 0" in why and "x" in why

    other_nodes = plan_ranks([_meta("a", "1.1.1.1", ["0"]), _meta("b", "1.1.1.2", ["0"])])
    assert explain_backend(other_nodes, [True, True]) == ("nccl", "")  # GPU 0 of two different nodes

    cpu = plan_ranks([_meta("n", "x"), _meta("n", "x")])
    backend, why = explain_backend(cpu, [False, False])
    assert backend == "gloo" and "no GPU" in why
    mixed = plan_ranks([_meta("n", "x", ["0"]), _meta("n", "x")])
    backend, why = explain_backend(mixed, [True, False])
    assert backend == "gloo" and "rank 1 has no GPU" in why


def test_the_group_chooses_its_backend_with_the_helper(ray_session, monkeypatch):
    from gpu_notebook.distributed import _group

    calls = []
    real = _group.explain_backend

    def spy(plans, cuda_available):
        calls.append(list(cuda_available))
        return real(plans, cuda_available)

    monkeypatch.setattr(_group, "explain_backend", spy)
    said: list[str] = []
    group = WorkerGroup(1, cpus_per_worker=0.5)
    try:
        group.start(progress=said.append)
        assert group.backend == "gloo" and group.workers[0].meta["cuda_available"] is False
    finally:
        group.stop()
    assert calls == [[False]]  # each worker's own report of CUDA
    line = [m for m in said if m.startswith("initialising torch.distributed")]
    assert line and "gloo" in line[0] and "no GPU" in line[0]


# ---- 4. output -------------------------------------------------------------------------------------------
def test_sync_markers_are_taken_out_of_the_captured_bytes():
    m = b"\x00gpu_notebook:sync:"
    assert split_sync(b"abc" + m + b"7\x00def") == (b"abcdef", [7], b"")
    assert split_sync(b"abc" + m[:5]) == (b"abc", [], m[:5])  # a marker cut by the read: kept for the next
    assert split_sync(m[:5] + m[5:] + b"12") == (b"", [], m + b"12")
    assert split_sync(m + b"12\x00" + m + b"13\x00") == (b"", [12, 13], b"")
    # NUL bytes of the user's output stay (one that could begin a marker waits for the next read)
    assert split_sync(b"a\x00b\x00") == (b"a\x00b", [], b"\x00")
    assert split_sync(b"\x00" + b"c") == (b"\x00c", [], b"")
    assert split_sync(m + b"x\x00y") == (m + b"x\x00y", [], b"")


def test_c_level_output_at_the_end_of_a_cell_comes_with_that_cell(shared, monkeypatch):
    monkeypatch.setenv("GPU_NOTEBOOK_OUTPUT_LINES", "10000")  # keep all 5000 lines (the default keeps 2000)
    # Ray starts its workers with C's stdout unbuffered, but a C library's stdout on a pipe is normally fully
    # buffered (glibc's default): make it so, with a buffer kept alive in the workers' namespace.
    setup = (
        "import ctypes\nlibc = ctypes.CDLL(None)\nc_stdout = ctypes.c_void_p.in_dll(libc, 'stdout')\n"
        "c_stdout_buf = ctypes.create_string_buffer(1 << 16)\n"
        "libc.fflush(None)\nlibc.setvbuf(c_stdout, c_stdout_buf, 0, 1 << 16)\n"  # 0: _IOFBF
    )
    code = (
        "import os\n"
        "os.write(1, ''.join(f'fd line {i}\\n' for i in range(5000)).encode())\n"
        "libc.printf(b'printf tail %d\\n', rank)\n"  # stays in libc's buffer unless something flushes it
    )
    assert shared.run(setup, stream=False).ok
    try:
        for _ in range(3):
            res = shared.run(code, stream=False)
            assert res.ok, res.failures
            for r in (0, 1):
                out = res.outputs[r]
                assert sum(line.startswith("fd line") for line in out) == 5000
                assert out[-1] == f"printf tail {r}"
            after = shared.run("1", stream=False)
            assert not any(after.outputs.get(r) for r in (0, 1)), after.outputs
    finally:
        shared.run("libc.fflush(None)\nlibc.setvbuf(c_stdout, None, 2, 0);\n", stream=False)  # 2: _IONBF


def test_progress_bar_redraws_are_shown_while_the_cell_runs(shared):
    got: list[tuple[float, str]] = []
    code = (
        "import time\n"
        "for i in range(25):\n"
        "    print(f'\\rstep {i}', end='', flush=True)\n"
        "    time.sleep(0.1)\n"
        "print()\n"
    )
    res = shared.run(code, ranks=[0], sink=lambda s: got.append((time.monotonic(), s)))
    ended = time.monotonic()
    assert res.ok
    live = [(t, s) for t, s in got if not s.endswith("\n")]
    assert len({s for _, s in live}) >= 3, got
    assert all(s.startswith("\r[rank 0] step ") for _, s in live)
    assert live[0][0] < ended - 1.0  # shown while the cell still ran
    assert got[-1][1] == "\r[rank 0] step 24\n"  # the line's final state replaces the live one
    assert res.outputs[0] == ["step 24"]


def test_live_redraws_are_rate_limited_and_never_captured():
    sink: list[str] = []
    streamer = Streamer(RankLog(), sink.append, live_interval=60)
    streamer.feed(0, "\r 10%")
    streamer.feed(0, "\r 20%")  # within the interval: not shown
    streamer.feed(1, "log line\n")
    streamer.feed(0, "\r 30%\r100%\n")
    assert sink == ["\r[rank 0]  10%", "\r[rank 1] log line\n", "[rank 0] 100%\n"]
    assert streamer.captured == {1: ["log line"], 0: ["100%"]}
    log = RankLog()
    log.feed(0, "a\rb\r")
    assert log.flush(0) == ["b"]  # the final state of an unfinished line, as for finished ones


def test_many_lines_at_once_are_one_write_to_the_sink():
    # a cell printing 200,000 lines took 150 s in a kernel: one sink write (a flush: one message to the browser)
    # per line; what arrives in one drain goes out in one write
    sink: list[str] = []
    streamer = Streamer(RankLog(), sink.append, live_interval=60)
    streamer.feed(0, "".join(f"{i}\n" for i in range(1000)))
    streamer.feed(1, "a\nb\npartial")
    streamer.finish(1)
    assert sink == [
        "".join(f"[rank 0] {i}\n" for i in range(1000)),
        "[rank 1] a\n[rank 1] b\n",
        "[rank 1] partial\n",
    ]
    assert streamer.captured[0] == [str(i) for i in range(1000)] and streamer.captured[1] == [
        "a",
        "b",
        "partial",
    ]
    streamer.feed(0, "\r 50%")  # a live redraw is still replaced by the next complete lines
    streamer.feed(0, "\r100%\nnext\n")
    assert sink[-2:] == ["\r[rank 0]  50%", "\r[rank 0] 100%\n[rank 0] next\n"]


# ---- 5. stopping the group under a running cell -----------------------------------------------------------
def test_stopping_the_group_while_a_cell_runs_ends_the_cell_without_a_rebuild(ray_session):
    group = WorkerGroup(2, cpus_per_worker=0.5)
    group.start()
    generation, prefix = group.generation, f"gpu_notebook:{group.group_id}:"
    timer = threading.Timer(1.5, group.stop)
    timer.start()
    t0 = time.monotonic()
    try:
        res = group.run("import time\nprint('sleeping', flush=True)\ntime.sleep(60)\n")
    finally:
        timer.join()
        group.stop()
    assert time.monotonic() - t0 < 20
    assert [(f.rank, f.kind) for f in res.failures] == [(0, "stopped"), (1, "stopped")]
    assert "cluster stopped" in res.failures[0].detail
    assert res.note.startswith("Cluster stopped") and "rebuilt" not in res.note
    assert group.generation == generation and group.workers == []
    deadline = time.monotonic() + 10
    while True:
        names = [a["name"] for a in ray_session.util.list_named_actors(all_namespaces=True)]
        left = [n for n in names if n.startswith(prefix)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert left == []


# ---- 7. collectives left out of step by a failed rank ------------------------------------------------------
def test_a_collective_a_failed_rank_never_joined_resets_the_group_instead_of_pairing_wrongly(ip, shared):
    """Rank 0 starts an all_reduce and finishes its cell (as every NCCL rank does: collectives are asynchronous);
    rank 1 raised before joining it. Left alone, the next cell's all_reduce on rank 1 would be paired with rank
    0's leftover one: wrong sums, then a hang. The ranks' collective counts differ, so the group is rebuilt."""
    import re

    assert ip.run_cell("%%distributed\nkept = 'yes'\n").success
    pids = [w.pid for w in shared.status().workers]
    # a failure that leaves no collective behind keeps the workers and their state
    res = ip.run_cell("%%distributed\nif rank == 1:\n    raise ValueError('no collective here')\n")
    text = "\n".join(res.error_in_exec._render_traceback_())
    assert "ValueError: no collective here" in text and "Worker state" not in text
    assert [w.pid for w in shared.status().workers] == pids

    res = ip.run_cell(
        "%%distributed\nimport torch, torch.distributed as dist\n"
        "if rank == 1:\n    raise RuntimeError('rank 1 fails before the all_reduce')\n"
        "pending = dist.all_reduce(torch.ones(1), async_op=True)\n"
    )
    err = res.error_in_exec
    assert err is not None and err.ranks == [1]
    text = "\n".join(err._render_traceback_())
    assert "rank 1: RuntimeError: rank 1 fails before the all_reduce" in text
    m = re.search(r"collectives are out of step \(collectives issued, rank 0: (\d+), rank 1: (\d+)\)", text)
    assert m and int(m.group(1)) == int(m.group(2)) + 1, text
    assert "Worker state was reset" in text
    assert set(w.pid for w in shared.status().workers).isdisjoint(pids)
    # the fresh group's collectives pair up: every rank gets the right sum
    res = ip.run_cell(
        "%%distributed -o s\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1); dist.all_reduce(t); (t.item(), 'kept' in dir())\n"
    )
    assert res.success and list(ip.user_ns["s"]) == [(2.0, False), (2.0, False)]


def test_the_collective_count_check_by_backend():
    """NCCL counts only collectives: checked after every cell. gloo counts send/recv too (a pipeline's ranks
    differ legitimately): checked only after a cell in which a rank failed."""
    from gpu_notebook.distributed._recovery import out_of_step
    from gpu_notebook.distributed._results import RankFailure

    seqs = {0: 4, 1: 5, 2: 4}
    assert out_of_step(seqs, 3, "gloo", {}) == ""
    assert out_of_step(seqs, 3, "gloo", {1: RankFailure(rank=1, kind="value")}) == ""  # the cell finished
    msg = out_of_step(seqs, 3, "gloo", {1: RankFailure(rank=1, kind="error")})
    assert "rank 1: 5, ranks 0,2: 4" in msg
    assert "out of step" in out_of_step(seqs, 3, "nccl", {})
    assert out_of_step({0: 4, 1: 4, 2: 4}, 3, "nccl", {1: RankFailure(rank=1, kind="error")}) == ""
    # a rank without a count (no group, or it died): no verdict
    assert out_of_step({0: 4, 1: 5}, 3, "nccl", {}) == ""


def test_output_is_fetched_less_often_while_the_ranks_print_nothing(shared):
    """Each drain is a call into every rank (CPU taken from training on a small machine): while the ranks print
    nothing the drains back off from every 0.1 s to every 0.5 s, and output after a quiet spell still arrives
    while the cell runs."""
    from gpu_notebook.distributed._group import DRAIN_MAX_S, DRAIN_MIN_S

    group = shared.group
    calls: list[tuple[float, int]] = []
    orig = group._drain

    def counting(*a, **k):
        got = orig(*a, **k)
        calls.append((time.monotonic(), got))
        return got

    seen: list[tuple[float, str]] = []
    group._drain = counting
    try:
        t0 = time.monotonic()
        res = shared.run(
            "import time\ntime.sleep(3)\nprint('after the quiet spell', flush=True)\ntime.sleep(1.5)\n",
            sink=lambda line: seen.append((time.monotonic(), line)),
        )
    finally:
        del group._drain
    assert res.ok, res.failures
    quiet = [t for t, _ in calls if t - t0 < 2.9]
    assert len(quiet) <= 12, len(quiet)  # 0.1 s drains for 3 s would be about 30
    arrived = [t for t, line in seen if "after the quiet spell" in line]
    assert arrived and arrived[0] - t0 < 3 + DRAIN_MAX_S + 0.6  # live, not at the end of the cell (4.5 s)
    assert DRAIN_MIN_S == 0.1
