"""A collective on the default group in a cell that runs on some ranks only can never complete (the others
are not in the cell): the rank that calls it fails at once, saying so, and the workers keep their state.

It used to wait for torch.distributed's 30-minute timeout, then the group was rebuilt and every rank's state
was lost.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(120)


def test_an_all_reduce_in_a_cell_on_one_rank_fails_at_once_and_says_why(ip, shared):
    res = ip.run_cell("%%distributed\nkept = rank + 100\n")
    assert res.success
    res = ip.run_cell(
        "%%distributed --ranks 0 --timeout 60\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\n"
    )
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert "all_reduce" in text and "rank 1" in text and "not running this cell" in text
    assert "Timeout" not in text and "rebuilt" not in text
    res = ip.run_cell("%%distributed -o kept\nkept\n")  # nothing was lost
    assert res.success and list(ip.user_ns["kept"]) == [100, 101]


def test_ddp_built_in_a_cell_on_one_rank_fails_at_once(ip, shared):
    res = ip.run_cell(
        "%%distributed --ranks 1 --timeout 60\nimport torch\n"
        "from torch.nn.parallel import DistributedDataParallel as DDP\nm = DDP(torch.nn.Linear(2, 2))\n"
    )
    err = res.error_in_exec
    assert err is not None
    text = "\n".join(err._render_traceback_())
    assert "CollectiveOutsideCellError" in text and "needs rank 0, which is not running this cell" in text
    assert "Timeout" not in text and "rebuilt" not in text


def test_a_subgroup_of_the_cells_ranks_still_works(ip, shared):
    res = ip.run_cell("%%distributed\nimport torch, torch.distributed as dist\nsolo = dist.new_group([0])\n")
    assert res.success
    res = ip.run_cell(
        "%%distributed --ranks 0 -o got\nt = torch.ones(1) * 3\ndist.all_reduce(t, group=solo)\nt.item()\n"
    )
    assert res.success, res.error_in_exec
    assert list(ip.user_ns["got"]) == [3.0]
    res = ip.run_cell(  # and on every rank, collectives on the default group are untouched
        "%%distributed -o both\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()\n"
    )
    assert res.success and list(ip.user_ns["both"]) == [2.0, 2.0]
