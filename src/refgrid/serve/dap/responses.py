"""The OPeNDAP endpoints of a served dataset, answered from its native view.

``/dap/NAME.dds``, ``.das``, ``.dods``, ``.ascii`` (DAP2) and ``/dap/NAME.dmr`` (also
``.dmr.xml``, which netCDF-C asks for) and ``.dap`` (DAP4), each with an optional constraint
expression; ``/dap/NAME`` and ``.html`` describe them. A data response is streamed: its
variables are read block by block (:mod:`.blocks`) on the service's threads, the next block
read while the last is sent, so memory holds the opening (below) and then two blocks,
whatever the response's size; a
response whose values exceed the service's ``dap_max_bytes`` is refused before anything is
read (413). Failures are DAP error responses with the Zarr endpoints' statuses (one mapping:
:func:`refgrid.serve.http.answer`); one met mid-response ends a DAP4 response with an error
chunk and cuts a DAP2 one short (its ``Content-Length`` unmet), so no client takes a partial
response for a whole one.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import Future
from html import escape
from urllib.parse import unquote

import numpy as np
from aiohttp import web

from refgrid.serve.catalog import Dataset
from refgrid.serve.dap import dap2, dap4
from refgrid.serve.dap.blocks import blocks
from refgrid.serve.dap.constraint import Projection, parse_dap2, parse_dap4
from refgrid.serve.dap.model import DapDataset
from refgrid.serve.http import (
    POOL,
    SETTINGS,
    HttpError,
    Share,
    admitted,
    answer,
    caching,
    in_pool,
    not_modified,
)

log = logging.getLogger("refgrid.serve")
KINDS = ((".dmr.xml", "dmr"), (".dds", "dds"), (".das", "das"), (".dods", "dods"),
         (".ascii", "ascii"), (".asc", "ascii"), (".dmr", "dmr"), (".dap", "dap"),
         (".html", "html"))
"""URL suffix → response (longest first)."""
DAP2_HEADERS = {"XDODS-Server": "dods/3.2", "XDAP": "3.2"}
TYPES = {"dds": "text/plain", "das": "text/plain", "ascii": "text/plain",
         "dods": "application/octet-stream",
         "dmr": "application/vnd.opendap.dap4.dataset-metadata+xml",
         "dap": "application/vnd.opendap.dap4.data"}
DESCRIPTIONS = {"dds": "dods-dds", "das": "dods-das", "dods": "dods-data", "ascii": "dods-ascii"}
RULE = "-" * 45 + "\n"
OPENING_BYTES = 4 * 2**20
"""Bytes of values read before a data response starts (its first block, or blocks, to at
least this many): a response this small is sent whole or refused with an error status."""


def split_suffix(last: str) -> tuple[str, str] | None:
    """A URL's last segment as (dataset name's last part, response kind), or None."""
    for suffix, kind in KINDS:
        if last.endswith(suffix) and len(last) > len(suffix):
            return last[: -len(suffix)], kind
    return None


async def respond(request: web.Request, dataset: Dataset, kind: str) -> web.StreamResponse:
    """The ``kind`` response of ``dataset``; every failure a DAP error response."""
    try:
        dap = dataset.dap if dataset.dap is not None else \
            await in_pool(request, dataset.dap_dataset)
        if kind == "html":
            return web.Response(text=dap_page(dap, f"{request.scheme}://{request.host}"),
                                content_type="text/html", headers={"Cache-Control": "no-cache"})
        projections = await _projections(request, dap, kind)
        if kind in ("dmr", "dap"):
            refused = _misread_by_netcdf_c(request, dap, projections, kind)
            if refused is not None:
                return refused
        if kind in ("dds", "das", "dmr"):
            return _metadata(request, dataset, dap, kind, projections)
        return await _data(request, dataset, dap, kind, projections)
    except Exception as e:
        return error_response(request, e, 4 if kind in ("dmr", "dap") else 2)


NETCDF_C = re.compile(r"netCDF\d")
"""netCDF-C's User-Agent (``netCDF4.10.1``): ``netCDF`` and its version."""
DAP2_INSTEAD = "open it over DAP2, netCDF-C's default (drop #mode=dap4), which reads them " \
    "exactly"


def _misread_by_netcdf_c(request: web.Request, dap: DapDataset, projections: list[Projection],
                         kind: str) -> web.Response | None:
    """netCDF-C's DAP4 client refused a DMR holding attributes it would read wrongly
    (:func:`~refgrid.serve.dap.dap4.netcdf_c_misreads`: a ``_FillValue`` read wrongly shows
    missing values as data), with the reason where it shows it: it prints an error document
    that comes as a DMR with status 200 (``DAP4 Error: http-code=400 message=...`` on
    stderr, then fails with "Malformed or inaccessible DAP2 DDS or DAP4 DMR response"), and
    reads nothing of one with an error status. A data response is refused with the usual
    error status (it prints that one's body). None where nothing would be misread, or for
    another client; its DAP2 client reads them all exactly."""
    if not NETCDF_C.match(request.headers.get("User-Agent", "")):
        return None
    wrong = dap4.netcdf_c_misreads(dap, {p.variable.path for p in projections})
    if not wrong:
        return None
    reason = f"{dap.name}: netCDF-C's DAP4 client would read these attributes wrongly: " \
        f"{'; '.join(wrong[:4])}{'; ...' if len(wrong) > 4 else ''} ({len(wrong)} in all)"
    log.info("%s %s: refused to netCDF-C's DAP4 client: %s", request.method, request.path,
             reason)
    if kind == "dap":
        return error_response(request, HttpError(400, f"{reason}: {DAP2_INSTEAD}"), 4)
    return web.Response(status=200, body=dap4.error_document(400, reason, DAP2_INSTEAD),
                        content_type="application/vnd.opendap.dap4.error+xml",
                        headers={"Cache-Control": "no-store", "Vary": "User-Agent"})


def error_response(request: web.Request, error: BaseException, protocol: int) -> web.Response:
    """``error`` as a DAP error response of ``protocol``, with the status the Zarr
    endpoints give it."""
    status, reason, headers = answer(request, error)
    if protocol == 2:
        body = f"Error {{\n    code = {status};\n    message = {dap2.quoted(reason)};\n}};\n"
        return web.Response(status=status, text=body, content_type="text/plain", headers={
            **headers, **DAP2_HEADERS, "Content-Description": "dods-error"})
    return web.Response(status=status, body=dap4.error_document(status, reason),
                        content_type="application/vnd.opendap.dap4.error+xml", headers=headers)


async def _projections(request: web.Request, dap: DapDataset, kind: str) -> list[Projection]:
    """The request's constraint expression, URL-decoded once (DAP2's is the whole query;
    DAP4's its ``dap4.ce``), parsed on the service's threads: the event loop waits for no
    expression, however long."""
    if kind in ("dmr", "dap"):
        return await in_pool(request, parse_dap4, request.query.get("dap4.ce", ""), dap)
    return await in_pool(request, parse_dap2, unquote(request.rel_url.raw_query_string), dap)


def _metadata(request: web.Request, dataset: Dataset, dap: DapDataset, kind: str,
              projections: list[Projection]) -> web.Response:
    body = dap2.dds(dap, projections).encode() if kind == "dds" else \
        dap2.das(dap).encode() if kind == "das" else dap4.dmr(dap, projections)
    etag = 'W/"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'
    unchanged = not_modified(request, dataset, etag)
    if unchanged is not None:
        return unchanged
    headers = caching(request, dataset, etag)
    if kind != "dmr":
        headers.update({**DAP2_HEADERS, "Content-Description": DESCRIPTIONS[kind]})
    else:
        headers["Vary"] = "User-Agent"  # (netCDF-C is refused what it would misread)
    response = web.Response(body=body, content_type=TYPES[kind], headers=headers)
    response.enable_compression()
    return response


def _etag(dataset: Dataset, request: web.Request, kind: str) -> str:
    """A data response's ETag: of the dataset's version and the request (its values are the
    dataset's, which change only with it: a changed source is refused when read)."""
    digest = hashlib.blake2b(digest_size=12)
    for part in (kind, dataset.entry.name, repr(dataset.stamp), repr(dataset.modified),
                 request.query_string):
        digest.update(part.encode() + b"\x00")
    return f'W/"{digest.hexdigest()}"'


async def _data(request: web.Request, dataset: Dataset, dap: DapDataset, kind: str,
                projections: list[Projection]) -> web.StreamResponse:
    limit = request.app[SETTINGS].dap_max_bytes
    values = sum(p.count * p.variable.dtype.itemsize for p in projections)
    if values > limit:
        raise HttpError(413, f"{dap.name}: the response would hold {values:,} bytes of values, "
                        f"more than this service's limit of {limit:,}: ask for a hyperslab "
                        "(NAME[start:stride:stop]) or fewer variables")
    if not dataset.entry.format.stamped:  # (a Zarr store: its chunk files change with no
        headers = {"Cache-Control": "no-store"}  # new version, which no validator can tell)
    else:
        etag = _etag(dataset, request, kind)
        unchanged = not_modified(request, dataset, etag)
        if unchanged is not None:
            return unchanged
        headers = caching(request, dataset, etag)
    checksums = kind == "dap" and request.query.get("dap4.checksum", "").lower() == "true"
    if kind == "dap":
        head = dap4.dmr(dap, projections)
        headers["Vary"] = "User-Agent"  # (netCDF-C is refused what it would misread)
    else:
        headers.update({**DAP2_HEADERS, "Content-Description": DESCRIPTIONS[kind]})
        head = dap2.dds(dap, projections).encode() + (b"Data:\n" if kind == "dods" else
                                                      RULE.encode())
        sizes = [dap2.wire_bytes(p) for p in projections]
        if kind == "dods" and None not in sizes:
            headers["Content-Length"] = str(len(head) + sum(s or 0 for s in sizes))
    opening: float = OPENING_BYTES
    if request.version < (1, 1) and "Content-Length" not in headers and kind != "dap":
        if values > OPENING_BYTES:  # (no chunked encoding: a response cut short would
            raise HttpError(505, f"{dap.name}: this response has no length known before it "
                            "is read, and over HTTP/1.0 one cut short by a failure would look "
                            "whole: ask over HTTP/1.1, or for less")  # look whole)
        opening = float("inf")  # (read whole first: whole or an error status)
    response = web.StreamResponse(headers=headers)
    response.content_type = TYPES[kind]
    share = Share(request)
    async with admitted(request, "requests"):
        if request.method == "HEAD":
            await response.prepare(request)
            return response
        pieces = _pieces(request, dataset, dap, kind, projections, head, checksums, opening,
                         share)
        try:
            first = await anext(pieces)  # (a failure here is still an error status)
        except BaseException:
            await pieces.aclose()
            share.close()
            raise
        try:  # (from here, whatever happens, its pieces close and its share goes back)
            await response.prepare(request)
            share.started = True
            await _write(request, response, first[0])
            share.give(first[1])
            async for piece, charge in pieces:
                await _write(request, response, piece)
                share.give(charge)  # (written: its block's bytes go back to the budget)
            await response.write_eof()
        except _ClientGone as e:  # nothing more can reach it: its buffers are let go
            log.info("%s %s: %s mid-response", request.method, request.path, e)
            if request.transport is not None:
                request.transport.abort()
        except Exception as e:
            _, reason, _ = answer(request, e, "failed mid-response")
            log.warning("%s %s failed mid-response: %s", request.method, request.path, reason)
            if kind == "dap":  # a DAP4 response can say so
                try:
                    await _write(request, response,
                                 dap4.chunk(reason.encode(), dap4.ERROR | dap4.LAST))
                    await response.write_eof()
                except _ClientGone:
                    if request.transport is not None:
                        request.transport.abort()
            elif request.transport is not None:  # a DAP2 one is cut short
                request.transport.close()
        finally:
            await pieces.aclose()
            share.close()
    return response


async def _pieces(request: web.Request, dataset: Dataset, dap: DapDataset, kind: str,
                  projections: list[Projection], head: bytes, checksums: bool,
                  opening_bytes: float, share: Share
                  ) -> AsyncGenerator[tuple[bytes | memoryview, int]]:
    """The response's bytes: its head with its first ``opening_bytes`` of values (read
    before the response starts, so that a response that small is whole or an error status
    — a source gone, a value DAP2 cannot carry —: netCDF-C does not always notice a DAP2
    response cut short), then the rest, block by block; each piece handed on once, not
    joined, with the bytes of ``share`` to give back once it is written."""
    opening: list[tuple[bytes | memoryview, int]] | None = [
        (dap4.chunk(head, 0 if checksums else dap4.NO_CHECKSUMS) if kind == "dap" else head,
         0)]
    held = 0
    for projection in projections:
        async for piece, read, charge in _variable(request, dataset, dap, kind, projection,
                                                   checksums, share):
            if opening is None:
                yield piece, charge
                continue
            opening.append((piece, charge))
            held += len(piece) if read else 0
            if held >= opening_bytes:
                held_pieces, opening = opening, None
                while held_pieces:
                    yield held_pieces.pop(0)
    while opening:
        yield opening.pop(0)
    if kind == "dap":
        yield dap4.chunk(b"", dap4.LAST), 0


ASCII_BYTES = 24
"""Bytes of ``.ascii`` text a value takes at most (a Float64's shortest text and ``, ``)."""


async def _variable(request: web.Request, dataset: Dataset, dap: DapDataset, kind: str,
                    projection: Projection, checksums: bool, share: Share
                    ) -> AsyncIterator[tuple[bytes | memoryview, bool, int]]:
    """One variable's bytes: its header, then its values block by block, then its trailer;
    each piece with whether values were read for it and the bytes of ``share`` its block
    holds (on a block's last piece: given back once it is written). A block's bytes — its
    values and their encoding — are taken before it is read; the next block is read while
    one is sent where its bytes fit at once, else after it, waiting for them."""
    reader = dataset.native.reader(dap.key(projection.variable))
    encode: Callable[[Projection, np.ndarray], bytes | memoryview] = \
        dap4.encode if kind == "dap" else dap2.encode
    crc = 0
    if kind == "dods":
        yield dap2.header(projection), False, 0
    elif kind == "ascii":
        shape = "".join(f"[{n}]" for n in projection.shape)
        yield f"{projection.variable.path.replace('/', '.')}{shape}\n".encode(), False, 0
    loop = asyncio.get_running_loop()
    pool = request.app[POOL]
    selections = list(blocks(projection, projection.variable.dtype.itemsize))
    per_value = projection.variable.dtype.itemsize + (
        ASCII_BYTES if kind == "ascii" else projection.variable.type(4 if kind == "dap" else 2)
        .wire.itemsize)

    def block(selection: tuple[slice, ...], start: int) -> bytes | memoryview:
        values = reader.read(selection)
        if kind == "ascii":
            return dap2.ascii_lines(projection, values, start).encode()
        return encode(projection, values)

    starts = [0]
    for selection in selections:
        starts.append(starts[-1] + int(np.prod([len(range(s.start, s.stop, s.step))
                                                for s in selection])))
    costs = [(b - a) * per_value for a, b in itertools.pairwise(starts)]
    pending: Future[bytes | memoryview] | None = None
    try:
        for i, selection in enumerate(selections):
            if pending is None:
                await share.take(costs[i])
                current = pool.submit(block, selection, starts[i])
            else:
                current = pending
            pending = pool.submit(block, selections[i + 1], starts[i + 1]) \
                if i + 1 < len(selections) and share.try_take(costs[i + 1]) else None
            async with asyncio.timeout(request.app[SETTINGS].request_timeout):
                data = await asyncio.wrap_future(current, loop=loop)
            if checksums:
                crc = dap4.crc32(data, crc)
            if kind == "dap":
                framed = list(dap4.chunks(data))
                for k, piece in enumerate(framed):
                    yield piece, True, costs[i] if k == len(framed) - 1 else 0
            else:
                yield data, True, costs[i]
    finally:
        if pending is not None:
            pending.cancel()  # (its bytes go back with the response's share)
    if kind == "dods":
        yield dap2.trailer(projection), False, 0
    elif kind == "ascii":
        yield b"\n", False, 0
    elif checksums:
        yield dap4.chunk(crc.to_bytes(4, "little")), False, 0


class _ClientGone(Exception):
    """The client stopped reading for longer than the request timeout, or went away."""


async def _write(request: web.Request, response: web.StreamResponse,
                 data: bytes | memoryview) -> None:
    """``data`` sent, within the request's time (a client that stops reading is let go:
    :class:`_ClientGone`)."""
    if not data:
        return
    timeout = request.app[SETTINGS].request_timeout
    try:
        async with asyncio.timeout(timeout):
            await response.write(data)
    except TimeoutError:
        raise _ClientGone(f"the client read nothing for {timeout:g} s") from None
    except ConnectionError as e:
        raise _ClientGone(f"the client closed the connection ({type(e).__name__})") from e


def dap_page(dap: DapDataset, base: str) -> str:
    """``/dap/NAME``: the OPeNDAP URLs of the dataset and how each kind of client opens
    them."""
    url = f"{base}/dap/{dap.name}"
    rows = "".join(
        f"<tr><td><code>{escape(v.path)}</code></td><td>{escape(v.type(4).name)}</td>"
        f"<td>{' &times; '.join(escape(f'{d} {n}') for d, n in zip(v.dims, v.shape, strict=True))}"
        "</td></tr>" for v in dap.variables.values())
    omitted = "".join(f"<li><code>{escape(p)}</code>: {escape(w)}</li>"
                      for p, w in dap.omitted.items())
    misread = dap4.netcdf_c_misreads(dap, dap.variables)
    refused = (f"<p>netCDF-C's DAP4 client (<code>#mode=dap4</code>) is refused this dataset: "
               f"it would read {len(misread)} attributes wrongly ("
               f"{escape('; '.join(misread[:6]))}{'; ...' if len(misread) > 6 else ''}). Its "
               "DAP2 client, its default, reads them exactly.</p>") if misread else ""
    links = " · ".join(f'<a href="{escape(url)}{s}">{s}</a>'
                       for s in (".dds", ".das", ".dmr.xml", ".ascii"))
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{escape(dap.name)} · OPeNDAP</title></head><body><h1>{escape(dap.name)} over "
            f"OPeNDAP</h1><p>{links}</p><pre>ncdump -h \"{escape(url)}\"\n"
            f"ncdump -v NAME \"{escape(url)}?NAME[0:1:9]\"\n"
            f"netCDF4.Dataset(\"{escape(url)}\")                # DAP2; #mode=dap4: DAP4\n"
            f"xr.open_dataset(\"{escape(url)}\", engine=\"netcdf4\")\n"
            f"ncread(\"{escape(url)}\", \"NAME\")            % MATLAB\n"
            f"nc_open(\"{escape(url)}\")                     # R ncdf4</pre>"
            f"{refused}<table><tr><th>variable</th><th>type</th><th>dims</th></tr>{rows}"
            "</table>"
            + (f"<p>Not served over DAP:</p><ul>{omitted}</ul>" if omitted else "")
            + "</body></html>")
