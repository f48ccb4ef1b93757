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
