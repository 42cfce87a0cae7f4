"""The aiohttp application: URLs → catalog → views, with HTTP's caching and range rules.

URL layout::

    /                                 the datasets (HTML)
    /healthz                          liveness and the dataset count (JSON)
    /<name>/                          one dataset: arrays, chunk pictures, how to open it
    /<name>/native/<key>              the dataset as it is (Zarr v3 keys)
    /<name>/regular/<key>             the regular-grid view stock zarr 3.1 reads
    /<name>/regular;chunks=time:30;unpack=true/<key>
                                      another regular view (also as ?chunks=...&unpack=...)
    /dap/<name>.dds .das .dods .ascii the dataset over DAP2 (:mod:`refgrid.serve.dap`)
    /dap/<name>.dmr .dmr.xml .dap     ... and DAP4; /dap/<name>: how to open it

The event loop only routes and answers: opening a dataset, fetching and assembling chunks run
on a bounded thread pool, native chunk reads of concurrent requests gathered into batched
fetches (:mod:`refgrid.read.batching`). Absent chunks are 404, which Zarr reads as the fill
value, exactly as from a store on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import hashlib
import hmac
import json
import logging
import math
import os
import socket
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, Unpack
from urllib.parse import unquote

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from refgrid.core.typed import StorageOptions
from refgrid.errors import AccessError, ArgumentError, RefgridError
from refgrid.read.regular import ViewLimits, ViewSpec
from refgrid.read.view import Chunk, Directory, Document, View
from refgrid.serve.catalog import Catalog, Dataset, Entry, Followed, collisions
from refgrid.serve.dap.responses import error_response, respond, split_suffix
from refgrid.serve.follow import Follow, Follower
from refgrid.serve.guard import GuardedSite
from refgrid.serve.http import (
    CATALOG,
    DAP_MAX_BYTES,
    MEMORY_BUDGET,
    POOL,
    SETTINGS,
    STATE,
    HttpError,
    Settings,
    State,
    answer,
    caching,
    dataset_of,
    failure,
    in_pool,
    not_modified,
    reserved,
    waiting,
    written,
)
from refgrid.serve.pages import (
    Unavailable,
    dataset_page,
    index_page,
    listing_page,
    unavailable_page,
)

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

log = logging.getLogger("refgrid.serve")
FOLLOWERS: web.AppKey[dict[str, Follower]] = web.AppKey("followers")
TOKEN: web.AppKey[str | None] = web.AppKey("refresh-token")
TASKS: web.AppKey[list[asyncio.Task[None]]] = web.AppKey("follow-tasks")
HEADER_TIMEOUT = 10.0
"""Seconds a client has to send a request's line and headers (a web server's usual bound)."""


class AppOptions(TypedDict, total=False):
    """The keyword arguments of :func:`make_app` after ``allow_sources``."""

    storage_options: StorageOptions | None
    workers: int
    capacity: int
    recheck: float
    request_timeout: float
    max_pending: int
    max_age: int
    limits: ViewLimits | None
    follow: Sequence[Follow]
    state: str | os.PathLike[str] | None
    refresh_token: str | None
    dap_max_bytes: int
    memory_budget: int
    strict_sources: bool


class RunOptions(AppOptions, total=False):
    """The keyword arguments :func:`run` passes on to :func:`make_app`."""

    allow_sources: tuple[str, ...]


class AccessLogOptions(TypedDict):
    """The access-log arguments of ``web.run_app`` / ``web.AppRunner``."""

    access_log_class: type[AbstractAccessLogger]
    access_log: logging.Logger


def make_app(root: str, allow_sources: tuple[str, ...] = (), *,
             storage_options: StorageOptions | None = None, workers: int = 8,
             capacity: int = 32, recheck: float = 1.0, request_timeout: float = 60.0,
             max_pending: int = 4096, max_age: int = 60,
             limits: ViewLimits | None = None, follow: Sequence[Follow] = (),
             state: str | os.PathLike[str] | None = None,
             refresh_token: str | None = None,
             dap_max_bytes: int = DAP_MAX_BYTES,
             memory_budget: int = MEMORY_BUDGET,
             strict_sources: bool = False) -> web.Application:
    """The service for the datasets under ``root``, as an aiohttp application to run or embed.

    ``allow_sources``: prefixes (paths or URLs) source files may lie under besides ``root``.
    ``workers``: threads that open datasets and fetch, decode and assemble chunks.
    ``capacity``: opened datasets kept; ``recheck``: seconds between checks that a dataset's
    file is unchanged (a changed one is reopened). ``request_timeout``: seconds one request may
    take (504 after). ``max_pending``: chunk requests waiting at once (503 past it).
    ``max_age``: ``Cache-Control`` max-age. ``limits``: the largest regular-view chunk, in
    bytes and in native chunks assembled.

    ``follow``: growing archives kept current and served under their names
    (:mod:`refgrid.serve.follow`); their references and the batch's records live in
    ``state`` (default ``ROOT/.refgrid-follow``), so a restarted service resumes there.
    ``refresh_token``: the bearer token ``POST /NAME/refresh`` needs (without one, refresh
    is disabled: 403).

    ``dap_max_bytes``: the largest OPeNDAP data response, in bytes of values (a larger one
    is refused with a 413 naming its size: the client asks for a hyperslab instead).
    ``memory_budget``: bytes of response buffers held at once, all requests together (Zarr
    chunk bodies, OPeNDAP blocks; :class:`~refgrid.serve.http.Budget`): a request that
    would exceed it is refused (503, ``Retry-After``) before it starts.

    Every read of a local source is checked to be of the version the dataset's references
    record (size, modification time, the same file: a source rewritten or replaced while
    it is served fails the response, 502, never mixes versions); ``strict_sources`` also
    asks its change time, which notices a rewrite whose modification time was put back (a
    ``chmod`` or a new hard link then counts as a change too).
    """
    for name, value in (("dap_max_bytes", dap_max_bytes), ("memory_budget", memory_budget)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ArgumentError(f"{name} must be a positive number of bytes, not {value!r}")
    state_dir = Path(state) if state is not None else Path(root) / ".refgrid-follow"
    if refresh_token is not None and not refresh_token.strip():
        raise ArgumentError("the refresh token is empty: give one, or none to disable refresh")
    names = [f.name for f in follow]
    if len(set(names)) != len(names):
        raise ArgumentError(f"each followed archive needs a name of its own: {names}")
    followers = {f.name: Follower(f.checked(), state_dir, storage_options) for f in follow}
    pool = ThreadPoolExecutor(workers, thread_name_prefix="refgrid-serve")
    followed_sources = (*(f.source_prefix for f in follow), str(state_dir.resolve())) \
        if follow else ()  # (the state holds followed archives' rewritten chunks)
    catalog = Catalog(root, (*allow_sources, *followed_sources), capacity,
                      recheck, storage_options, limits or ViewLimits(), pool,
                      {name: Followed(f.output, f.follow.concat_dim)
                       for name, f in followers.items()},
                      "strict" if strict_sources else True)
    for name, follower in followers.items():
        follower.on_version = functools.partial(catalog.publish, name)
    app = web.Application(middlewares=[_errors], client_max_size=4096)
    app[CATALOG] = catalog
    app[SETTINGS] = Settings(request_timeout, max_pending, max_age,
                             dap_max_bytes=dap_max_bytes, memory_budget=memory_budget)
    app[POOL] = pool
    app[STATE] = State(memory_budget)
    app[FOLLOWERS] = followers
    app[TOKEN] = refresh_token
    app.router.add_get("/healthz", _health)
    app.router.add_post("/{name:.+}/refresh", _refresh)
    app.router.add_get("/{name:.+}/status", _status)
    app.router.add_route("OPTIONS", "/{tail:.*}", _preflight)
    app.router.add_get("/dap/{tail:.+}", _dap)
    app.router.add_get("/{tail:.*}", _get)
    app.on_response_prepare.append(_cors)
    app.on_startup.append(_start_following)
    app.on_cleanup.append(_close)
    return app


async def _start_following(app: web.Application) -> None:
    app[TASKS] = [asyncio.create_task(f.run(), name=f"refgrid-follow-{name}")
                  for name, f in app[FOLLOWERS].items()]


async def _refresh(request: web.Request) -> web.StreamResponse:
    """``POST /NAME/refresh``: a round now (for S3 events or cron), with the start-up token."""
    follower = request.app[FOLLOWERS].get(request.match_info["name"])
    if follower is None:
        raise HttpError(404, f"/{request.match_info['name']} is not a followed archive")
    token = request.app[TOKEN]
    if token is None:
        raise HttpError(403, "refresh is disabled: start the service with a refresh token")
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
    if not hmac.compare_digest(given, token.encode()):
        raise HttpError(401, "refresh needs the service's token (Authorization: Bearer ...)",
                        {"WWW-Authenticate": "Bearer"})
    follower.wake.set()
    return web.json_response({"status": 202, "refresh": follower.follow.name}, status=202)


async def _status(request: web.Request) -> web.StreamResponse:
    """``GET /NAME/status`` of a followed archive (any other path ending in ``status`` is a
    dataset's)."""
    follower = request.app[FOLLOWERS].get(request.match_info["name"])
    if follower is None:
        return await _get(request)
    return web.json_response(follower.status.to_dict(), headers={"Cache-Control": "no-store"})


async def _close(app: web.Application) -> None:
    for task in app.get(TASKS, []):
        task.cancel()
    app[POOL].shutdown(wait=False, cancel_futures=True)
    app[CATALOG].close()  # (the files its datasets' views keep open)
    for follower in app[FOLLOWERS].values():  # (another service may follow them now)
        follower.close()


# -- middleware and signals ------------------------------------------------------------------

CORS = {"Access-Control-Allow-Origin": "*",
        "Access-Control-Expose-Headers": "ETag, Last-Modified, Content-Range, Content-Length, "
                                         "Accept-Ranges, Content-Encoding"}


async def _cors(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(CORS)


async def _preflight(request: web.Request) -> web.Response:
    return web.Response(status=204, headers={
        "Access-Control-Allow-Methods": "GET, HEAD, OPTIONS",
        "Access-Control-Allow-Headers": "Range, If-None-Match, If-Modified-Since, If-Range, "
                                        "Content-Type",
        "Access-Control-Max-Age": "86400"})


def _error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"status": status, "error": reason}, status=status,
                             headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure is a status and a one-line reason (JSON); never a traceback."""
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return _failed(request, e)
    except Exception as e:
        return _failed(request, e)


def _failed(request: web.Request, error: Exception) -> web.Response:
    status, reason, headers = answer(request, error)
    return _error(status, reason, headers or None)


class AccessLog(AbstractAccessLogger):
    """One JSON object a request on the ``refgrid.serve.access`` logger."""

    @staticmethod
    def options() -> AccessLogOptions:
        """The access-log arguments of ``web.run_app`` / ``web.AppRunner`` for these logs."""
        return {"access_log_class": AccessLog,
                "access_log": logging.getLogger("refgrid.serve.access")}

    def log(self, request: web.BaseRequest, response: web.StreamResponse,
            time: float) -> None:
        self.logger.info(json.dumps({
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "remote": request.remote, "method": request.method, "path": request.path_qs,
            "status": response.status, "bytes": response.body_length,
            "ms": round(time * 1000, 2), "range": request.headers.get("Range")}))


# -- handlers --------------------------------------------------------------------------------

async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "datasets": len(request.app[CATALOG].entries)})


def _parts(request: web.Request) -> list[str]:
    """The URL path's segments, refusing anything that could step out of a dataset."""
    raw = request.raw_path.split("?", 1)[0]
    segments = [unquote(s) for s in raw.split("/")]
    for s in segments:
        if s in (".", "..") or "\x00" in s or "\\" in s:
            raise HttpError(400, "path segments '.', '..', NUL and backslashes are refused")
    return [s for s in segments if s]


async def _get(request: web.Request) -> web.StreamResponse:
    catalog = request.app[CATALOG]
    parts = _parts(request)
    if not parts:
        return await _index(request)
    found = catalog.split(parts)
    if found is None:
        raise HttpError(404, f"no dataset at /{'/'.join(parts)}")
    entry, rest = found
    if not rest:
        return await _dataset_page(request, entry)
    dataset = await dataset_of(request, entry)
    view_name, _, params = rest[0].partition(";")
    key = "/".join(rest[1:])
    if view_name == "native":
        if not _spec(request, params, ("unpack",)).unpack:
            return await _serve(request, dataset, dataset.native, rest[0], "native", key)
        unpacked = dataset.unpacked
        view: View = unpacked if unpacked is not None else await in_pool(
            request, dataset.unpacked_view)
        return await _serve(request, dataset, view, rest[0], "native;unpack", key)
    if view_name == "regular":
        spec = _spec(request, params)
        regular = dataset.regular.get(spec)  # else made once, on a worker thread
        view = regular if regular is not None else await in_pool(
            request, dataset.regular_view, spec, catalog.limits)
        return await _serve(request, dataset, view, rest[0], str(spec), key)
    raise HttpError(404, f"{entry.name}: no view {rest[0]!r} (native or regular)")


async def _dap(request: web.Request) -> web.StreamResponse:
    """``/dap/NAME.SUFFIX``: the dataset over OPeNDAP (:mod:`refgrid.serve.dap`). A path
    that names no dataset with a DAP suffix is left to :func:`_get` (a dataset may lie in a
    directory called ``dap``)."""
    raw = request.raw_path.split("?", 1)[0]
    found = split_suffix(raw.rsplit("/", 1)[-1])
    kind = found[1] if found else "html"
    protocol = 4 if kind in ("dmr", "dap") else 2
    try:
        parts = _parts(request)[1:]
    except HttpError as e:
        return error_response(request, e, protocol)
    found = split_suffix(parts[-1]) if parts else None
    names = [*parts[:-1], found[0]] if found else parts
    located = request.app[CATALOG].split(names) if names else None
    if located is None or located[1]:
        if found is None:
            return await _get(request)
        return error_response(request, HttpError(404, f"no dataset /{'/'.join(names)} "
                                                 "(see / for the served datasets)"), protocol)
    try:
        dataset = await dataset_of(request, located[0])
    except Exception as e:
        return error_response(request, e, protocol)
    return await respond(request, dataset, kind)


def _spec(request: web.Request, params: str,
          allowed: tuple[str, ...] = ("chunks", "unpack")) -> ViewSpec:
    values = {k: v for k, v in request.query.items() if k in allowed}
    for item in params.split(";") if params else ():
        name, sep, value = item.partition("=")
        if not sep or name not in allowed:
            raise HttpError(400, f"unknown view parameter {item!r} "
                            f"({', '.join(f'{a}=...' for a in allowed)})")
        values[name] = value
    return ViewSpec.parse(values.get("chunks"), values.get("unpack"))


async def _index(request: web.Request) -> web.Response:
    catalog = request.app[CATALOG]

    def page() -> str:
        """The index, made on a worker thread (walking the root, opening datasets and
        counting their sources read files)."""
        names = catalog.names()
        entries = [catalog.entries[n] for n in names if n in catalog.entries]
        described: dict[str, Dataset | Unavailable] = {}
        for entry in entries[:request.app[SETTINGS].index_details]:
            try:
                described[entry.name] = catalog.dataset(entry)
            except RefgridError as e:
                described[entry.name] = _unavailable(request, e)
        return index_page(entries, described)

    return _html(request, await in_pool(request, page))


async def _dataset_page(request: web.Request, entry: Entry) -> web.Response:
    """``/NAME/``: the dataset's page, or, for one that cannot be opened, a page saying why
    with the status its endpoints answer."""
    if not request.path.endswith("/"):
        raise web.HTTPMovedPermanently(f"/{entry.name}/")
    try:
        dataset = await dataset_of(request, entry)
    except RefgridError as e:
        unavailable = _unavailable(request, e)
        return _html(request, unavailable_page(entry, unavailable), unavailable.status)
    return _html(request, await in_pool(request, dataset_page, dataset,  # (its sources
                                        f"{request.scheme}://{request.host}"))  # counted)


def _unavailable(request: web.Request, error: RefgridError) -> Unavailable:
    status, reason, _ = answer(request, error)
    return Unavailable(status, reason)


def _html(request: web.Request, text: str, status: int = 200) -> web.Response:
    response = web.Response(text=text, content_type="text/html", status=status, headers={
        "Cache-Control": "no-cache"})
    response.enable_compression()
    return response


# -- the views -------------------------------------------------------------------------------

async def _serve(request: web.Request, dataset: Dataset, view: View, segment: str, tag: str,
                 key: str) -> web.StreamResponse:
    """``key`` of one of the dataset's views (``tag`` tells the view apart in ETags), parsed
    once by the view."""
    found = view.parse(key)
    if found is None:
        raise HttpError(404, f"{dataset.entry.name}/{segment}: no key {key!r}")
    if isinstance(found, Document):
        return _metadata(request, dataset, found.text)
    if isinstance(found, Directory):
        return _listing(request, dataset, segment, key, found)
    size = await waiting(request, in_pool(request, _chunk_bytes, view, found))  # (a page of
    async with reserved(request, size):  # references, maybe) (held until it is sent)
        data = (await waiting(request, view.aread([found])))[0]
        if data is None:
            raise HttpError(404, f"{dataset.entry.name}/{segment}: chunk {key!r} is absent "
                            "(reads as the fill value)")
        etag = _chunk_etag(tag, data)
        unchanged = not_modified(request, dataset, etag)
        if unchanged is not None:
            return unchanged
        if request.method == "HEAD":
            return _chunk_head(request, dataset, etag, len(data))
        return await written(request, _chunk(request, dataset, data, etag))


def _chunk_bytes(view: View, chunk: Chunk) -> int:
    """The bytes a chunk's body holds: its stored length where the view knows it, else at
    most its decoded size (a view assembling, unpacking or cropping it makes values of up
    to 8 bytes from packed ones)."""
    size = view.size(chunk)
    if size is not None:
        return size
    array = view.arrays[chunk.array]
    return math.prod(array.grid.encoded_chunk_shape(chunk.coords)) * \
        max(array.dtype.itemsize, 8)


# -- responses -------------------------------------------------------------------------------

def _chunk_etag(view: str, content: bytes) -> str:
    """A chunk's strong ETag, of its bytes: it changes exactly when they do, so an append
    leaves the tags of the chunks it does not touch as they were (and caches keep them),
    whatever it rewrote to hold them (a padded chunk cropped into a sidecar file keeps the
    tag it had when it was cropped on the fly)."""
    digest = hashlib.blake2b(view.encode() + b"\x00", digest_size=12)
    digest.update(content)
    return f'"{digest.hexdigest()}"'


def _metadata(request: web.Request, dataset: Dataset, text: bytes) -> web.Response:
    etag = 'W/"' + hashlib.blake2b(text, digest_size=12).hexdigest() + '"'
    unchanged = not_modified(request, dataset, etag)
    if unchanged is not None:
        return unchanged
    response = web.Response(body=text, content_type="application/json",
                            headers=caching(request, dataset, etag))
    response.enable_compression()
    return response


def _listing(request: web.Request, dataset: Dataset, segment: str, key: str,
             listing: Directory) -> web.Response:
    prefix = "/".join(p for p in (f"/{dataset.entry.name}", segment, key) if p) + "/"
    return _html(request, listing_page(f"{dataset.entry.name}/{segment}/{key}".rstrip("/"),
                                       prefix, listing.names))


def _chunk_head(request: web.Request, dataset: Dataset, etag: str,
                nbytes: int) -> web.Response:
    headers = caching(request, dataset, etag)
    headers.update({"Accept-Ranges": "bytes", "Content-Length": str(nbytes)})
    return web.Response(headers=headers, content_type="application/octet-stream")


def _chunk(request: web.Request, dataset: Dataset, data: bytes, etag: str) -> web.Response:
    """A chunk's bytes, or the range of them the request asks for."""
    headers = caching(request, dataset, etag)
    headers["Accept-Ranges"] = "bytes"
    ranged = "Range" in request.headers and request.headers.get("If-Range", etag) == etag
    if not ranged:
        return web.Response(body=data, headers=headers, content_type="application/octet-stream")
    try:
        wanted = request.http_range
    except ValueError:
        raise HttpError(416, f"cannot serve Range {request.headers['Range']!r} (one "
                        "bytes=start-end range)", {"Content-Range": f"bytes */{len(data)}"}
                        ) from None
    size = len(data)
    start = wanted.start or 0
    start = max(size + start, 0) if start < 0 else start
    stop = size if wanted.stop is None else min(wanted.stop, size)
    if start >= size or start >= stop:
        raise HttpError(416, f"range {request.headers['Range']!r} outside the {size} bytes",
                        {"Content-Range": f"bytes */{size}"})
    headers["Content-Range"] = f"bytes {start}-{stop - 1}/{size}"
    return web.Response(status=206, body=data[start:stop], headers=headers,
                        content_type="application/octet-stream")


SURVEY = 200
"""Datasets opened at start-up to tell at once which cannot be served."""


def run(root: str, host: str = "127.0.0.1", port: int = 8000, access_log: bool = True,
        announce: Callable[[str], None] | None = None, header_timeout: float = HEADER_TIMEOUT,
        **options: Unpack[RunOptions]) -> None:
    """Serve ``root`` until interrupted (SIGINT/SIGTERM: in-flight requests finish first);
    ``access_log``: a JSON line a request on the ``refgrid.serve.access`` logger;
    ``announce(url)`` is called once the port is bound and the root is surveyed (a busy port
    is an :class:`~refgrid.errors.ArgumentError` before anything is announced);
    ``header_timeout``: seconds a client has to send a request's line and headers before its
    connection is closed (:mod:`refgrid.serve.guard`)."""
    if not header_timeout > 0:
        raise ArgumentError(f"header_timeout must be a positive number of seconds, not "
                            f"{header_timeout!r}")
    app = make_app(root, **options)
    sock = listening(host, port)
    catalog = app[CATALOG]
    refused = catalog.survey(SURVEY)
    log.info("serving %d datasets under %s at http://%s:%d/%s", len(catalog.entries),
             catalog.root, host, port, f" ({len(refused)} of the first {SURVEY} checked cannot "
             "be served: the index says why)" if refused else "")
    for name, error in refused[:5]:
        found = failure(error, app[SETTINGS])
        log.warning("%s answers %d: %s", name, found[0] if found else 500, error)
    if len(refused) > 5:
        log.warning("... and %d more", len(refused) - 5)
    shared = collisions(catalog.entries)
    if shared:
        log.warning("%d datasets would share a name without their suffix, so each is served "
                    "under its full file name: %s", len(shared), ", ".join(shared[:6]))
    if any(isinstance(e, AccessError) for _, e in refused):
        log.warning("their sources lie outside %s: allow them with --allow-source PREFIX",
                    " and ".join(catalog.allowed))
    if announce is not None:
        announce(f"http://{host}:{sock.getsockname()[1]}/")
    with contextlib.suppress(web.GracefulExit, KeyboardInterrupt):  # how it is stopped
        asyncio.run(_serving(app, sock, header_timeout, access_log))


async def _serving(app: web.Application, sock: socket.socket, header_timeout: float,
                   access_log: bool) -> None:
    """What ``web.run_app`` does, on a :class:`~refgrid.serve.guard.GuardedSite`."""
    runner = web.AppRunner(app, handle_signals=True, shutdown_timeout=10,
                           **(AccessLog.options() if access_log else {"access_log": None}))
    await runner.setup()
    try:
        await GuardedSite(runner, sock, header_timeout).start()
        await asyncio.Event().wait()  # until SIGINT (KeyboardInterrupt) or SIGTERM
    finally:
        await runner.cleanup()


def listening(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, or an :class:`ArgumentError` saying why
    not (a port in use, a host not of this machine)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise ArgumentError(f"cannot listen on {host}:{port}: {e}") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as e:
        sock.close()
        busy = e.errno == errno.EADDRINUSE
        raise ArgumentError(f"cannot listen on {host}:{port}: "
                            + ("the port is in use (another server? pick one with --port)"
                               if busy else str(e))) from e
    return sock


