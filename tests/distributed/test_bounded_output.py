"""A cell that prints a million lines keeps only a small, configured number of them in the kernel (its first
and last lines, saying how many were dropped between), and ``%gpu_cluster logs`` says what its ring dropped
(real ranks of the shared gloo cluster).

Every line a running cell printed stayed in the kernel's memory until the cell ended, so a cell printing for
hours grew the kernel without bound.
"""

from __future__ import annotations

import pytest

from gpu_notebook.distributed._output import KeptLines, RankLog, Streamer

pytestmark = pytest.mark.timeout(240)

# in 20 writes of 50,000 lines, a moment apart: the notebook drains them as they come (a rank's own buffer
# drops the oldest past 8 MB between two drains, which one write of 12 MB would reach at once)
_MILLION = (
    "import sys, time\n"
    "for chunk in range(20):\n"
    "    sys.stdout.write(''.join(f'line {chunk * 50_000 + i}\\n' for i in range(50_000)))\n"
    "    time.sleep(0.05)\n"
    "print('the end')\n"
)


def test_a_million_printed_lines_stay_under_the_configured_cap(ip, shared, capsys, monkeypatch):
    monkeypatch.setenv("GPU_NOTEBOOK_OUTPUT_LINES", "200")
    shared.log.clear()  # the ring's count of dropped lines is then this cell's
    try:
        result = shared.run(_MILLION, stream=False)
        assert result.ok, result.failures
        for rank in (0, 1):
            lines = result.outputs[rank]
            assert len(lines) <= 201  # 100 first, 100 last, one marker
            assert sum(map(len, lines)) < 20_000  # bytes kept, not a million lines' 12 MB
            assert lines[:2] == ["line 0", "line 1"] and lines[-2:] == ["line 999999", "the end"]
            (marker,) = [line for line in lines if "dropped" in line]
            assert marker.startswith("... 999,801 lines dropped")
            assert len(shared.log.tail(rank)) <= shared.log.max_lines + 1  # the ring, and its "dropped" line
        capsys.readouterr()
        ip.run_line_magic("gpu_cluster", "logs --tail 3")
        out = capsys.readouterr().out
        assert f"[rank 0] ... {1_000_001 - shared.log.max_lines:,} earlier lines dropped" in out
        assert "[rank 1] the end" in out
    finally:
        shared.log.clear()  # later tests of the shared cluster read their own lines from its log


def test_kept_lines_keep_head_and_tail_and_count_what_they_dropped():
    kept = KeptLines(4)
    kept.extend(["a", "b", "c"])
    assert kept.lines() == ["a", "b", "c"]
    kept.extend([str(i) for i in range(10)])
    head, marker, tail = kept.lines()[:2], kept.lines()[2], kept.lines()[3:]
    assert head == ["a", "b"] and tail == ["8", "9"] and marker.startswith("... 9 lines dropped")
    assert len(kept) == 4 and kept.chars() == 4


def test_a_redrawn_line_keeps_only_its_latest_state_and_long_lines_are_cut():
    log = RankLog(max_lines=10)
    streamer = Streamer(log, None, max_lines=10)
    for i in range(10_000):  # a progress bar redrawn for hours, never ended by a newline
        streamer.feed(0, f"\r{i:5d}/10000")
    assert len(log._partial[0]) < 20
    assert log.live(0) == " 9999/10000"
    streamer.feed(0, "\n" + "x" * 50_000 + "\n")
    assert streamer.captured[0][0] == " 9999/10000"
    assert streamer.captured[0][1].endswith("... (40,000 characters dropped)")


def test_the_interrupt_grace_is_read_from_the_environment_and_checked(monkeypatch):
    from gpu_notebook.distributed._group import GroupTimeouts

    monkeypatch.delenv("GPU_NOTEBOOK_INTERRUPT_GRACE", raising=False)
    assert GroupTimeouts().interrupt_grace == 5.0
    monkeypatch.setenv("GPU_NOTEBOOK_INTERRUPT_GRACE", "30")
    assert GroupTimeouts().interrupt_grace == 30.0
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv("GPU_NOTEBOOK_INTERRUPT_GRACE", bad)
        with pytest.raises(
            ValueError, match="GPU_NOTEBOOK_INTERRUPT_GRACE must be a number of seconds above 0"
        ):
            GroupTimeouts()
