"""What every handler of the service shares: its settings and state, the thread hop, the
request limits (the memory budget among them), the caching headers, and the one mapping of
failures to HTTP statuses (the Zarr endpoints answer them as JSON, the OPeNDAP ones as DAP
error responses)."""

from __future__ import annotations

import asyncio
import collections
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
MEMORY_BUDGET = 512 * 2**20
"""Bytes of response buffers the service holds at once, all requests together
(:class:`Budget`)."""
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
    memory_budget: int = MEMORY_BUDGET


class State:
    """Per-app mutable state: the chunk requests and DAP responses in flight, and the bytes
    of their buffers."""

    def __init__(self, memory_budget: int = MEMORY_BUDGET) -> None:
        self.pending = 0
        self.budget = Budget(memory_budget)


class Budget:
    """The bytes of response buffers in flight, service-wide: Zarr chunk bodies and OPeNDAP
    blocks (and the opening a data response reads before it starts). A buffer's bytes are
    taken before it is read and given back once it is written or dropped; a request whose
    buffer does not fit is refused (503 with ``Retry-After``) before it starts. A response
    already started waits for its next block's bytes instead (:meth:`wait`, within the
    request's time): it holds none while it waits — its blocks so far are written and given
    back, and it reads ahead only what fits at once — so started responses never wait on one
    another, and the waiting are served first, in turn. Only the event loop touches it."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.peak = 0
        """The most bytes held at once (for measurement)."""
        self._waiting: collections.deque[tuple[int, asyncio.Future[None]]] = \
            collections.deque()

    def take(self, n: int) -> bool:
        """``n`` bytes now, if they fit and no started response is waiting for some."""
        if self._waiting or self.held + n > self.limit:
            return False
        self._hold(n)
        return True

    async def wait(self, n: int, timeout: float) -> None:
        """``n`` bytes once they fit (after those waiting before), or a TimeoutError after
        ``timeout`` seconds."""
        if self.take(n):
            return
        future = asyncio.get_running_loop().create_future()
        entry = (n, future)
        self._waiting.append(entry)
        try:
            async with asyncio.timeout(timeout):
                await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.give(n)  # (granted as it timed out)
            else:
                self._waiting.remove(entry)
                self._wake()
            raise

    def give(self, n: int) -> None:
        """``n`` bytes given back: they go to the waiting first."""
        self.held -= n
        self._wake()

    def _hold(self, n: int) -> None:
        self.held += n
        self.peak = max(self.peak, self.held)

    def _wake(self) -> None:
        while self._waiting and self.held + self._waiting[0][0] <= self.limit:
            n, future = self._waiting.popleft()
            self._hold(n)
            future.set_result(None)

    def refused(self, n: int) -> HttpError:
        """The 503 a request is answered with when its ``n`` bytes do not fit."""
        if n > self.limit:
            return HttpError(503, f"this response needs {n:,} bytes of buffers at once, more "
                             f"than the service's whole memory budget of {self.limit:,}")
        return HttpError(503, f"busy: {self.held:,} bytes of responses in flight, and "
                         f"{n:,} more would exceed the service's memory budget of "
                         f"{self.limit:,}", {"Retry-After": "1"})


class Share:
    """What one response holds of the :class:`Budget` (given back whole by :meth:`close`,
    however it ends); :attr:`started` once its first byte is sent."""

    def __init__(self, request: web.Request) -> None:
        self.budget = request.app[STATE].budget
        self.timeout = request.app[SETTINGS].request_timeout
        self.held = 0
        self.started = False

    async def take(self, n: int) -> None:
        """``n`` bytes: at once before the response starts (else the 503 of
        :meth:`Budget.refused`), waited for after."""
        if not self.budget.take(n):
            if not self.started or n > self.budget.limit:
                raise self.budget.refused(n)
            await self.budget.wait(n, self.timeout)
        self.held += n

    def try_take(self, n: int) -> bool:
        """``n`` bytes if they fit now (to read ahead)."""
        if self.budget.take(n):
            self.held += n
            return True
        return False

    def give(self, n: int) -> None:
        if n:
            self.held -= n
            self.budget.give(n)

    def close(self) -> None:
        self.give(self.held)


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


@contextlib.asynccontextmanager
async def reserved(request: web.Request, n: int) -> AsyncIterator[None]:
    """``n`` bytes of the service's memory budget while the block runs (refused, 503, when
    they do not fit)."""
    share = Share(request)
    try:
        await share.take(n)
        yield
    finally:
        share.close()


async def written(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """``response`` sent now, within the request's time (a client that stops reading is
    disconnected), so that what it holds can be given back after it."""
    try:
        async with asyncio.timeout(request.app[SETTINGS].request_timeout):
            await response.prepare(request)
            await response.write_eof()
    except (TimeoutError, ConnectionError):
        if request.transport is not None:
            request.transport.abort()
    return response


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
