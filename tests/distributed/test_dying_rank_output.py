"""What a rank printed just before its process died reaches the cell, the death report and the logs; the
"last output" of a report holds only the failing cell's lines (real ranks of the shared gloo cluster).

A rank's output sat in an in-process buffer until the driver's next drain (every 0.1-0.5 s), so a print
followed at once by ``os._exit`` or a segfault was lost with the process.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(180)


def _report(res) -> str:
    err = res.error_in_exec
    assert err is not None, "the cell should have failed"
    return "\n".join(err._render_traceback_())


def test_a_print_just_before_os_exit_reaches_the_cell_the_report_and_the_logs(ip, shared, capsys):
    capsys.readouterr()
    res = ip.run_cell(
        "%%distributed\nimport os\nif rank == 1:\n    print('last words', flush=True)\n    os._exit(3)\n"
    )
    text = _report(res)
    out = capsys.readouterr()
    assert "[rank 1] last words" in out.out + out.err  # streamed with the cell
    assert "--- rank 1: died:" in text
    assert "    | last words" in text  # the death report's last output
    assert "last words" in shared.logs(1)[1]  # %gpu_cluster logs
    assert shared.world_size == 2  # rebuilt after the death


def test_a_segfault_reports_where_it_happened_and_what_the_rank_printed(ip, shared, capsys):
    capsys.readouterr()
    res = ip.run_cell(
        "%%distributed\nimport ctypes\nif rank == 1:\n    print('before the crash', flush=True)\n"
        "    ctypes.string_at(0)\n"
    )
    text = _report(res)
    out = capsys.readouterr()
    assert "[rank 1] before the crash" in out.out + out.err
    assert "--- rank 1: died:" in text
    assert "Segmentation fault" in text  # faulthandler's word, not only Ray's "the actor died"
    assert "line 5" in text  # the cell line that crashed
    assert "    | before the crash" in text
    assert "before the crash" in shared.logs(1)[1]
    assert shared.world_size == 2


def test_a_timeout_report_shows_only_this_cells_output(ip, shared):
    res = ip.run_cell("%%distributed\nprint('printed by an earlier cell')\n")
    assert res.success
    res = ip.run_cell(
        "%%distributed --timeout 1\nimport time\nprint('printed by this cell')\n"
        "for _ in range(300):\n    time.sleep(0.05)\n"
    )
    text = _report(res)
    assert "Timeout" in text
    assert "    | printed by this cell" in text
    assert "printed by an earlier cell" not in text
    res = ip.run_cell("%%distributed -o alive\n1\n")  # interrupted, not rebuilt: the workers go on
    assert res.success and list(ip.user_ns["alive"]) == [1, 1]


def test_the_log_gives_the_lines_after_a_mark_whoever_drained_them():
    from gpu_notebook.distributed import RankLog

    log = RankLog(max_lines=3)
    log.feed(0, "old 1\nold 2\n")
    mark = log.mark()
    assert log.since(0, mark, 10) == []
    log.feed(0, "new 1\nnew 2\nnew 3\nnew 4\npart")
    assert log.since(0, mark, 10) == ["new 2", "new 3", "new 4", "part"]  # the ring keeps 3 lines
    assert log.since(0, mark, 2) == ["new 4", "part"]
    assert log.since(1, mark, 10) == []
