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
- :class:`FakeGCE` answers the Compute Engine API under the real ``google-api-python-client`` (as its ``http``),
  and :class:`FakeAzureCompute` stands in for ``azure.mgmt.compute.ComputeManagementClient``: the teardown
  verification of GCP and Azure clusters runs against them.
- :func:`write_fake_ssh` writes a stand-in ``ssh``/``kubectl`` that listens on the forwarded port.

The library never imports this module (it may import the library).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

__all__ = [
    "DEFAULT_RESPONSES",
    "FAKE_SSH",
    "FakeApiException",
    "FakeAzureCompute",
    "FakeGCE",
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


class FakeGCE:
    """The Compute Engine instances API of one project, in memory, behind the real google-api-python-client.

    An instance of this class is an ``httplib2.Http`` stand-in (``request(uri, method, body, headers, ...)``),
    so the real discovery client builds and sends every request (its parameter checks and its paging run for
    real) and this object answers them: ``instances().list`` with a ``labels.KEY = VALUE`` filter, paged by
    ``page_size``, and ``instances().get`` / ``instances().delete`` of one instance. Pass it as ``http=`` to
    ``googleapiclient.discovery.build("compute", "v1", http=fake)`` (the bundled discovery document is used).
    """

    def __init__(self, project: str = "p", page_size: int = 2) -> None:
        self.project = project
        self.page_size = page_size
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []

    def add(
        self,
        name: str,
        zone: str,
        status: str = "RUNNING",
        labels: dict[str, str] | None = None,
        disks: int = 1,
    ) -> dict[str, Any]:
        """Create an instance (``status`` as GCE reports it: PROVISIONING, RUNNING, STOPPING, TERMINATED)."""
        inst = {
            "kind": "compute#instance",
            "name": name,
            "zone": f"https://www.googleapis.com/compute/v1/projects/{self.project}/zones/{zone}",
            "status": status,
            "labels": dict(labels or {}),
            "disks": [{"deviceName": f"{name}-disk-{i}", "autoDelete": True} for i in range(disks)],
        }
        self.instances[(zone, name)] = inst
        return inst

    def request(
        self,
        uri: str,
        method: str = "GET",
        body: Any = None,
        headers: Any = None,
        redirections: int = 1,
        connection_type: Any = None,
    ) -> tuple[Any, bytes]:
        """Answer one HTTP request of the client (``httplib2.Http.request``'s signature)."""
        import json
        import urllib.parse

        import httplib2

        self.requests.append((method, uri))
        url = urllib.parse.urlparse(uri)
        query = urllib.parse.parse_qs(url.query)
        m = re.fullmatch(r"/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?", url.path)
        if m is None or m.group(1) != self.project:
            return self._reply(httplib2, 404, {"error": {"code": 404, "message": f"not found: {url.path}"}})
        zone, name = m.group(2), m.group(3)
        if name is None and method == "GET":
            return self._reply(httplib2, 200, self._list(zone, query))
        inst = self.instances.get((zone, name or ""))
        if inst is None:
            message = f"The resource 'projects/{self.project}/zones/{zone}/instances/{name}' was not found"
            return self._reply(httplib2, 404, {"error": {"code": 404, "message": message}})
        if method == "DELETE":
            del self.instances[(zone, str(name))]
            return self._reply(httplib2, 200, {"kind": "compute#operation", "name": f"delete-{name}"})
        return self._reply(httplib2, 200, json.loads(json.dumps(inst)))

    def _list(self, zone: str, query: dict[str, list[str]]) -> dict[str, Any]:
        items = [i for (z, _), i in sorted(self.instances.items()) if z == zone]
        for expr in query.get("filter", []):
            m = re.fullmatch(r"labels\.(\S+)\s*=\s*(\S+)", expr.strip())
            if m is None:
                raise ValueError(f"FakeGCE understands only 'labels.KEY = VALUE' filters, not {expr!r}")
            items = [i for i in items if i["labels"].get(m.group(1)) == m.group(2)]
        start = int((query.get("pageToken") or ["0"])[0])
        page = items[start : start + self.page_size]
        out: dict[str, Any] = {"kind": "compute#instanceList"}
        if page:  # like GCE: no "items" key on an empty page
            out["items"] = page
        if start + self.page_size < len(items):
            out["nextPageToken"] = str(start + self.page_size)
        return out

    @staticmethod
    def _reply(httplib2: Any, status: int, payload: dict[str, Any]) -> tuple[Any, bytes]:
        import json

        return httplib2.Response({"status": str(status), "content-type": "application/json"}), json.dumps(
            payload
        ).encode()


class FakeAzureCompute:
    """Stand-in for ``azure.mgmt.compute.ComputeManagementClient`` over one subscription's VMs, in memory.

    The object is callable like the client class (``fake(credential, subscription_id)`` returns itself), so it
    can replace ``azure.mgmt.compute.ComputeManagementClient``. ``virtual_machines.list(resource_group_name)``
    yields VM objects with the attributes of ``azure.mgmt.compute.models.VirtualMachine`` that callers read
    (``name``, ``tags``, ``provisioning_state``). Every call is recorded in ``calls`` as
    ``(name, args, kwargs)``, so a test can bind it to the real client's signature.
    """

    def __init__(self) -> None:
        self.vms: dict[tuple[str, str], Any] = {}
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.virtual_machines = _FakeVirtualMachines(self)

    def __call__(
        self, credential: Any, subscription_id: str, base_url: str | None = None, **kwargs: Any
    ) -> Any:
        self.calls.append(
            ("ComputeManagementClient", (credential, subscription_id), {"base_url": base_url, **kwargs})
        )
        self.subscription_id = subscription_id
        return self

    def add(
        self, name: str, resource_group: str, tags: dict[str, str] | None = None, state: str = "Succeeded"
    ) -> Any:
        """Create a VM (``state``: Azure's provisioning state, e.g. Creating, Succeeded, Deleting)."""
        import types

        vm = types.SimpleNamespace(name=name, tags=dict(tags or {}) or None, provisioning_state=state)
        self.vms[(resource_group, name)] = vm
        return vm

    def remove(self, name: str, resource_group: str) -> None:
        """Delete a VM (what Ray's Azure node provider does on ``ray down``)."""
        self.vms.pop((resource_group, name), None)


class _FakeVirtualMachines:
    """``ComputeManagementClient.virtual_machines`` (``VirtualMachinesOperations``)."""

    def __init__(self, owner: FakeAzureCompute) -> None:
        self._owner = owner

    def list(
        self, resource_group_name: str, *, filter: str | None = None, expand: str | None = None, **kwargs: Any
    ) -> Iterator[Any]:
        self._owner.calls.append(
            ("virtual_machines.list", (resource_group_name,), {"filter": filter, "expand": expand, **kwargs})
        )
        return iter([vm for (rg, _), vm in sorted(self._owner.vms.items()) if rg == resource_group_name])
