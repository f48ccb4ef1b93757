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


# Ray's own text when a raylet does not register within its fixed 30 s (ray/_private/node.py, Ray 2.60)
RAY_NODE_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to "
    "startup or the GCS has become overloaded."
)


def test_a_local_start_whose_node_timed_out_is_tried_once_more_and_other_failures_are_not(
    monkeypatch,
) -> None:
    """On a busy machine (Binder, a laptop building something) a local Ray's raylet can miss Ray's fixed 30 s to
    register: the start cleans up what it began and tries once more, saying so; any other failure, or a second
    timeout, is one ConnectError with Ray's text. (``ray.init`` stands in here: a real timeout needs a machine
    too busy to start a raylet; the clean-up is recorded, not run, as this process may hold the session's Ray.)"""
    import pytest
    import ray

    from gpu_notebook.cluster import _connect

    calls: list[int] = []
    aborted: list[int] = []
    failures: list[BaseException] = []

    def fake_init(**kw: object) -> None:
        assert kw["address"] == "local"
        calls.append(1)
        raise failures[len(calls) - 1]

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(_connect, "_abort_local_start", lambda r, before: aborted.append(1))

    said: list[str] = []
    failures[:] = [Exception(RAY_NODE_TIMEOUT), RuntimeError("the second start failed too")]
    with pytest.raises(_connect.ConnectError, match="could not start a local Ray cluster: the second start"):
        _connect.connect(None, num_cpus=1, progress=said.append)
    assert len(calls) == 2 and len(aborted) == 2
    assert any("once more" in m for m in said)

    calls.clear()
    aborted.clear()
    said.clear()
    failures[:] = [ValueError("object_store_memory is too small")]
    with pytest.raises(_connect.ConnectError, match="object_store_memory is too small"):
        _connect.connect(None, num_cpus=1, progress=said.append)
    assert len(calls) == 1 and len(aborted) == 1 and not any("once more" in m for m in said)

    calls.clear()
    aborted.clear()
    failures[:] = [Exception(RAY_NODE_TIMEOUT), Exception(RAY_NODE_TIMEOUT)]
    with pytest.raises(_connect.ConnectError, match="timed out during startup"):
        _connect.connect(None, num_cpus=1)
    assert len(calls) == 2
