"""Real local servers for remote-access tests: moto's S3 and a Range-capable HTTP server.

Both listen on 127.0.0.1 on a free port, run in a thread for the test session, and count the
requests they serve, so tests can check that scans and reads are not latency-bound.
"""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.error import HTTPError


@dataclass
class Counter:
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str) -> None:
        with self.lock:
            self.requests.append(what)

    def reset(self) -> None:
        with self.lock:
            self.requests.clear()

    def __len__(self) -> int:
        return len(self.requests)


@dataclass
class S3Server:
    endpoint: str
    counter: Counter
    bucket: str = "refgrid-tests"

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing",
                "client_kwargs": {"region_name": "us-east-1"}}

    def upload(self, local: Path, key: str) -> str:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing",
                              aws_secret_access_key="testing", region_name="us-east-1")
        client.upload_file(str(local), self.bucket, key)
        return f"s3://{self.bucket}/{key}"


def start_s3() -> Iterator[S3Server]:
    import boto3
    from moto.server import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "testing")
    counter = Counter()
    app = DomainDispatcherApplication(create_backend_app)

    def counting(environ, start_response):
        counter.add(f"{environ['REQUEST_METHOD']} {environ.get('PATH_INFO')} "
                    f"{environ.get('HTTP_RANGE', '')}")
        return app(environ, start_response)

    server = make_server("127.0.0.1", 0, counting, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    s3 = S3Server(endpoint, counter)
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                 aws_secret_access_key="testing", region_name="us-east-1").create_bucket(
        Bucket=s3.bucket)
    try:
        yield s3
    finally:
        server.shutdown()
        server.server_close()


class _RangeHandler(SimpleHTTPRequestHandler):
    """Static files with single ``Range: bytes=a-b`` support, as fsspec's HTTP client needs."""

    counter: Counter
    ignore_range = False
    """Answer every request with the whole file (200), as ``python -m http.server`` does."""
    die_after: int | None = None
    """Send only this many bytes of any body, then drop the connection (a dying server)."""
    listings = False
    """Answer a directory with its listing page, as ``python -m http.server`` does."""

    def log_message(self, *args: Any) -> None:  # keep test output quiet
        pass

    def send_head(self):
        self.counter.add(f"{self.command} {self.path} {self.headers.get('Range', '')}")
        path = Path(self.translate_path(self.path))
        if path.is_dir() and self.listings:
            return super().send_head()
        if not path.is_file():
            self.send_error(404)
            return None
        size = path.stat().st_size
        spec = None if self.ignore_range else self.headers.get("Range")
        start, end = 0, size - 1
        if spec and spec.startswith("bytes="):
            first, _, last = spec[6:].partition("-")
            start = int(first) if first else max(0, size - int(last))
            end = min(int(last), size - 1) if first and last else end
        f = open(path, "rb")  # noqa: SIM115 (closed by copyfile's caller)
        f.seek(start)
        self.send_response(206 if spec else 200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        if spec:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if self.die_after is not None and self.command == "GET":
            self.wfile.write(f.read(min(self.die_after, end - start + 1)))
            f.close()
            self.close_connection = True
            self.connection.shutdown(2)  # mid-body: the client sees a truncated answer
            return None
        return _Limited(f, end - start + 1)


class _Limited:
    def __init__(self, f: Any, n: int) -> None:
        self.f, self.n = f, n

    def read(self, size: int = -1) -> bytes:
        if self.n <= 0:
            return b""
        data = self.f.read(self.n if size < 0 else min(size, self.n))
        self.n -= len(data)
        return data

    def close(self) -> None:
        self.f.close()


@dataclass
class HTTPServer:
    url: str
    root: Path
    counter: Counter


def start_http(root: Path, ignore_range: bool = False,
               die_after: int | None = None, host: str = "127.0.0.1",
               listings: bool = False) -> Iterator[HTTPServer]:
    counter = Counter()
    handler = type("Handler", (_RangeHandler,), {"counter": counter, "die_after": die_after,
                                                 "ignore_range": ignore_range,
                                                 "listings": listings})
    server = ThreadingHTTPServer((host, 0), lambda *a: handler(*a, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield HTTPServer(f"http://{host}:{server.server_port}", root, counter)
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Served:
    """``refgrid serve`` running in a thread: its base URL and its aiohttp application."""

    url: str
    app: Any

    def settles(self, check: Callable[[Any], bool], within: float = 30.0) -> bool:
        """Whether ``check(app)`` becomes true within ``within`` seconds. A client has a
        response's last byte before the handler's own cleanup runs (what it held is given
        back after ``write_eof`` returns, on the service's thread), so a count a handler
        gives back is asserted as settling, not as already settled when the body arrives.
        The bound is for a handler that never gives back, not a timing."""
        deadline = time.monotonic() + within
        while not check(self.app):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def start_refgrid_serve(root: Path, **options: Any) -> Iterator[Served]:
    """The service on a real socket on 127.0.0.1 (a free port), its loop in a thread."""
    import asyncio

    from aiohttp import web

    from refgrid.serve import make_app
    from refgrid.serve.app import AccessLog

    app = make_app(str(root), **options)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, **AccessLog.options())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield Served(f"http://127.0.0.1:{port}", app)
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def http_get(url: str, headers: dict[str, str] | None = None,
             method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One request: its status, headers and body (error statuses too)."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except HTTPError as e:
        return e.code, dict(e.headers), e.read()
