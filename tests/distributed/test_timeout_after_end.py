"""A ``%%distributed --timeout`` that expires after the cell's code ended never reports an interrupt (issue 17,
item 11: the cell printed "The running ranks were interrupted (timeout)" for ranks whose code had finished, while
their replies were still on the way)."""

from __future__ import annotations

import time

from _poll import wait_for
from IPython.utils.capture import capture_output

# the code ends at 1.5 s, under the 2 s timeout; its value then takes another second to pickle (twice 0.5 s:
# the size check and Ray's reply), so the replies arrive after the timeout has expired
SLOW_REPLY = """%%distributed -o got --timeout 2
import time

class SlowToSend:
    def __reduce__(self):
        time.sleep(0.5)
        return (int, (7,))

time.sleep(1.5)
SlowToSend()
"""


def _cell(ip, code: str) -> str:
    with capture_output() as cap:
        res = ip.run_cell(code)
    assert res.error_in_exec is None, cap.stdout + cap.stderr
    return cap.stdout + cap.stderr


def test_a_timeout_after_the_code_ended_reports_nothing(ip, shared) -> None:
    out = _cell(ip, SLOW_REPLY)
    assert "interrupt" not in out.lower() and "timeout" not in out.lower(), out
    assert list(ip.user_ns["got"]) == [7, 7]
    started = time.monotonic()
    out = _cell(ip, "%%distributed --timeout 2\nimport time\ntime.sleep(1.5)\n")
    # past that cell's timeout (2 s from its start): nothing fires late
    wait_for(lambda: time.monotonic() > started + 2.5, what="the end of the cell's --timeout")
    out += _cell(ip, "%%distributed -o after\n6 * 7\n")
    assert "interrupt" not in out.lower(), out
    assert list(ip.user_ns["after"]) == [42, 42]
