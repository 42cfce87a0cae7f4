"""Timeouts and retries for remote sources, so that nothing waits forever and transient
failures do not fail a scan or a read.

:func:`with_defaults` adds refgrid's defaults (:mod:`refgrid.core.bounds`:
``connect_timeout``, ``read_timeout``, ``attempts``, ``retry_seconds``) to the storage options
of an ``http(s)://`` or ``s3://`` URL, where the caller has not set them:

* HTTP: aiohttp's connect and socket-read timeouts, and :class:`Retrying`, an aiohttp client
  middleware that retries a GET or HEAD on 429/500/502/503/504, a reset connection, a body cut
  short or a timeout (a timeout once only: :data:`STALL_ATTEMPTS`), with exponential backoff,
  within ``retry_seconds``; the body is read
  inside the middleware, so a connection reset mid-body is retried too. When the attempts are
  spent, :class:`RequestFailed` says how many were made over how long.
* S3: botocore's connect and read timeouts and its standard retry mode with ``attempts``.

fsspec asks an HTTP file's ``info`` with a HEAD and, whatever made that fail, again with a GET;
:func:`remote_info` skips the GET when the HEAD got no answer at all (it stalled or found no
server on every attempt), so a stalled source costs ``STALL_ATTEMPTS`` read timeouts, not
twice that.

A retry asks for the same bytes of the same URL; the source identity check (size, mtime or
ETag, :mod:`refgrid.core.sources`) still decides whether they are the bytes scanned.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

import aiohttp
import fsspec
from fsspec.asyn import sync
from fsspec.implementations.http import HTTPFileSystem, _file_info

from refgrid.core.bounds import STALL_ATTEMPTS, current
from refgrid.core.typed import StorageOptions

TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})
IDEMPOTENT = frozenset({"GET", "HEAD"})

FIRST_DELAY = 0.1
"""Seconds before the first retry; doubled for each further one."""


class RequestFailed(aiohttp.ClientError, OSError):
    """A request still failing after every attempt (an ``OSError``, as a failed read is).
    Not one of aiohttp's connection errors: aiohttp sends an idempotent request again, once,
    when its handler raises one of those, which would run every attempt twice (a stalled
    source held for four read timeouts where two are allowed)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    def __str__(self) -> str:
        return self.message


def _what(error: BaseException, timeouts: tuple[float, float]) -> str:
    if isinstance(error, aiohttp.ConnectionTimeoutError):
        return f"no connection within {timeouts[0]:g} s (connect timeout)"
    if isinstance(error, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return f"no bytes for {timeouts[1]:g} s (read timeout)"
    if isinstance(error, aiohttp.ClientPayloadError):
        return f"the body was cut short ({error})"
    return f"{type(error).__name__}: {error}"


@dataclass(frozen=True)
class Retrying:
    """aiohttp client middleware: a GET or HEAD retried on transient failures, with the
    limits in force where its filesystem was made (the middleware runs on fsspec's event loop
    thread, outside the caller's ``with refgrid.limits(...)``). A frozen dataclass: equal
    limits make equal storage options, so fsspec reuses its filesystem instances."""

    attempts: int
    retry_seconds: float
    timeouts: tuple[float, float]
    """Connect and read timeouts, for messages."""

    async def __call__(self, request: aiohttp.ClientRequest,
                       handler: aiohttp.ClientHandlerType) -> aiohttp.ClientResponse:
        if request.method not in IDEMPOTENT:
            return await handler(request)
        started, delay, attempt = time.monotonic(), FIRST_DELAY, 0
        while True:
            attempt += 1
            try:
                response = await handler(request)
                if response.status not in TRANSIENT_STATUS:
                    if response.status < 300:
                        await response.read()  # a reset mid-body is retried here
                    return response
                problem, status = f"HTTP {response.status} {response.reason}", response.status
                response.release()
            except (TimeoutError, aiohttp.ClientConnectionError,
                    aiohttp.ClientPayloadError) as e:
                problem, status = _what(e, self.timeouts), None
                stalled = isinstance(e, TimeoutError | aiohttp.ServerTimeoutError)
            else:
                stalled = False
            elapsed = time.monotonic() - started
            allowed = min(self.attempts, STALL_ATTEMPTS) if stalled else self.attempts
            if attempt >= allowed or elapsed + delay > self.retry_seconds:
                raise RequestFailed(f"{request.method} {request.url}: {problem} ({attempt} "
                                    f"attempt{'s' if attempt > 1 else ''} over "
                                    f"{elapsed:.1f} s)", status)
            await asyncio.sleep(delay)
            delay *= 2


def with_defaults(url: str, storage_options: StorageOptions) -> dict[str, object]:
    """``storage_options`` with refgrid's timeouts and retries for ``url``'s protocol added
    where the caller set none."""
    options = dict(storage_options)
    protocol = url.split("://", 1)[0].lower() if "://" in url else "file"
    limits = current()
    if protocol in ("http", "https"):
        client = dict(cast("Mapping[str, object]", options.get("client_kwargs") or {}))
        client.setdefault("timeout", aiohttp.ClientTimeout(
            total=None, connect=limits.connect_timeout, sock_connect=limits.connect_timeout,
            sock_read=limits.read_timeout))
        client.setdefault("middlewares", (Retrying(
            limits.attempts, limits.retry_seconds,
            (limits.connect_timeout, limits.read_timeout)),))
        options["client_kwargs"] = client
    elif protocol in ("s3", "s3a"):
        config = dict(cast("Mapping[str, object]", options.get("config_kwargs") or {}))
        config.setdefault("connect_timeout", limits.connect_timeout)
        config.setdefault("read_timeout", limits.read_timeout)
        config.setdefault("retries", {"max_attempts": limits.attempts, "mode": "standard"})
        options["config_kwargs"] = config
    return options


def remote_info(fs: fsspec.AbstractFileSystem, path: str) -> dict[str, object]:
    """fsspec's ``info`` of a remote file — over HTTP asked as fsspec asks it (a HEAD, then
    a GET where the HEAD gave no size or an answer such as 404 or 405 from a server that does
    not do HEAD), each request once: a request that failed on every attempt
    (:class:`RequestFailed`: a stalled or unreachable server, a 5xx) is raised as it is, not
    asked again by GET, which would wait as long again."""
    if not isinstance(fs, HTTPFileSystem):
        return dict(fs.info(path))
    info: dict[str, object] = {}
    for policy in ("head", "get"):
        try:
            info.update(sync(fs.loop, _asked, fs, path, policy))
        except RequestFailed:
            raise
        except Exception as e:  # answered, but not as info needs
            if policy == "get":
                raise FileNotFoundError(path) from e  # (as fsspec's info says it)
            continue
        if info.get("size") is not None:
            break
    return {"name": path, "size": None, **info, "type": "file"}  # (as fsspec's info)


async def _asked(fs: HTTPFileSystem, path: str, policy: str) -> dict[str, object]:
    info: dict[str, object] = await _file_info(fs.encode_url(path), await fs.set_session(),
                                               size_policy=policy, **fs.kwargs)
    return info
