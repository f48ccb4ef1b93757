"""A real S3 endpoint for tests: moto's server mode on 127.0.0.1 with a free port (plain HTTP, no patching).

``S3Server()`` runs ``moto.server.ThreadedMotoServer`` in this process (its data survives ``stop()`` /
``start()`` on the same port, which the "endpoint down mid-upload" test uses); ``S3Server(subprocess=True,
auth=True)`` runs the ``moto_server`` program in a child process with authentication enforced, so unknown
credentials get a real 403.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["S3Server", "free_port", "fake_credentials"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fake_credentials() -> dict[str, str]:
    """Environment for boto3 talking to the test server (made-up keys, never real ones)."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def _wait_up(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url + "/moto-api/", timeout=1.0).read()
            return
        except Exception:  # noqa: BLE001
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto server at {url} did not start") from None
            time.sleep(0.1)


class S3Server:
    """A moto S3 server on loopback; ``endpoint`` is its URL."""

    def __init__(self, subprocess: bool = False, auth: bool = False, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.use_subprocess = subprocess or auth
        self.auth = auth
        self._server: Any = None
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> S3Server:
        if self.use_subprocess:
            env = dict(os.environ)
            if self.auth:
                env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
            exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
            cmd = [exe] if os.path.exists(exe) else [sys.executable, "-m", "moto.server"]
            self._proc = subprocess.Popen(
                [*cmd, "-H", "127.0.0.1", "-p", str(self.port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        else:
            import logging

            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)

            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
        _wait_up(self.endpoint)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self._proc.kill()
            self._proc = None

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@contextmanager
def serving() -> Iterator[S3Server]:
    """A started :class:`S3Server` with the fake credentials in the environment (the old values back after)."""
    old = {k: os.environ.get(k) for k in fake_credentials()}
    os.environ.update(fake_credentials())
    srv = S3Server().start()
    try:
        yield srv
    finally:
        srv.stop()
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
