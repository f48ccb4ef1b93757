"""``%%distributed -o NAME`` on a cell where every rank fails leaves an existing ``NAME`` as it was (issue 17,
item 3: it was replaced by an empty result)."""

from __future__ import annotations

from IPython.utils.capture import capture_output


def test_out_is_left_untouched_when_every_rank_fails(ip, shared) -> None:
    ip.user_ns["kept"] = "earlier result"
    with capture_output() as cap:
        res = ip.run_cell("%%distributed -o kept\nraise ValueError('boom')\n")
    assert res.error_in_exec is not None, cap.stdout
    assert ip.user_ns["kept"] == "earlier result"
    with capture_output():
        res = ip.run_cell("%%distributed -o kept --ranks 0\n41 + 1\n")
    assert res.error_in_exec is None and list(ip.user_ns["kept"]) == [42]
