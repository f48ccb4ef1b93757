"""Workshop mode: a teacher's broker on one shared Ray, several student kernels (separate processes) on it.

The pure part checks the quota and cost arithmetic and the broker's policy (idle stop, budget, a gone kernel) on
a simulated clock. The journey runs the teacher in this process (the session's Ray is the shared cluster) and
each student in its own Python process with an IPython shell, as a kernel: one student sets a variable on her
workers, her kernel exits (a restart) and her next kernel reconnects to the same workers (the variable is still
there); one asks for more than the quota and gets a usage error that names it; one kernel is killed (its group
is seen gone, then reclaimed by the idle stop, which the teacher shortens at the end); the teacher's view lists them all and stops the first.
"""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest
from IPython.utils.capture import capture_output

from gpu_notebook.cluster.workshop import (
    Prices,
    Quota,
    Workshop,
    WorkshopError,
    _broker,
    _rules,
    _seat,
    _student,
    catalog_prices,
)
from gpu_notebook.cluster.workshop._broker import Broker, _new_record
from gpu_notebook.cluster.workshop._rules import budget_state, charge, over_quota, within_quota

# ---- pure: the arithmetic and the policy -------------------------------------------------------------------


def test_rules_doctests() -> None:
    for module in (_rules, _broker, _seat, _student):
        result = doctest.testmod(module)
        assert result.failed == 0, module.__name__


def test_quota_message_names_the_quota_and_the_request() -> None:
    msg = over_quota(Quota(cpus=2), 3, {"CPU": 1}, "student 'bob'", "ml101")
    assert msg is not None
    assert "3 worker(s) of 1 CPU each = 3 CPU" in msg and "quota of 2 CPU per student" in msg
    assert "--workers 2 --cpus-per-worker 1" in msg  # what would fit
    gpu = over_quota(Quota(cpus=8, gpus=1), 2, {"CPU": 1, "GPU": 1})
    assert gpu is not None and "= 2 GPU in all" in gpu and "quota of 1 GPU" in gpu
    assert within_quota(Quota(cpus=1), 2, {"CPU": 0.5}) and within_quota(Quota(), 100, {"CPU": 4})
    assert charge({"CPU": 2, "GPU": 1}, Prices(0.05, 2.0), 1800) == pytest.approx(1.05)
    assert [budget_state(s, 10) for s in (7.9, 8.0, 10.0)] == ["ok", "warn", "spent"]


class _CloudCluster:
    """What catalog_prices reads of a launched cloud cluster: its nodes and their prices (USD/h)."""

    name = "gpus"
    cloud_state = object()  # launched
    started_at = None
    created_at = 0.0

    def __init__(self, nodes: list[dict[str, Any]], prices: dict[str, float]) -> None:
        self.nodes = nodes
        self.options = {"node_pricing": prices}

    def ray_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    def add_stop_hook(self, fn: Any) -> None:
        pass


def test_cloud_prices_come_from_the_node_prices() -> None:
    """A node's price shared out per GPU (the head is not a student's); per CPU on CPU-only workers."""
    head = {"NodeID": "h", "Resources": {"CPU": 4, "node:__internal_head__": 1}}
    gpus = _CloudCluster(
        [
            head,
            {"NodeID": "g1", "Resources": {"CPU": 8, "GPU": 2}},
            {"NodeID": "g2", "Resources": {"GPU": 2}},
        ],
        {"h": 0.4, "g1": 8.0, "g2": 8.0},
    )
    prices = catalog_prices(gpus)
    assert prices is not None and prices.gpu_hour == pytest.approx(4.0) and prices.cpu_hour == 0
    cpus = _CloudCluster([head, {"NodeID": "c1", "Resources": {"CPU": 8}}], {"h": 0.4, "c1": 0.8})
    prices = catalog_prices(cpus)
    assert prices is not None and prices.cpu_hour == pytest.approx(0.1) and "catalog" in prices.source
    assert catalog_prices(None) is None


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _holding(broker: Broker, student: str, clock: _Clock, cpus: float) -> dict[str, Any]:
    rec = _new_record(student)
    rec.update(
        state="running",
        job_id=f"job-{student}",
        kernel="alive",
        held={"CPU": cpus, "GPU": 0.0},
        size=1,
        last_activity=clock.t,
        last_seen=clock.t,
        started_at=clock.t,
    )
    broker._records[student] = rec
    return rec


def test_broker_policy_on_a_simulated_clock() -> None:
    """Charged for what is held; idle stop (asked of a live kernel, done at once for a gone one); budget; the
    teacher's stop with its grace period; a reconnect after the kernel left."""
    clock = _Clock()
    settings = dict(budget_usd=1.0, price_cpu_hour=36.0, idle_stop_minutes=1.0, heartbeat_s=1.0, tick_s=3600)
    b = Broker("pure", settings, clock=clock)
    try:
        b._last_tick = clock.t
        alive = _holding(b, "alive", clock, 0.5)
        gone = _holding(b, "gone", clock, 0.5)
        rich = _holding(b, "rich", clock, 1.0)
        for t in range(1, 31):  # 30 s; "alive" and "rich" keep beating, "gone" is never heard from again
            clock.t += 1
            b.heartbeat("alive", "job-alive", t < 5, min(clock.t, 1004.0))  # a cell ran for its first 5 s
            b.heartbeat("rich", "job-rich", True, clock.t)
            b.tick()
        assert alive["spent"] == pytest.approx(30 * 0.5 * 0.01)  # $36/CPU-hour = $0.01/CPU-second
        # silent for 6 beats: seen gone, and kept for a reconnect
        assert gone["kernel"] == "gone" and gone["state"] == "detached"
        assert b.students()[1]["utilisation"] == pytest.approx(0.0)
        assert 0 < [r for r in b.students() if r["student"] == "alive"][0]["utilisation"] < 0.3
        assert rich["state"] == "running" and rich["spent"] == pytest.approx(0.30)
        while alive["state"] == "running" and clock.t < 1100:  # past the idle stop of the two idle ones
            clock.t += 1
            b.heartbeat("alive", "job-alive", False, 0.0)
            b.heartbeat("rich", "job-rich", True, clock.t)  # a cell runs all along: never idle
            b.tick()
        assert 1060 <= clock.t <= 1066  # idle since 1004, for a minute
        assert gone["state"] == "reclaimed" and "kernel gone, then idle for 1 min" in gone["why"]
        assert alive["state"] == "stopping" and alive["why"] == "idle for 1 min"  # its kernel is told
        assert b.heartbeat("alive", "job-alive", False, 0.0) == {"stop": "idle for 1 min"}
        assert b.reserve("alive", "job-alive", 1, {"CPU": 0.5})["kind"] == "busy"  # no new workers meanwhile
        while rich["state"] == "running" and clock.t < 1200:  # $0.01/s: $1 in 100 s
            clock.t += 1
            b.heartbeat("rich", "job-rich", True, clock.t)
            b.tick()
        assert rich["state"] == "stopping" and "budget of $1 is spent" in rich["why"]
        assert rich["spent"] >= 1.0 and clock.t == pytest.approx(1100, abs=2)
        clock.t += 10  # past the grace period: the broker ends them whatever the kernels do
        b.tick()
        assert alive["state"] == "stopped" and rich["state"] == "stopped"
        assert alive["held"] == {"CPU": 0.0, "GPU": 0.0}
        # a new kernel of a student whose group is kept reconnects; another live kernel's group is refused
        kept = _holding(b, "kept", clock, 0.5)
        kept["group"] = {"size": 1}
        b.detach("kept", "job-kept", "kernel exit")
        assert kept["state"] == "detached"
        assert b.join("kept", "job-new")["group"] == {"size": 1}
        # the new kernel takes the workers over slower than the silence limit (6 beats): running, not gone
        clock.t += 10
        b.started("kept", "job-new", {"size": 1})
        b.tick()
        assert kept["state"] == "running" and kept["kernel"] == "alive"
        assert b.stop_student("kept").endswith("(stopped by the teacher)")
        with pytest.raises(KeyError, match="no student 'nobody'"):
            b.stop_student("nobody")
    finally:
        b.shutdown()


# ---- the journey: a teacher and three student kernels on one Ray --------------------------------------------

_KERNEL = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    address, student, mode = sys.argv[1:4]
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gpu_notebook")

    def cell(src):
        with capture_output() as cap:
            res = ip.run_cell(src)
        exc = res.error_in_exec or res.error_before_exec
        out = {"src": src.split(chr(10))[0], "out": cap.stdout + cap.stderr,
               "error": type(exc).__name__ if exc else None, "message": str(exc) if exc else None}
        print("CELL " + json.dumps(out), flush=True)
        return out

    start = f"%gpu_cluster start --address {address} --workshop ws18 --student {student}"
    if mode == "set":  # sets a variable on its workers; its kernel then exits (a restart)
        cell(start + " --workers 2 --cpus-per-worker 0.5")
        cell("%%distributed" + chr(10) + "x = 41" + chr(10) + "print('set', x)")
    elif mode == "greedy":
        cell(start + " --workers 3 --cpus-per-worker 0.5")
    elif mode == "dies":
        cell(start + " --workers 1 --cpus-per-worker 0.5")
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "reconnect":  # the next kernel: its workers still hold x; then it waits for the teacher's stop
        cell(start)
        cell("%%distributed" + chr(10) + "print('got', x + 1)")
        print("WAITING", flush=True)
        from gpu_notebook.cluster import get_manager
        deadline = time.monotonic() + 60
        while get_manager().list() and time.monotonic() < deadline:
            time.sleep(0.2)
        print("LEFT " + json.dumps([c.name for c in get_manager().list()]), flush=True)
    """
)


def _cells(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in stdout.splitlines() if line.startswith("CELL ")]


@pytest.mark.timeout(240)
def test_workshop_journey(ray_session, ip, tmp_path) -> None:
    script = tmp_path / "kernel.py"
    script.write_text(_KERNEL)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    address = ray_session.get_runtime_context().gcs_address

    procs: list[subprocess.Popen[str]] = []

    def kernel(student: str, mode: str) -> subprocess.Popen[str]:
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), address, student, mode],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
        return procs[-1]

    with capture_output() as cap:
        res = ip.run_cell(
            "%gpu_cluster workshop start ws18 --quota-cpus 1 --budget 5 --price-cpu-hour 36 --idle-stop 5"
        )
    assert res.error_in_exec is None, cap.stdout + cap.stderr
    ws = Workshop.connect("ws18")
    t0 = time.monotonic()
    try:
        assert "workshop 'ws18' ready: quota 1 CPU per student, budget $5 per student" in cap.stdout
        assert f"%gpu_cluster start --address {address} --workshop ws18 --student THEIR_ID" in cap.stdout
        ray_session.get(ws.broker.configure.remote({**ws.settings(), "heartbeat_s": 0.5, "tick_s": 0.5}))
        kernels = {
            "alice": kernel("alice", "set"),
            "bob": kernel("bob", "greedy"),
            "carol": kernel("carol", "dies"),
        }
        outs = {k: p.communicate(timeout=150) for k, p in kernels.items()}
        print(f"three kernels: {time.monotonic() - t0:.1f} s")
        alice, bob = _cells(outs["alice"][0]), _cells(outs["bob"][0])
        assert alice[0]["error"] is None and "[rank 0] set 41" in alice[1]["out"], outs["alice"]
        # over the quota: a usage error naming the quota and what was asked, before any worker started
        assert bob[0]["error"] == "UsageError", outs["bob"]
        assert "asked for 3 worker(s) of 0.5 CPU each = 1.5 CPU in all" in bob[0]["message"]
        assert "over the quota of 1 CPU per student" in bob[0]["message"]
        assert kernels["carol"].returncode == -9
        # alice's kernel exited: her workers are kept; carol's was killed: seen gone, kept until the idle stop
        assert ws.wait_until("alice", ("detached",), 20).kernel == "gone"
        assert ws.wait_until("carol", ("detached",), 20).kernel == "gone"
        nxt = kernel("alice", "reconnect")
        line, seen = "", []
        assert nxt.stdout is not None
        while "WAITING" not in line:
            line = nxt.stdout.readline()
            assert line, nxt.communicate()
            if line.startswith("CELL "):
                seen.append(json.loads(line[5:]))
                assert seen[-1]["error"] is None, seen[-1]
        # the restarted kernel took over the same workers: x is still there on every rank
        assert "reconnected to your worker group (2 worker(s)" in seen[0]["out"], seen[0]
        assert "[rank 0] got 42" in seen[1]["out"] and "[rank 1] got 42" in seen[1]["out"], seen[1]
        # the teacher view: usage, utilisation, cost and state of every student (its kernel seen by the broker
        # again: a heartbeat, every 0.5 s here, may come late on a loaded machine)
        ws.wait_until("alice", ("running",), 20)
        with capture_output() as cap:
            ip.run_cell("%gpu_cluster students --text")
        table = cap.stdout
        assert "alice" in table and "running" in table and "1 CPU" in table, table
        assert "refused: workshop 'ws18': student 'bob' asked for 3 worker(s)" in table, table
        carol_row = next(line for line in table.splitlines() if line.startswith("carol"))
        assert "gone" in carol_row and "kernel gone" in carol_row, table  # kept, or already reclaimed
        info = ws.student("alice")
        assert info.workers == 2 and info.spent_usd > 0 and info.usd_per_hour == pytest.approx(36.0)
        with capture_output() as cap:
            ip.run_cell("%gpu_cluster students stop alice")
        assert "student 'alice': workers stopping (stopped by the teacher)" in cap.stdout, cap.stdout
        out, err = nxt.communicate(timeout=60)
        assert "LEFT []" in out, (out, err)
        assert "cluster 'ws18-alice' stopped: stopped by the teacher" in err, err
        assert ws.wait_until("alice", ("stopped",), 20).why == "stopped by the teacher"
        # carol's kernel died: reclaimed by the idle stop, and the teacher view says so. The teacher shortens the
        # idle stop only now: with a short one from the start, alice's group (idle since her cell) could be
        # reclaimed before her next kernel reconnects, on a slow machine
        fast = {**ws.settings(), "heartbeat_s": 0.5, "tick_s": 0.5, "idle_stop_minutes": 0.05}
        ray_session.get(ws.broker.configure.remote(fast))
        carol = ws.wait_until("carol", ("reclaimed",), 60)
        assert carol.held == "-" and "kernel gone, then idle for 0.05 min" in carol.status
        # the widget: its HTML fallback is the same table
        from gpu_notebook.widgets._students import StudentsWidget

        view = StudentsWidget(ws, autostart=False)
        assert (
            "reclaimed: kernel gone" in view.snapshot_html()
            and "bob" in view._repr_mimebundle_()["text/plain"]
        )
        view.close()
        with capture_output() as cap:  # the live view through the magic: its text fallback is the table
            ip.run_cell("%gpu_cluster students")
        assert "reclaimed: kernel gone" in "".join(o.data.get("text/plain", "") for o in cap.outputs)
        with capture_output() as cap:
            ip.run_cell("%gpu_cluster workshop stop")
        assert "workshop 'ws18' ended: 0 student group(s) stopped" in cap.stdout, cap.stdout + cap.stderr
        print(f"journey: {time.monotonic() - t0:.1f} s")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        try:
            ws.stop()  # when the journey failed before the magic's workshop stop
        except WorkshopError:
            pass
    from ray.util.placement_group import placement_group_table

    left = [g for g in placement_group_table().values() if g["name"].startswith("gpu_notebook-workshop-ws18")]
    assert all(g["state"] == "REMOVED" for g in left), left
