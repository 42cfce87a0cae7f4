"""What every handler of the service shares: its settings and state, the thread hop, the
request limits, the caching headers, and the one mapping of failures to HTTP statuses (the
Zarr endpoints answer them as JSON, the OPeNDAP ones as DAP error responses)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar, TypeVarTuple

from aiohttp import web

from refgrid.errors import AccessError, ArgumentError, NotFoundError, ReadError, RefgridError
from refgrid.serve.catalog import Catalog, Dataset, Entry

log = logging.getLogger("refgrid.serve")
INDEX_DETAILS = 50
"""The index opens (and describes) at most this many datasets; the rest are listed by name."""
DAP_MAX_BYTES = 2**30
"""The largest OPeNDAP data response, in bytes of values (larger ones are refused: 413)."""
T = TypeVar("T")
Args = TypeVarTuple("Args")


@dataclass(frozen=True)
class Settings:
    """What a deployment tunes (see :func:`refgrid.serve.app.make_app`)."""

    request_timeout: float = 60.0
    max_pending: int = 4096
    max_age: int = 60
    index_details: int = INDEX_DETAILS
    dap_max_bytes: int = DAP_MAX_BYTES


class State:
    """Per-app mutable state: the chunk requests and DAP responses in flight."""

    def __init__(self) -> None:
        self.pending = 0


class HttpError(Exception):
    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


CATALOG: web.AppKey[Catalog] = web.AppKey("catalog", Catalog)
SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
POOL: web.AppKey[ThreadPoolExecutor] = web.AppKey("pool", ThreadPoolExecutor)
STATE: web.AppKey[State] = web.AppKey("state")


def failure(error: BaseException, settings: Settings) -> tuple[int, str, dict[str, str]] | None:
    """The status, one-line reason and headers a failure is answered with; None for a bug
    (logged with its traceback by the caller, answered as a 500)."""
    if isinstance(error, HttpError):
        return error.status, error.reason, error.headers
    if isinstance(error, web.HTTPException) and error.status >= 400:
        return error.status, error.reason, ({"Allow": error.headers["Allow"]}
                                            if "Allow" in error.headers else {})
    if isinstance(error, AccessError):
        return 403, str(error), {}
    if isinstance(error, ArgumentError):
        return 400, str(error), {}
    if isinstance(error, ReadError | NotFoundError):  # a source unreadable, or not there
        return 502, str(error), {}
    if isinstance(error, RefgridError):
        return 500, f"cannot serve it: {error}", {}
    if isinstance(error, TimeoutError):
        return 504, f"the request took longer than {settings.request_timeout:g} s", {}
    return None


def answer(request: web.Request, error: BaseException,
           what: str = "failed") -> tuple[int, str, dict[str, str]]:
    """The status, reason and headers ``error`` is answered with (:func:`failure`); a bug
    is logged with its traceback (``what`` says when it happened) and answered as a 500
    with one line."""
    found = failure(error, request.app[SETTINGS])
    if found is not None:
        return found
    log.error("%s %s %s", request.method, request.path, what, exc_info=error)
    return 500, f"internal error: {type(error).__name__}", {}


async def in_pool(request: web.Request, fn: Callable[[*Args], T], *args: *Args) -> T:
    """``fn(*args)`` on the service's threads, within the request's time."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(request.app[SETTINGS].request_timeout):
        return await loop.run_in_executor(request.app[POOL], fn, *args)


@contextlib.asynccontextmanager
async def admitted(request: web.Request, what: str = "chunk requests") -> AsyncIterator[None]:
    """One more request in flight, refused (503) when too many are waiting."""
    state, settings = request.app[STATE], request.app[SETTINGS]
    if state.pending >= settings.max_pending:
        raise HttpError(503, f"busy: {state.pending} {what} waiting", {"Retry-After": "1"})
    state.pending += 1
    try:
        yield
    finally:
        state.pending -= 1


async def waiting(request: web.Request, work: Awaitable[T]) -> T:
    """``work`` awaited within the request's time, refused when too much is waiting."""
    async with admitted(request), asyncio.timeout(request.app[SETTINGS].request_timeout):
        return await work


async def dataset_of(request: web.Request, entry: Entry) -> Dataset:
    """The opened dataset of ``entry`` (opened on a worker thread when it is not fresh)."""
    catalog = request.app[CATALOG]
    fresh = catalog.fresh(entry.name)
    if fresh is not None:
        return fresh  # no thread hop
    dataset: Dataset = await in_pool(request, catalog.dataset, entry)
    return dataset


def http_date(seconds: float) -> str:
    return datetime.fromtimestamp(int(seconds), UTC).strftime("%a, %d %b %Y %H:%M:%S GMT")


def caching(request: web.Request, dataset: Dataset, etag: str) -> dict[str, str]:
    """A growing archive's responses are revalidated every time (``no-cache``: a cache asks
    with the ETag and gets a 304 while the bytes are the same): the last chunk along the
    growing dimension gains values with each append, and a cached copy of an earlier
    version's would be read as the fill value by a reader holding the later metadata."""
    cache = "public, no-cache" if dataset.growing is not None else \
        f"public, max-age={request.app[SETTINGS].max_age}"
    return {"ETag": etag, "Last-Modified": http_date(dataset.modified),
            "Cache-Control": cache}


def not_modified(request: web.Request, dataset: Dataset, etag: str) -> web.Response | None:
    """A 304 when the client's copy is current (``If-None-Match`` first, else
    ``If-Modified-Since``), else None."""
    match = request.headers.get("If-None-Match")
    if match is not None:
        tags = {t.strip().removeprefix("W/") for t in match.split(",")}
        fresh = "*" in tags or etag.removeprefix("W/") in tags
    else:
        since = request.if_modified_since
        fresh = since is not None and since.timestamp() >= int(dataset.modified)
    if not fresh:
        return None
    return web.Response(status=304, headers=caching(request, dataset, etag))
