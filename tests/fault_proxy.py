"""A reverse proxy on 127.0.0.1 that injects network faults, on a schedule, in front of any HTTP
server: the loopback Common Crawl mirror of tests/pipeline/conftest.py, moto's S3 server, ...

    with FaultProxy(upstream="http://127.0.0.1:PORT") as proxy:
        proxy.add("slowdown", path=r"\\.wet\\.gz$", times=2)    # the next 2 matching GETs
        proxy.add("reset", after=300_000)                     # then one cut after 300 kB of body
        ... point the client at proxy.url (e.g. AWS_ENDPOINT_URL for botocore) ...
        assert [r.fault for r in proxy.requests] == ["slowdown", "slowdown", "reset", None]

Each `add` appends a `Fault` rule; a request takes the first rule that matches its method, path
(a regular expression searched in the path without the query) and Range header (`ranged`:
True/False for with/without, None for either), and each rule applies `times` times. Requests
that match no rule are forwarded untouched. Every request is recorded (`requests`): method,
path, Range header, the status sent, and the fault applied.

Faults:
- `slowdown`: 503 with S3's `SlowDown` XML error body, the upstream never asked.
- `status`: answers `status` (429, 500, 502, 504, or 200 with an HTML page...) with `body` and
  `headers` (e.g. Retry-After), the upstream never asked.
- `reset`: forwards, sends the upstream's status and headers and the first `after` bytes of the
  body, then resets the connection (TCP RST: SO_LINGER 0).
- `cut`: the same, then closes the connection cleanly: the body ends short of its Content-Length.
- `stall`: the same, then sends nothing for `stall_s` seconds (a stalled response), then closes.
- `drip`: forwards, sends the upstream's status and headers, then the body one byte every
  `drip_s` seconds (a server that never stalls long enough for a per-read timeout).
- `ignore_range`: forwards without the Range header: the upstream answers 200 with everything.
- `etag`: forwards, and answers with the ETag header replaced by `etag` (an object that seems to
  have changed).

`then`: called with the request's path when the fault is applied, before the client can see it
(e.g. to replace the object upstream between a cut and the resume). The proxy streams bodies in 64 KiB pieces, keeps
connections alive (HTTP/1.1) unless a fault ends them, and forwards any method with its body (a
client may upload through it). `stop()` (or leaving the `with`) wakes stalled responses, closes
the listening socket and joins the server thread.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import struct
import sys
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["SLOWDOWN_BODY", "Fault", "FaultProxy", "ProxiedRequest"]

SLOWDOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>FAULTPROXY</RequestId></Error>"
)
KINDS = ("slowdown", "status", "reset", "cut", "stall", "drip", "ignore_range", "etag")
PIECE = 64 << 10
# headers of one connection, never forwarded (RFC 9110 7.6.1)
HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "transfer-encoding")
    + ("upgrade", "proxy-connection")
)


@dataclass
class Fault:
    kind: str
    path: str = ""
    method: str = "GET"
    ranged: bool | None = None
    times: int = 1
    after: int = 0
    status: int = 503
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    stall_s: float = 30.0
    drip_s: float = 0.2
    etag: str = '"changed"'
    then: Callable[[str], object] | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault {self.kind!r}; one of {', '.join(KINDS)}")

    def matches(self, method: str, path: str, range_header: str | None) -> bool:
        return (
            self.times > 0
            and method == self.method
            and re.search(self.path, path) is not None
            and (self.ranged is None or self.ranged == (range_header is not None))
        )


@dataclass
class ProxiedRequest:
    method: str
    path: str
    range: str | None
    headers: dict[str, str] = field(default_factory=dict)
    status: int | None = None
    fault: str | None = None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # keep test output clean
        pass

    def do_GET(self):  # noqa: N802 - http.server's names
        self._handle()

    do_HEAD = do_PUT = do_POST = do_DELETE = do_GET  # noqa: N815

    def _handle(self) -> None:
        proxy: FaultProxy = self.server.proxy
        path = urllib.parse.urlsplit(self.path).path
        body = self._request_body()
        rec = ProxiedRequest(self.command, path, self.headers.get("Range"), dict(self.headers.items()))
        fault = proxy._take(self.command, path, rec.range)
        rec.fault = fault.kind if fault else None
        with proxy._lock:
            proxy.requests.append(rec)
        if fault is not None and fault.kind == "slowdown":
            rec.status = 503
            self._then(fault, path)
            self._answer(503, SLOWDOWN_BODY, {"Content-Type": "application/xml"})
        elif fault is not None and fault.kind == "status":
            rec.status = fault.status
            self._then(fault, path)
            self._answer(fault.status, fault.body, fault.headers)
        else:
            self._forward(fault, rec, body, path)

    @staticmethod
    def _then(fault: Fault | None, path: str) -> None:
        # before the client can see the fault: its next request must find the change made
        if fault is not None and fault.then is not None:
            fault.then(path)

    def _request_body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(self, fault: Fault | None, rec: ProxiedRequest, body: bytes | None, path: str) -> None:
        proxy: FaultProxy = self.server.proxy
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        if fault is not None and fault.kind == "ignore_range":
            headers = {k: v for k, v in headers.items() if k.lower() != "range"}
        if body is not None:
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=30)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            up = conn.getresponse()
            rec.status = up.status
            self.send_response(up.status)
            length = up.getheader("Content-Length")
            for k, v in up.getheaders():
                if k.lower() in HOP_BY_HOP or k.lower() == "content-length":
                    continue
                if fault is not None and fault.kind == "etag" and k.lower() == "etag":
                    v = fault.etag
                self.send_header(k, v)
            chunked = length is None and self.command != "HEAD" and up.status not in (204, 304)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", length or "0")
            self.end_headers()
            if self.command == "HEAD":
                self._then(fault, path)
                return
            if fault is not None and fault.kind == "drip":
                self._then(fault, path)
                self._drip(up, chunked, fault.drip_s)
                return
            cut = fault.after if fault is not None and fault.kind in ("reset", "cut", "stall") else None
            sent = 0
            while cut is None or sent < cut:
                piece = up.read(PIECE if cut is None else min(PIECE, cut - sent))
                if not piece:
                    break
                if chunked:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                else:
                    self.wfile.write(piece)
                sent += len(piece)
            else:  # `after` bytes of the body went out: now the fault
                self.wfile.flush()
                self._then(fault, path)
                if fault.kind == "stall":
                    proxy._stopping.wait(fault.stall_s)
                self._end_connection(reset=fault.kind == "reset")
                return
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
            self._then(fault, path)  # ignore_range, etag, or a body shorter than `after`
        finally:
            conn.close()

    def _drip(self, up, chunked: bool, every: float) -> None:
        """The upstream's body a byte at a time, until it ends, the client goes or the proxy stops."""
        proxy: FaultProxy = self.server.proxy
        body = up.read()
        for i in range(len(body)):
            if proxy._stopping.wait(every):
                break
            try:
                self.wfile.write(b"1\r\n%s\r\n" % body[i : i + 1] if chunked else body[i : i + 1])
                self.wfile.flush()
            except OSError:  # the client cut it
                break
        else:
            if chunked:
                self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def _end_connection(self, reset: bool) -> None:
        self.close_connection = True
        if reset:
            # RST, not FIN: linger 0, then close the descriptor itself (the socket object's close
            # would wait for the handler's file objects to let go of it)
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            os.close(self.connection.detach())
        else:
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # a client gone mid-answer is no news; anything is kept for a test that wonders
        self.proxy.errors.append(sys.exc_info()[1])


class FaultProxy:
    """See the module docstring."""

    def __init__(self, upstream: str, host: str = "127.0.0.1"):
        parts = urllib.parse.urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host, self.upstream_port = parts.hostname, parts.port or 80
        self.requests: list[ProxiedRequest] = []
        self.faults: list[Fault] = []
        self.errors: list[BaseException] = []  # raised while handling a request (a client gone...)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = _Server((host, 0), _Handler)
        self._server.proxy = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="fault-proxy", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def add(self, kind: str, **kw) -> Fault:
        fault = Fault(kind, **kw)
        with self._lock:
            self.faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.requests.clear()

    def seen(self, path_pattern: str = "", method: str = "GET") -> list[ProxiedRequest]:
        """The recorded requests whose path matches `path_pattern` (a regular expression)."""
        with self._lock:
            return [r for r in self.requests if r.method == method and re.search(path_pattern, r.path)]

    def _take(self, method: str, path: str, range_header: str | None) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path, range_header):
                    fault.times -= 1
                    return fault
        return None
