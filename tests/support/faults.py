"""A fault-injecting HTTP proxy on 127.0.0.1, between refgrid and the local HTTP or S3 server.

Each request is forwarded to the upstream server unless the proxy's ``fault`` policy (a
function of the request's number, method and path) names a fault to inject instead:

* ``"latency"``: wait ``LATENCY`` seconds, then forward;
* ``"stall"``: accept the request and send nothing for ``STALL`` seconds, then close;
* ``"reset"``: send the headers and half the body, then reset the connection;
* ``"truncate"``: send the headers (full length) and half the body, then close;
* ``"503"`` (any status): answer it, with no body;
* ``"norange"``: forward without the ``Range`` header, so the whole file comes back.

Bounded: every socket has a timeout, a stall lasts ``STALL`` seconds at most, and the
server stops when its fixture ends.
"""

from __future__ import annotations

import http.client
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

Policy = Callable[[int, str, str], str | None]
LATENCY = 0.05
STALL = 8.0
HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
       "upgrade"}


@dataclass
class Proxy:
    url: str
    upstream: str
    fault: Policy = lambda n, method, path: None
    log: list[tuple[str, str, str | None]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    count: int = 0

    def next(self, method: str, path: str) -> str | None:
        with self.lock:
            self.count += 1
            fault = self.fault(self.count, method, path)
            self.log.append((method, path, fault))
            return fault

    def reset(self, fault: Policy | None = None) -> None:
        with self.lock:
            self.count = 0
            self.log.clear()
            self.fault = fault or (lambda n, method, path: None)


def _handler(proxy: Proxy) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(proxy.upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30

        def log_message(self, *args: object) -> None:
            pass

        def _forward(self) -> None:
            fault = proxy.next(self.command, self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if fault == "stall":
                time.sleep(STALL)
                self.close_connection = True
                return
            if fault and fault.isdigit():
                self.send_response(int(fault))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if fault == "latency":
                time.sleep(LATENCY)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
            if fault == "norange":
                headers.pop("Range", None)
                headers.pop("range", None)
            connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                answer = connection.getresponse()
                data = answer.read()
            finally:
                connection.close()
            self.send_response(answer.status, answer.reason)
            for key, value in answer.getheaders():
                if key.lower() not in HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", answer.getheader("Content-Length", "0")
                             if self.command == "HEAD" else str(len(data)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if fault in ("reset", "truncate") and len(data) > 1:
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                if fault == "reset":  # RST, not FIN
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                               struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

    return Handler


def start_proxy(upstream: str) -> Iterator[Proxy]:
    """The proxy in a thread for the fixture's lifetime (``upstream``: ``http://host:port``)."""
    proxy = Proxy("", upstream)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    proxy.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1},
                              daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        server.shutdown()
        server.server_close()


def every_other(status: str = "503") -> Policy:
    """``status`` for every other request (the 2nd, 4th, ...)."""
    return lambda n, method, path: status if n % 2 == 0 else None


def first_of_each(fault: str, methods: tuple[str, ...] = ("GET",)) -> Policy:
    """``fault`` for the first request of each path and range (then forwarded as is)."""
    seen: set[tuple[str, str]] = set()
    lock = threading.Lock()

    def policy(n: int, method: str, path: str) -> str | None:
        with lock:
            if method not in methods or (method, path) in seen:
                return None
            seen.add((method, path))
            return fault
    return policy
