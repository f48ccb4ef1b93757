"""The shared formatters of gpu_notebook._display: one for bytes, durations, rank lists and progress stamps."""

import re

from gpu_notebook._display import (
    fmt_bytes,
    fmt_duration,
    format_ranks,
    rank_label,
    stage_printer,
    stamp,
)
from gpu_notebook.cluster._errors import ClusterError, not_running


def test_fmt_bytes_decimal_binary_and_a_pinned_unit():
    assert fmt_bytes(999) == "999 B" and fmt_bytes(1500) == "1.5 KB"
    assert fmt_bytes(3 * 2**30, binary=True) == "3.0 GiB" and fmt_bytes(512, binary=True) == "512 bytes"
    assert fmt_bytes(20_000, unit="MB") == "0.0 MB" and fmt_bytes(12_345_678, unit="MB") == "12.3 MB"
    assert fmt_bytes(3 * 2**19, unit="MiB") == "1.5 MiB"


def test_fmt_duration_cuts_or_rounds_up_and_can_always_show_minutes():
    assert [fmt_duration(s) for s in (0, 45.9, 185, 7830)] == ["0s", "45s", "3m05s", "2h10m"]
    assert fmt_duration(45.1, round_up=True) == "46s" and fmt_duration(59.5, round_up=True) == "1m00s"
    assert fmt_duration(30, minutes=True) == "0m30s" and fmt_duration(3900, minutes=True) == "1h05m"
    assert fmt_duration(-5) == "0s" and fmt_duration(-5, round_up=True) == "0s"


def test_rank_lists_and_labels():
    assert format_ranks([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and format_ranks([3]) == "3"
    assert rank_label([3]) == "rank 3" and rank_label([2, 0, 1]) == "ranks 0-2"


def test_progress_lines_carry_the_elapsed_time(capsys):
    assert stamp(3.21, "connecting") == "[   3.2s] connecting"
    say = stage_printer()
    say("starting workers")
    assert re.fullmatch(r"\[\s+\d+\.\ds\] starting workers\n", capsys.readouterr().out)


def test_the_not_running_error_names_the_cluster():
    err = not_running("local")
    assert isinstance(err, ClusterError)
    assert str(err) == "cluster 'local' is not running: start it with %gpu_cluster start"
    assert str(not_running("")) == "cluster '?' is not running: start it with %gpu_cluster start"
