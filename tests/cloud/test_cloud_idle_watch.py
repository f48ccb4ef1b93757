"""The head-node idle auto-stop: when it decides to tear down, and that it never does so on an error."""

from __future__ import annotations

from gpu_notebook.cloud._idle_watch import IdleTracker, main, run


def test_tracker_needs_continuous_idleness():
    t = IdleTracker(minutes=10)
    assert t.update(busy=False, now=0) is False
    assert t.update(busy=False, now=599) is False
    assert t.update(busy=True, now=600) is False  # activity resets the clock
    assert t.update(busy=False, now=610) is False
    assert t.update(busy=False, now=1209) is False
    assert t.update(busy=False, now=1210) is True


def _clock(step):
    now = [0.0]

    def clock():
        now[0] += step
        return now[0]

    return clock


def test_run_tears_down_after_the_idle_period():
    torn = []
    done = run(
        1,
        "~/cfg.yaml",
        busy=lambda: False,
        teardown=torn.append,
        clock=_clock(30),
        sleep=lambda s: None,
        max_polls=100,
    )
    assert done is True and torn == ["~/cfg.yaml"]


def test_run_keeps_a_busy_cluster():
    torn = []
    assert (
        run(
            1,
            "c",
            busy=lambda: True,
            teardown=torn.append,
            clock=_clock(30),
            sleep=lambda s: None,
            max_polls=50,
        )
        is False
    )
    assert torn == []


def test_errors_count_as_busy():
    def broken():
        raise ConnectionError("GCS unreachable")

    torn = []
    assert (
        run(1, "c", busy=broken, teardown=torn.append, clock=_clock(60), sleep=lambda s: None, max_polls=20)
        is False
    )
    assert torn == []


def test_cli_requires_minutes(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main([])
    assert "--minutes" in capsys.readouterr().err


# -- what counts as use, on a real Ray ----------------------------------------------------------------------------
def test_reservations_are_summed_from_our_placement_groups_only():
    from gpu_notebook.cloud._idle_watch import Activity, held_by_others, our_reservations

    table = {
        "a": {"name": "gpu_notebook-g1-1", "state": "CREATED", "bundles": {0: {"CPU": 0.5}, 1: {"CPU": 0.5}}},
        "b": {"name": "gpu_notebook-g2-1", "state": "REMOVED", "bundles": {0: {"CPU": 4.0}}},
        "c": {"name": "someone-else", "state": "CREATED", "bundles": {0: {"CPU": 1.0, "GPU": 1.0}}},
    }
    ours = our_reservations(table)
    assert ours == {"CPU": 1.0, "GPU": 0.0}
    others = held_by_others({"CPU": 2.0, "GPU": 1.0}, {"CPU": 0.0, "GPU": 0.0}, ours)
    assert others == {"CPU": 1.0, "GPU": 1.0}
    assert Activity(held_by_others=others).busy
    assert not Activity(utilisation=4.0, kind="gpu").busy and Activity(utilisation=5.0, kind="gpu").busy
    assert not Activity(utilisation=9.0, kind="cpu").busy and Activity(utilisation=10.0, kind="cpu").busy


def test_idle_workers_and_samplers_are_not_use_but_a_cell_and_a_users_task_are(shared, ray_session, tmp_path):
    """The shared cluster's two workers hold their CPUs for good and a monitor runs samplers on the node: that is
    idle (the old ray_busy() called it busy forever); a running cell, or a user's own task holding a CPU, is not."""
    import threading
    import time

    from gpu_notebook.cloud._idle_watch import activity, ray_busy, utilisation_monitor

    def hold(release: str) -> None:
        """The user's work: runs until the test, having seen it, releases it (on any machine's speed)."""
        import os
        import time

        deadline = time.monotonic() + 60
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)

    ray = ray_session
    mon = utilisation_monitor(interval=0.2)
    try:
        assert mon.nodes, mon.failed_nodes
        deadline = time.monotonic() + 120  # the samplers' first rows (a loaded machine may take a while)
        idle = activity(mon, window_s=30)
        while idle.utilisation is None and time.monotonic() < deadline:
            time.sleep(0.5)
            idle = activity(mon, window_s=30)
        assert idle.cells_running == 0 and not any(idle.held_by_others.values()), idle
        assert idle.kind == "cpu" and idle.utilisation is not None  # sampled (this shared machine's CPU)
        assert not activity(None).busy and not ray_busy()

        started = threading.Event()

        cell_done = tmp_path / "cell-done"

        def cell():
            started.set()
            shared.call(hold, str(cell_done))

        t = threading.Thread(target=cell)
        t.start()
        try:
            started.wait(10)
            deadline = time.monotonic() + 30
            while activity(None).cells_running < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert activity(None).cells_running >= 2 and ray_busy()
        finally:
            cell_done.touch()
            t.join(60)
        assert not ray_busy()

        task_done = tmp_path / "task-done"
        ref = ray.remote(num_cpus=1)(hold).remote(str(task_done))
        try:
            deadline = time.monotonic() + 30
            while not ray_busy() and time.monotonic() < deadline:
                time.sleep(0.1)
            act = activity(None)
            assert act.held_by_others.get("CPU") == 1.0 and act.busy, act
        finally:
            task_done.touch()
        ray.get(ref)
    finally:
        mon.stop()


def test_busy_gpus_are_use(ray_session):
    """With GPUs (fake NVML in the samplers), the busiest GPU decides; the CPU-only head does not count."""
    import functools

    from gpu_notebook.cloud._idle_watch import activity, utilisation_monitor
    from gpu_notebook.testing.nvml import FakeNVML

    for util, busy in ((60, True), (2, False)):
        mon = utilisation_monitor(interval=0.2, nvml=functools.partial(FakeNVML.from_specs, [{"util": util}]))
        try:
            import time

            deadline = time.monotonic() + 30
            while mon.aggregator.rows_in < 3 and time.monotonic() < deadline:
                time.sleep(0.1)
            act = activity(mon, window_s=10)
            assert act.kind == "gpu" and act.utilisation == util and act.busy is busy, act
        finally:
            mon.stop()
