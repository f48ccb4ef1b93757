"""``%gpu_monitor stop`` stops a ``--local`` monitor running next to the current cluster's, and says which it
stopped (it said "stopped", or "No GPU monitor is running", while the local one kept sampling)."""

from __future__ import annotations

import pytest

from gpu_notebook.monitor import running_monitor

pytestmark = pytest.mark.timeout(60)


def test_a_plain_stop_stops_a_local_monitor_too_and_says_which(ip, shared, capsys):
    ip.run_line_magic("gpu_monitor", "snapshot --local")  # a monitor of this machine, next to the cluster
    local = running_monitor(local=True)
    assert local is not None and local.started
    capsys.readouterr()
    ip.run_line_magic("gpu_monitor", "stop")
    out = capsys.readouterr().out
    assert not local.started and running_monitor(local=True) is None
    assert "GPU monitor stopped." in out and "this machine" in out
    ip.run_line_magic("gpu_monitor", "stop")
    assert "No GPU monitor is running." in capsys.readouterr().out


def test_stop_local_leaves_the_clusters_monitor(ip, shared, capsys):
    ip.run_line_magic("gpu_monitor", "snapshot")  # the cluster's
    ip.run_line_magic("gpu_monitor", "snapshot --local")
    capsys.readouterr()
    ip.run_line_magic("gpu_monitor", "stop --local")
    assert "Stopped: this machine." in capsys.readouterr().out
    assert running_monitor(local=True) is None
    mon = running_monitor()
    assert mon is not None and mon.cluster is shared
    ip.run_line_magic("gpu_monitor", "stop")
    assert "cluster 'shared'" in capsys.readouterr().out and running_monitor() is None
