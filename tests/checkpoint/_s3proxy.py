"""A small HTTP proxy in front of a test S3 endpoint that records requests and injects faults.

``S3Proxy(upstream, fault)`` listens on a free loopback port (``endpoint``); every request is recorded
(``requests``: method, path, headers) and passed to ``fault(request, index)``, which returns ``None`` to
forward it unchanged, ``Reply(status, code)`` to answer with an S3 XML error instead, or ``Cut(n)`` to
forward it but send only the first ``n`` bytes of the response body (with the full ``Content-Length``) and
then drop the connection.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

__all__ = ["S3Proxy", "Reply", "Cut", "Request"]

_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)  # lower-cased names
    body_len: int = 0


@dataclass
class Reply:
    status: int
    code: str
    message: str = "injected by the test proxy"


@dataclass
class Cut:
    after: int  # body bytes sent before the connection is dropped


Fault = Callable[[Request, int], "Reply | Cut | None"]


class S3Proxy:
    def __init__(self, upstream: str, fault: Fault | None = None) -> None:
        u = urlsplit(upstream)
        self.upstream_host, self.upstream_port = u.hostname or "127.0.0.1", u.port or 80
        self.fault = fault
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                    out = bytearray()
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass  # trailers
                            return bytes(out)
                        out += self.rfile.read(size)
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _handle(self) -> None:
                body = self._body()
                req = Request(
                    self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, len(body)
                )
                with proxy._lock:
                    proxy.requests.append(req)
                    index = len(proxy.requests) - 1
                action = proxy.fault(req, index) if proxy.fault else None
                if isinstance(action, Reply):
                    xml = (
                        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{action.code}</Code>'
                        f"<Message>{action.message}</Message><RequestId>proxy</RequestId></Error>"
                    ).encode()
                    self.send_response(action.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml) if self.command != "HEAD" else 0))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(xml)
                    return
                conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    headers["Content-Length"] = str(len(body))
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    rheaders = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
                    status, reason = resp.status, resp.reason
                finally:
                    conn.close()
                self.send_response(status, reason)
                for k, v in rheaders:
                    if k.lower() not in ("content-length", "server", "date"):
                        self.send_header(k, v)
                clen = dict((k.lower(), v) for k, v in rheaders).get("content-length", str(len(data)))
                self.send_header("Content-Length", clen if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if isinstance(action, Cut):
                    self.wfile.write(data[: action.after])
                    self.wfile.flush()
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3-proxy", daemon=True)

    def requests_for(self, method: str, path_part: str = "") -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.method == method and path_part in r.path]

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
