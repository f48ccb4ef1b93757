"""Offline stand-ins for cloud launches: a recording process runner, a loopback moto EC2 server, fake kube clients.

The launcher in :mod:`gpu_notebook.cloud` is tested against these, and so can code of yours that drives it:

- :class:`RecordingProcessRunner` replaces ``subprocess`` for Ray's SSH/rsync/docker command runners
  (install it with :func:`gpu_notebook.cloud._ray_compat.substitute_process_runner`): it records every command,
  answers the few probes the launcher parses (``command -v docker``, ``docker inspect``...), and can fail on
  demand.
- :class:`MotoEC2` runs moto's server on ``127.0.0.1`` with a free port and points boto3 at it with fake
  credentials (environment variables), so Ray's real AWS node provider talks to it over HTTP.
- :class:`FakeKube` stands in for the ``kubernetes`` client's ``CustomObjectsApi`` and ``CoreV1Api`` (pass
  ``CloudLauncher(kube_clients=(fake, fake))``) and behaves like a KubeRay operator would.
- :func:`write_fake_ssh` writes a stand-in ``ssh``/``kubectl`` that listens on the forwarded port.

The library never imports this module (it may import the library).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from typing import Any

__all__ = [
    "DEFAULT_RESPONSES",
    "FAKE_SSH",
    "FakeApiException",
    "FakeKube",
    "MotoEC2",
    "RecordingProcessRunner",
    "free_port",
    "write_fake_ssh",
]

#: Answers for the probes Ray's command runners parse (substring of the joined command -> stdout).
DEFAULT_RESPONSES: dict[str, bytes] = {
    "command -v docker": b"/usr/bin/docker",
    ".State.Running": b"false",
    ".Config.Env": b'["HOME=/home/ray", "PATH=/usr/bin"]',
    "printenv HOME": b"/home/ray",
    "/proc/meminfo": b"MemAvailable:   16000000 kB",
    "info -f": b"runc",
    "json .Mounts": b"[]",
}


class RecordingProcessRunner:
    """A ``subprocess``-like module that records commands instead of running them.

    Parameters
    ----------
    responses : dict, optional
        Extra ``{substring: stdout bytes}`` answers for ``check_output`` (checked before the defaults).
    fail_on : str, optional
        A regular expression; a command whose joined text matches it fails with ``CalledProcessError``.
    """

    DEVNULL = subprocess.DEVNULL
    PIPE = subprocess.PIPE

    def __init__(self, responses: dict[str, bytes] | None = None, fail_on: str | None = None) -> None:
        self.responses = {**(responses or {}), **DEFAULT_RESPONSES}
        self.fail_on = re.compile(fail_on) if fail_on else None
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def _record(self, cmd: Any) -> str:
        parts = [str(c) for c in cmd] if isinstance(cmd, list | tuple) else [str(cmd)]
        with self._lock:
            self.calls.append(parts)
        text = " ".join(parts)
        if self.fail_on is not None and self.fail_on.search(text):
            raise subprocess.CalledProcessError(1, parts)
        return text

    def check_call(self, cmd: Any, **kwargs: Any) -> int:
        self._record(cmd)
        return 0

    def check_output(self, cmd: Any, **kwargs: Any) -> bytes:
        text = self._record(cmd)
        for key, value in self.responses.items():
            if key in text:
                return value
        return b""

    def call(self, cmd: Any, **kwargs: Any) -> int:
        self._record(cmd)
        return 0

    @property
    def commands(self) -> list[str]:
        """Every recorded command, joined with spaces."""
        with self._lock:
            return [" ".join(c) for c in self.calls]

    def matching(self, pattern: str) -> list[str]:
        """Recorded commands that match the regular expression ``pattern``."""
        rx = re.compile(pattern)
        return [c for c in self.commands if rx.search(c)]


FAKE_SSH = r"""#!{python}
# A stand-in for `ssh -N -L PORT:localhost:10001 user@host` or `kubectl port-forward ... PORT:10001`:
# logs its arguments, listens on PORT, waits.
import re, socket, sys, time
args = sys.argv[1:]
spec = args[args.index("-L") + 1] if "-L" in args else [a for a in args if re.match(r"^\d+:", a)][0]
with open({log!r}, "a") as f:
    f.write(" ".join(sys.argv[1:]) + "\n")
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(spec.split(":")[0])))
s.listen(5)
time.sleep(600)
"""


def write_fake_ssh(path: Any, log: Any) -> str:
    """Write an executable fake ``ssh``/``kubectl`` for tunnels (see ``FAKE_SSH``) at ``path``; returns its path."""
    import sys
    from pathlib import Path

    target = Path(path)
    target.write_text(FAKE_SSH.format(python=sys.executable, log=str(log)))
    target.chmod(0o755)
    return str(target)


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoEC2:
    """moto's server on loopback plus the environment that points boto3 (and Ray) at it.

    Use as a context manager; ``env`` holds the variables set while it runs (fake credentials, endpoint).
    """

    def __init__(self, region: str = "us-east-1") -> None:
        self.region = region
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": region,
            "AWS_ENDPOINT_URL": self.endpoint,
        }
        self._server: Any = None
        self._saved: dict[str, str | None] = {}

    def start(self) -> MotoEC2:
        from moto.server import ThreadedMotoServer

        for key in (
            "AWS_PROFILE",
            "AWS_CONFIG_FILE",
            "AWS_SHARED_CREDENTIALS_FILE",
            "MOTO_IAM_LOAD_MANAGED_POLICIES",
            *self.env,
        ):
            self._saved[key] = os.environ.get(key)
        # Ray's AWS bootstrap attaches AWS-managed IAM policies; moto only knows them with this set.
        os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        for key in ("AWS_PROFILE",):
            os.environ.pop(key, None)
        os.environ["AWS_CONFIG_FILE"] = os.devnull
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = os.devnull
        os.environ.update(self.env)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
        for key, value in self._saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def reset(self) -> None:
        """Forget every fake resource (moto's reset API)."""
        import urllib.request

        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def client(self, service: str = "ec2") -> Any:
        import boto3

        return boto3.client(service, region_name=self.region)

    def __enter__(self) -> MotoEC2:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FakeApiException(Exception):
    """Like ``kubernetes.client.ApiException``: carries the HTTP ``status``."""

    def __init__(self, status: int, reason: str = "") -> None:
        super().__init__(f"({status}) {reason}")
        self.status = status


class FakeKube:
    """In-memory stand-ins for ``CustomObjectsApi`` and ``CoreV1Api`` that behave like KubeRay would.

    A created RayCluster reports ``state: ready`` after ``ready_after`` reads and gets one head pod plus one
    pod per worker replica; deleting it removes the pods after ``pods_linger`` pod listings.
    """

    def __init__(self, ready_after: int = 1, pods_linger: int = 0, fail_create: int | None = None) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads: dict[tuple[str, str], int] = {}
        self.pods: dict[tuple[str, str], list[str]] = {}
        self.linger: dict[tuple[str, str], int] = {}
        self.ready_after = ready_after
        self.pods_linger = pods_linger
        self.fail_create = fail_create
        self.calls: list[str] = []

    # CustomObjectsApi
    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append("create")
        if self.fail_create is not None:
            raise FakeApiException(self.fail_create, "refused")
        key = (namespace, body["metadata"]["name"])
        if key in self.objects:
            raise FakeApiException(409, "AlreadyExists")
        self.objects[key] = {**body, "status": {}}
        self.reads[key] = 0
        replicas = sum(int(g.get("replicas", 0)) for g in body["spec"].get("workerGroupSpecs", []))
        self.pods[key] = [f"{key[1]}-head"] + [f"{key[1]}-worker-{i}" for i in range(replicas)]
        return self.objects[key]

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        self.calls.append("patch")
        key = (namespace, name)
        if key not in self.objects:
            raise FakeApiException(404, "NotFound")
        self.objects[key]["spec"] = body["spec"]
        return self.objects[key]

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        key = (namespace, name)
        if key not in self.objects:
            raise FakeApiException(404, "NotFound")
        self.reads[key] += 1
        if self.reads[key] > self.ready_after:
            self.objects[key]["status"] = {"state": "ready"}
        return self.objects[key]

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        self.calls.append("delete")
        key = (namespace, name)
        if key not in self.objects:
            raise FakeApiException(404, "NotFound")
        del self.objects[key]
        self.linger[key] = self.pods_linger
        return {}

    # CoreV1Api
    def list_namespaced_pod(self, namespace: str, label_selector: str = "") -> Any:
        import types

        name = label_selector.split("=", 1)[1] if "=" in label_selector else ""
        key = (namespace, name)
        if key not in self.objects and key in self.pods:
            if self.linger.get(key, 0) <= 0:
                self.pods.pop(key)
            else:
                self.linger[key] -= 1
        items = [
            types.SimpleNamespace(metadata=types.SimpleNamespace(name=p)) for p in self.pods.get(key, [])
        ]
        return types.SimpleNamespace(items=items)
