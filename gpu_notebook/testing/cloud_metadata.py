"""A fake of a cloud's instance metadata service on loopback: spot preemption drills without a cloud.

Public, for testing your own training loop's preemption handling (as the library's tests do).
``FakeMetadataServer("aws" | "gcp" | "azure")`` answers the requests :class:`gpu_notebook.checkpoint.PreemptionWatcher`
makes the way the real service does (as documented by each cloud), including the parts a client can get wrong:

* AWS (IMDSv2): ``PUT /latest/api/token`` needs ``X-aws-ec2-metadata-token-ttl-seconds`` (1-21600), else 400;
  a ``GET`` without a valid ``X-aws-ec2-metadata-token`` is 401 (IMDSv2 required, the default for new
  instances); ``/latest/meta-data/spot/instance-action`` is 404 until :meth:`preempt`, then
  ``{"action": ..., "time": "YYYY-MM-DDTHH:MM:SSZ"}``.
* GCP: every request needs ``Metadata-Flavor: Google`` (else 403) and is refused when it carries
  ``X-Forwarded-For``; answers carry ``Metadata-Flavor: Google``; ``/computeMetadata/v1/instance/preempted`` is
  ``FALSE`` then ``TRUE``.
* Azure: ``/metadata/scheduledevents`` needs ``Metadata: true`` (else 400) and an ``api-version`` (else 400); it
  lists ``{"DocumentIncarnation": n, "Events": [...]}``, a ``Preempt`` event with ``NotBefore`` in RFC 1123
  after :meth:`preempt` (for this VM, or for the VMs named in ``resources``: the events of an availability set or
  scale set reach all its VMs); ``/metadata/instance/compute/name?format=text`` is the VM's name.

Use it to check that a training loop saves and stops on a notice::

    from gpu_notebook.checkpoint import Checkpointer, PreemptionWatcher
    from gpu_notebook.testing.cloud_metadata import FakeMetadataServer

    with FakeMetadataServer("aws") as md:
        ckpt = Checkpointer(path, preemption=PreemptionWatcher("aws", url=md.url, interval_s=0.2))
        md.preempt(in_s=120)
        ...
"""

from __future__ import annotations

import email.utils
import json
import secrets
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeMetadataServer"]


class FakeMetadataServer:
    """An instance metadata service for one cloud on ``127.0.0.1`` (``url``), in a thread."""

    def __init__(self, cloud: str, vm_name: str = "gpu-node-0") -> None:
        if cloud not in ("aws", "gcp", "azure"):
            raise ValueError(f"unknown cloud {cloud!r}")
        self.cloud = cloud
        self.vm_name = vm_name
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # method, path, headers
        self._lock = threading.Lock()
        self._tokens: dict[str, float] = {}  # AWS session tokens -> expiry
        self._notice: dict[str, Any] | None = None
        self._incarnation = 1
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control
    def start(self) -> FakeMetadataServer:
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-imds", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeMetadataServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the server first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def preempt(
        self,
        in_s: float = 120.0,
        action: str = "terminate",
        after_s: float = 0.0,
        resources: list[str] | None = None,
    ) -> None:
        """Announce that this VM will be taken away ``in_s`` seconds after the notice, which shows up
        ``after_s`` seconds from now (0: at once). ``resources`` (Azure): the VMs the event names (default: this
        one; another VM's event reaches this one too)."""
        with self._lock:
            shown = time.time() + after_s
            res = [self.vm_name] if resources is None else list(resources)
            self._notice = {"at": shown + in_s, "action": action, "from": shown, "resources": res}
            self._incarnation += 1

    def clear(self) -> None:
        with self._lock:
            self._notice = None
            self._incarnation += 1

    # ------------------------------------------------------------------ answers
    def _answer(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.requests.append((method, path, dict(headers)))
            notice = dict(self._notice) if self._notice else None
            incarnation = self._incarnation
        if notice is not None and time.time() < notice["from"]:
            notice = None  # announced for later
        parts = urlsplit(path)
        h = {k.lower(): v for k, v in headers.items()}
        if self.cloud == "aws":
            if method == "PUT" and parts.path == "/latest/api/token":
                try:
                    ttl = int(h.get("x-aws-ec2-metadata-token-ttl-seconds", ""))
                except ValueError:
                    return 400, {}, b"Missing or invalid X-aws-ec2-metadata-token-ttl-seconds"
                if not 1 <= ttl <= 21600:
                    return 400, {}, b"Invalid X-aws-ec2-metadata-token-ttl-seconds"
                token = secrets.token_urlsafe(32)
                with self._lock:
                    self._tokens[token] = time.time() + ttl
                return 200, {"X-aws-ec2-metadata-token-ttl-seconds": str(ttl)}, token.encode()
            if method != "GET":
                return 405, {}, b""
            tok = h.get("x-aws-ec2-metadata-token")
            with self._lock:
                valid = tok is not None and self._tokens.get(tok, 0) > time.time()
            if not valid:
                return 401, {}, b""
            if parts.path == "/latest/meta-data/spot/instance-action":
                if notice is None:
                    return 404, {}, b"Not Found"
                when = datetime.fromtimestamp(notice["at"], tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                return (
                    200,
                    {"Content-Type": "text/plain"},
                    json.dumps({"action": notice["action"], "time": when}).encode(),
                )
            return 404, {}, b"Not Found"
        if self.cloud == "gcp":
            if h.get("metadata-flavor") != "Google" or "x-forwarded-for" in h:
                return 403, {}, b"Missing Metadata-Flavor:Google header."
            flavor = {"Metadata-Flavor": "Google", "Content-Type": "application/text"}
            if parts.path == "/computeMetadata/v1/instance/preempted":
                return 200, flavor, b"TRUE" if notice is not None else b"FALSE"
            return 404, flavor, b"Not Found"
        # azure
        if parts.path not in ("/metadata/scheduledevents", "/metadata/instance/compute/name"):
            return 404, {}, b""
        if h.get("metadata", "").lower() != "true":
            return (
                400,
                {},
                json.dumps({"error": "Bad request. Required metadata header not specified"}).encode(),
            )
        query = parse_qs(parts.query)
        if "api-version" not in query:
            return 400, {}, json.dumps({"error": "Bad request. api-version was not specified"}).encode()
        if parts.path == "/metadata/instance/compute/name":  # (asked for with format=text)
            return 200, {"Content-Type": "text/plain; charset=utf-8"}, self.vm_name.encode()
        events = []
        if notice is not None:
            events.append(
                {
                    "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
                    "EventType": "Preempt",
                    "ResourceType": "VirtualMachine",
                    "Resources": notice["resources"],
                    "EventStatus": "Scheduled",
                    "NotBefore": email.utils.formatdate(notice["at"], usegmt=True),
                    "Description": "",
                    "EventSource": "Platform",
                    "DurationInSeconds": -1,
                }
            )
        doc = {"DocumentIncarnation": incarnation, "Events": events}
        return 200, {"Content-Type": "application/json"}, json.dumps(doc).encode()


def _make_handler(server: FakeMetadataServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _reply(self) -> None:
            code, headers, body = server._answer(self.command, self.path, dict(self.headers.items()))
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = _reply
        do_PUT = _reply
        do_POST = _reply

        def log_message(self, *args: Any) -> None:  # quiet
            pass

    return Handler
