"""%gpu_cluster and the Cluster object: start/status/stop/scale/list/use/logs, bad arguments, import cost."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from _poll import wait_for

from gpu_notebook import Cluster, get_manager

pytestmark = pytest.mark.timeout(180)


def test_import_is_cheap():
    code = (
        "import sys, gpu_notebook, gpu_notebook.cluster, gpu_notebook.distributed, gpu_notebook.magics\n"
        "from gpu_notebook import Cluster, get_manager\n"
        "heavy = [m for m in ('ray', 'torch', 'boto3', 'pynvml', 'plotly', 'ipywidgets', 'zstandard') "
        "if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_status_shows_nodes_and_workers_as_html_and_text(ip, shared):
    st = shared.status()
    assert st.state == "running" and st.backend == "gloo" and len(st.workers) == 2
    assert [w.rank for w in st.workers] == [0, 1] and all(w.alive for w in st.workers)
    assert all(w.num_cpus == 0.5 for w in st.workers)
    assert len({w.pid for w in st.workers}) == 2
    assert len(st.nodes) >= 1 and st.nodes[0].cpus > 0
    html = st._repr_html_()
    assert "<table" in html and str(st.workers[1].pid) in html
    text = str(st)
    assert "rank" in text and str(st.workers[0].pid) in text and "alive" in text
    bundle = ip.display_formatter.format(st)[0]
    assert str(st.workers[0].pid) in bundle["text/plain"]  # the terminal shell only renders text


def test_other_commands_take_the_cluster_name_as_name_too(ip, shared, capsys):
    res = ip.run_cell(f"%gpu_cluster status --name {shared.name}")
    assert res.success
    out = capsys.readouterr().out
    assert all(str(w.pid) in out for w in shared.status().workers)


def test_status_reports_a_dead_worker(ip, shared):
    import os
    import signal
    import time

    pid = shared.status().workers[1].pid
    os.kill(pid, signal.SIGKILL)
    deadline = time.time() + 30
    while time.time() < deadline:
        st = shared.status()
        if not st.workers[1].alive:
            break
        time.sleep(0.5)
    assert not st.workers[1].alive and st.workers[0].alive
    msg = shared.restart()
    assert "reset" in msg and all(w.alive for w in shared.status().workers)


def test_scale_rebuilds_the_group_and_says_state_was_reset(ip, shared, capsys):
    ip.run_cell("%%distributed\nmarker = 1\n")
    ip.run_cell("%gpu_cluster scale 3")
    out = capsys.readouterr().out
    assert "scaled from 2 to 3" in out and "reset" in out
    assert shared.world_size == 3
    res = ip.run_cell(
        "%%distributed -o w\nimport torch.distributed as dist\n(dist.get_world_size(), 'marker' in dir())\n"
    )
    assert res.success and list(ip.user_ns["w"]) == [(3, False)] * 3
    ip.run_cell("%gpu_cluster scale 2")
    assert shared.world_size == 2


def test_two_clusters_list_and_use(ip, shared, capsys):
    ip.run_cell("%gpu_cluster start --name solo --workers 1 --cpus-per-worker 0.25")
    solo = get_manager().get("solo")
    try:
        assert get_manager().current is solo and solo.world_size == 1
        ip.run_cell("%gpu_cluster list")
        out = capsys.readouterr().out
        assert "* solo" in out and "  shared" in out
        res = ip.run_cell("%%distributed -o ws\nimport torch.distributed as dist\ndist.get_world_size()\n")
        assert list(ip.user_ns["ws"]) == [1]
        ip.run_cell("%gpu_cluster use shared")
        assert get_manager().current is shared
        res = ip.run_cell("%%distributed -o ws\nimport torch.distributed as dist\ndist.get_world_size()\n")
        assert res.success and list(ip.user_ns["ws"]) == [2, 2]
        ip.run_cell(
            "%%distributed --cluster solo -o ws\nimport torch.distributed as dist\ndist.get_world_size()\n"
        )
        assert list(ip.user_ns["ws"]) == [1]
    finally:
        ip.run_cell("%gpu_cluster stop solo")
    out = capsys.readouterr().out
    assert "cluster 'solo' stopped" in out
    assert "current cluster is now 'shared'" in out  # where the next %%distributed runs: said, not silent
    assert get_manager().get("solo", None) is None
    assert shared.running  # stopping one cluster leaves the shared Ray and the other cluster alone


def test_logs_keep_recent_output_per_rank(ip, shared, capsys):
    ip.run_cell("%%distributed\nfor i in range(5): print('log line', rank, i)\n")
    capsys.readouterr()
    ip.run_cell("%gpu_cluster logs --rank 1 --tail 2")
    out = capsys.readouterr().out.splitlines()
    assert out == ["[rank 1] log line 1 3", "[rank 1] log line 1 4"]
    assert shared.logs(tail=1)[0] == ["log line 0 4"]


def test_output_printed_between_cells_by_a_background_thread_reaches_logs(ip, shared):
    ip.run_cell(
        "%%distributed\nimport threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('late', rank)), daemon=True).start()\n"
    )
    wait_for(lambda: "late 0" in shared.logs(rank=0, tail=5)[0], what="the late line in rank 0's log")


@pytest.mark.parametrize(
    "line,expect",
    [
        ("", "%gpu_cluster needs a command"),
        ("frobnicate", "invalid choice"),
        ("start --workers two", "--workers: expected a whole number of workers"),
        ("start --workers 0", "at least 1"),
        ("scale", "scale takes one argument"),
        ("scale -3", "scale takes one argument"),
        ("use", "use takes one argument"),
        ("use nosuch", "no cluster named 'nosuch'"),
        ("start --address not-an-address", "bad Ray address"),
        ("list extra", "list takes no positional arguments"),
        # an option of another subcommand is refused, not ignored (stop --dry-run used to really stop)
        ("stop --dry-run", "--dry-run does not apply to stop"),
        ("stop --budget 5", "--budget does not apply to stop"),
        ("scale 4 --name x", "--name does not apply to scale"),
        ("status --workers 3", "--workers does not apply to status"),
        ("logs --cloud aws", "--cloud does not apply to logs"),
        ("bench allreduce --tail 3", "--tail does not apply to bench"),
        ("list --all", "--all does not apply to list"),
        # --name names the cluster for the other commands too (stop --name big used to stop the current one)
        ("status --name nosuch", "no cluster named 'nosuch'"),
        ("stop --name nosuch", "no cluster named 'nosuch'"),
        ("stop a --name b", "the cluster named twice"),
    ],
)
def test_bad_gpu_cluster_arguments_fail_the_cell_not_with_a_traceback(ip, shared, capsys, line, expect):
    res = ip.run_cell(f"%gpu_cluster {line}")
    assert not res.success and res.error_in_exec is not None  # Run All stops here
    captured = capsys.readouterr()
    assert expect in captured.err + captured.out
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize(
    "cell,expect",
    [
        ("%%distributed --ranks 7\n1\n", "out of range"),
        ("%%distributed --ranks x\n1\n", "bad rank selection"),
        ("%%distributed --targets 7\n1\n", "out of range"),
        ("%%distributed --workers 1\n1\n", "to choose ranks use --ranks"),
        ("%%distributed --timeout soon\n1\n", "--timeout: expected a positive number of seconds"),
        ("%%distributed --bogus\n1\n", "unrecognized arguments"),
        ("%gpu_push", "the following arguments are required"),
        ("%gpu_push not_defined_anywhere", "not defined in the notebook"),
        ("%gpu_pull x --rank 9", "out of range"),
        ("%gpu_pull", "the following arguments are required"),
    ],
)
def test_bad_distributed_arguments_fail_the_cell_not_with_a_traceback(ip, shared, capsys, cell, expect):
    res = ip.run_cell(cell)
    assert res.error_in_exec is not None
    captured = capsys.readouterr()
    assert expect in captured.err + captured.out
    assert "Traceback" not in captured.err + captured.out


def test_running_the_start_cell_again_does_not_start_a_second_cluster(ip, shared, capsys):
    # a student re-running the start cell (or Run All) got a second cluster 'shared-2'/'local-2' next to the
    # first, taking its CPUs, and the first one's workers were silently no longer the current ones
    before = [c.name for c in get_manager().list()]
    res = ip.run_cell("%gpu_cluster start --workers 1 --cpus-per-worker 0.25")
    assert res.error_in_exec is not None  # nothing started: the cells after it do not run
    captured = capsys.readouterr()
    err = captured.err + captured.out
    assert "cluster 'shared' is already running (2 workers" in err and "nothing was started" in err
    assert "--name NAME" in err and "%gpu_cluster scale N" in err
    assert [c.name for c in get_manager().list()] == before and get_manager().current is shared


def test_usage_errors_name_the_help_that_exists(ip, shared, capsys):
    # "Try %distributed? for help." answered "Object `%distributed` not found": it is a cell magic
    ip.run_cell("%%distributed --bogus\n1\n")
    assert "Try %%distributed? for help." in capsys.readouterr().err
    ip.run_cell("%%distributed --ranks 7\n1\n")
    assert "Try %%distributed? for help." in capsys.readouterr().err
    ip.run_cell("%gpu_push")
    assert "Try %gpu_push? for help." in capsys.readouterr().err
    assert "bench: allreduce or scaling" in ip.find_line_magic("gpu_cluster").__doc__


def test_a_notebook_variable_used_on_the_workers_says_to_push_it(ip, shared):
    from gpu_notebook.distributed import DistributedError

    ip.user_ns["only_in_the_notebook"] = 0.1
    res = ip.run_cell("%%distributed\nprint(only_in_the_notebook)\n")
    assert isinstance(res.error_in_exec, DistributedError)
    text = str(res.error_in_exec)
    assert "NameError: name 'only_in_the_notebook' is not defined" in text
    assert "defined in the notebook, not on the workers" in text and "%gpu_push only_in_the_notebook" in text
    res = ip.run_cell("%%distributed\nprint(defined_nowhere_at_all)\n")
    assert "%gpu_push" not in str(res.error_in_exec)  # a plain typo gets no wrong advice


def test_help_is_generated_from_the_arguments(ip):
    doc = ip.find_line_magic("gpu_cluster").__doc__
    assert "--cpus-per-worker" in doc and "start,status,stop,scale,list,use" in doc
    assert "In [1]: %gpu_cluster start" in doc
    assert "--no-stream" in ip.find_cell_magic("distributed").__doc__


def test_no_cluster_gives_a_clear_message(ip, capsys, fresh_manager):
    res = ip.run_cell("%%distributed\n1\n")
    assert res.error_in_exec is not None
    captured = capsys.readouterr()
    assert "no cluster is running" in captured.err + captured.out


def test_unplaceable_workers_fail_with_advice(ray_session):
    from gpu_notebook.distributed import GroupError, GroupTimeouts

    c = Cluster(name="toobig", workers=2, cpus_per_worker=64, timeouts=GroupTimeouts(placement=3))
    with pytest.raises(GroupError, match="cannot grow: use --cpus-per-worker 4"):  # 8 CPUs in all
        c.start()
    assert get_manager().get("toobig", None) is None


def test_the_cluster_is_a_context_manager(ray_session):
    with Cluster(name="ctx", workers=1, cpus_per_worker=0.25) as c:
        assert c.running and c.call(lambda: 40 + 2) == [42]
        assert "ctx" in repr(c)
    assert c.state == "stopped" and get_manager().get("ctx", None) is None


SCRIPT_EXIT = textwrap.dedent(
    """
    import json, logging, sys
    import psutil
    from gpu_notebook import Cluster
    c = Cluster(workers=2, cpus_per_worker=0.5).start()
    import ray
    # every process this kernel started, Ray's daemons (GCS, raylet, dashboard, log monitor) and their workers
    procs = [
        {"pid": p.pid, "created": p.create_time(), "cmd": " ".join(p.cmdline())[:300]}
        for p in psutil.Process().children(recursive=True)
    ]
    session = ray._private.worker._global_node.get_session_dir_path()
    print(json.dumps({"pids": [w.pid for w in c.status().workers], "started": c.started_ray,
                      "procs": procs, "session": session}), flush=True)
    # no stop(): the process exits and must take the workers and its local Ray with it
    """
)


def test_a_cluster_we_started_is_stopped_when_the_kernel_exits(tmp_path):
    import json
    import os
    import time

    import psutil

    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TMPDIR="/tmp")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT_EXIT], capture_output=True, text=True, env=env, timeout=150
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["started"] is True and len(info["pids"]) == 2
    procs = info["procs"]
    cmds = " ".join(p["cmd"] for p in procs)
    # the list holds what we must see go: Ray's own daemons and both workers (else the check below proves nothing)
    assert "gcs_server" in cmds and "raylet" in cmds, cmds
    assert set(info["pids"]) <= {p["pid"] for p in procs}

    def left() -> list[str]:
        alive = [p["cmd"] for p in procs if _same_process_alive(p["pid"], p["created"])]
        for p in psutil.process_iter(["pid", "cmdline"]):  # anything else still running in its session dir
            cmd = " ".join(p.info["cmdline"] or [])
            if info["session"] in cmd and _same_process_alive(p.pid, None):
                alive.append(cmd)
        return alive

    deadline = time.time() + 30
    while time.time() < deadline and left():
        time.sleep(0.5)
    assert left() == []


def _same_process_alive(pid: int, created: float | None) -> bool:
    """``pid`` runs and is not a zombie (nor another process that reused the pid, when ``created`` is given)."""
    import psutil

    try:
        p = psutil.Process(pid)
        if created is not None and abs(p.create_time() - created) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_interrupting_a_start_releases_what_it_reserved(ray_session):
    import _thread
    import threading

    from ray.util.placement_group import placement_group, remove_placement_group

    from gpu_notebook.distributed import GroupError, WorkerGroup

    # every free CPU held (as by another notebook): the group fits the cluster, not what is free, so it waits
    holder = placement_group([{"CPU": ray_session.available_resources()["CPU"]}])
    ray_session.get(holder.ready(), timeout=30)
    try:
        group = WorkerGroup(2, cpus_per_worker=1)
        timer = threading.Timer(1.0, _thread.interrupt_main)
        timer.start()
        with pytest.raises(GroupError, match="interrupted; nothing was left running"):
            group.start()
        timer.cancel()
    finally:
        remove_placement_group(holder)
    assert group.placement.reservation is None and group.actors == []
    states = {
        v["state"]
        for v in ray_session.util.placement_group_table().values()
        if v["name"].startswith(f"gpu_notebook-{group.group_id}-")
    }
    assert "PENDING" not in states and "CREATED" not in states


SCRIPT_INTERRUPT_START = textwrap.dedent(
    """
    import json, os, signal, sys, threading, time
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "gpu_notebook")

    def cmdline(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return f.read().replace(b"\\0", b" ").decode(errors="replace")
        except OSError:
            return ""

    def children():  # alive (not zombie) direct children of this process
        out = set()
        for e in os.listdir("/proc"):
            try:
                with open(f"/proc/{e}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.add(int(e))
        return out

    before = children()

    def ray_children():
        return [p for p in children() - before if "ray" in cmdline(p)]

    def interrupt_once_ray_runs():  # the stop button (SIGINT) while ray.init is starting Ray's processes
        while not ray_children():
            time.sleep(0.02)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_ray_runs, daemon=True).start()
    ip.run_cell("%gpu_cluster start --workers 1 --cpus-per-worker 0.5")
    time.sleep(0.5)
    import ray
    from gpu_notebook import get_manager
    print("RESULT " + json.dumps({"left": [cmdline(p)[:80] for p in ray_children()],
                                  "initialized": ray.is_initialized(), "clusters": len(get_manager().list())}))
    """
)


def test_interrupting_a_local_ray_start_leaves_no_ray_processes_and_says_so():
    # Ctrl-C during ray.init printed 100 lines of Ray's frames and left the GCS, dashboard and raylet (with its
    # workers, ~700 MB) running until the kernel exited; every further interrupted start added another set
    import json
    import os

    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", TMPDIR="/tmp")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT_INTERRUPT_START], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(
        [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1][len("RESULT ") :]
    )
    assert result == {"left": [], "initialized": False, "clusters": 0}, result
    assert "interrupted: the cluster was not started" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr + proc.stdout
