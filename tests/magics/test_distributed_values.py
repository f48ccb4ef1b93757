"""What a ``%%distributed`` cell shows for a value that could not come back (issue 17, 19: a placeholder printed
like the real object read as if the value had come back)."""

from __future__ import annotations

from IPython.utils.capture import capture_output


def test_an_unpicklable_value_is_labelled_not_shown_as_the_object(ip, shared) -> None:
    with capture_output() as cap:
        res = ip.run_cell("%%distributed -o got --ranks 0\nimport threading\nthreading.Lock()\n")
    assert res.error_in_exec is None, cap.stderr
    assert "Out[rank 0]: <lock not sent (it cannot be pickled: " in cap.stdout, cap.stdout
    assert "): <unlocked _thread.lock object at" in cap.stdout
    assert repr(ip.user_ns["got"][0]).startswith("<lock not sent")  # -o keeps the placeholder, labelled too
