"""Address mode: which Ray Client start-up failures are retried.

A real head reached by host:port and by ray:// (cells, collectives, every rank's output, stop leaving the head
running, a second connection to the head the first one left) is tested in test_ship_package.py, on a head whose
Python lacks gpu_notebook: one second Ray head for both.
"""

from __future__ import annotations


def test_ray_client_start_up_failures_are_retried_but_wrong_addresses_are_not() -> None:
    from gpu_notebook.cluster._connect import _transient_client_error

    assert _transient_client_error(
        ConnectionAbortedError("Initialization failure from server:\nTraceback ...")
    )
    assert not _transient_client_error(ConnectionError("ray client connection timeout"))
    assert not _transient_client_error(ValueError("bad address"))
