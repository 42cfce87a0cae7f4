"""The native view: a dataset as it is, a :class:`~refgrid.read.view.View`.

Its own ``zarr.json`` documents (rectilinear grids, the source codecs; consolidated in the
root; refgrid's bookkeeping at ``refgrid.json``, never listed) and each chunk's stored bytes
passed through — but

* a chunk padded inside its array (an HDF5 file's padded last chunk, once files are
  concatenated) is served cropped and re-encoded, and the documents declare its real extent,
  so zarr >= 3.2 reads it (no ``encoded_chunk_shapes`` for a reader to understand);
* with ``unpack``, packed variables are served as xarray unpacks the source files (float32
  for float32 factors, masked), each chunk decoded, unpacked and served uncompressed;
* with ``check_decoding``, chunks that zarr's own codecs decode whatever pipeline reads them
  (strings, records, filters) are first decoded by refgrid's bounded decoders: a
  decompression bomb is a named error at the chunk's limit, not memory zarr inflates;
* with ``growing`` (a followed archive's concat dimension), what an append changes is only
  what it adds: the final chunk along it is declared and served at its real extent (its bytes
  are those it will have once it is inside the array), and an array stored as one inline
  chunk (the concat coordinate, up to :data:`~refgrid.model.virtual.INLINE_PIECE` steps;
  longer ones are stored in pieces of that length) is served in pieces of that length, its
  last one full length — so a reader holding an earlier version's metadata reads every chunk
  of it exactly from the next version.

Reads: each chunk takes one route (:meth:`NativeView.route`). A local chunk asked for alone
is one ``pread`` on the file kept open (zarr asks for one chunk at a time, and an ``open``
costs more than the read) — on the caller's thread where ``inline_reads`` (zarr's loop in a
store; not the service's loop, which must stay free); many chunks, and remote ones, go
through refgrid's coalesced fetch — concurrent requests gathered into one
(:mod:`.batching`), byte ranges merged per file, sources checked at their first read.
"""

from __future__ import annotations

import asyncio
import json
import math
import weakref
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import replace
from typing import TYPE_CHECKING, Literal, cast

import numpy as np

from refgrid.core.keys import BOOKKEEPING
from refgrid.core.sources import Verify, held, is_local, source_check
from refgrid.core.typed import StorageOptions
from refgrid.core.util import thread_pool
from refgrid.errors import ReadError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import INLINE, MISSING, UNSIZED, ChunkManifest
from refgrid.model.virtual import INLINE_PIECE, VirtualArray, VirtualGroup
from refgrid.model.zarr_json import (
    bookkeeping,
    consolidated,
    node_paths,
    root_array,
    store_documents,
)
from refgrid.read.array import (
    ArrayReader,
    Reader,
    chunk_error,
    fetch_chunks,
    read_fill,
    reader_of,
)
from refgrid.read.batching import ChunkBatcher
from refgrid.read.cropped import (
    Cropper,
    end_axis,
    is_padded,
    padded_along,
    portable_documents_group,
)
from refgrid.read.decode import decoded_by_zarr
from refgrid.read.fetch import OpenFiles
from refgrid.read.unpacked import packed, unpack_values, unpacked_array
from refgrid.read.view import Chunk, Parsed, Tree
from refgrid.refs.section import ATTRIBUTES_KEY

if TYPE_CHECKING:
    from refgrid.model.zarr_json import GroupDocument

GATHER = 0.002
"""Seconds a remote chunk request waits for the others of its selection: zarr holds only a
few gets at a time, which arrive a turn or two of the loop apart; a request costs a round
trip (milliseconds to tens), so gathering them into one coalesced fetch pays."""
WORKERS = 8
"""Threads fetching, cropping and decoding for the native views of this process (unless a
view is given an executor of its own)."""

Route = Literal["missing", "unpacked", "cropped", "sliced", "inline", "local", "remote"]
"""How a chunk of a native view is read: never written (the fill value); unpacked, or
cropped, by refgrid's reader; a piece of a growing inline array; inline bytes; a byte range
of a local file; of a remote one."""


class NativeView:
    """The dataset as it is (see the module docstring)."""

    def __init__(self, group: VirtualGroup, storage_options: StorageOptions | None = None,
                 verify_sources: Verify = True, unpack: bool = False,
                 check_decoding: bool = False, *, executor: Executor | None = None,
                 inline_reads: bool = True, growing: str | None = None) -> None:
        self.storage_options = dict(storage_options or {})
        self.executor = executor or thread_pool("refgrid-view", WORKERS)
        self.inline_reads = inline_reads
        """Whether :meth:`aread` reads a lone local or inline chunk on the caller's thread."""
        self.check = source_check(group.sources, self.storage_options, verify_sources)
        self.arrays: dict[str, VirtualArray] = node_paths(group)
        self.ends = {path: end_axis(a, growing) for path, a in self.arrays.items()}
        """Per array, the axis along which its final chunk is cropped too (growing)."""
        portable = portable_documents_group(group, growing)
        self.unpack = unpack
        self.unpacked = {path: unpacked_array(node) if unpack and packed(node) else
                         replace(node, segments=None) for path, node in
                         node_paths(portable).items()
                         if (unpack and packed(node)) or node.segments is not None}
        """Arrays whose chunks refgrid decodes and serves plain, as documented: unpacked,
        or stored in segments (each chunk decoded by its own, :mod:`.segmented`)."""
        self.sliced = {path: _sliced(a) for path, a in self.arrays.items()
                       if path not in self.unpacked and _sliceable(a, growing)}
        """Arrays stored as one inline chunk along ``growing``, on the grid they are
        served on."""
        served = portable.with_arrays({_in_group(group, p): a for p, a in
                                       {**self.unpacked, **self.sliced}.items()})
        docs = {k[:-len("zarr.json")].rstrip("/"): v for k, v in
                store_documents(served).items()}
        if docs[""].get("node_type") == "group":
            docs[""] = cast("GroupDocument", consolidated(docs[""], docs))
        keyed = {**self.arrays, **self.sliced}
        self.tree = Tree(group, keyed, {n: json.dumps(d).encode() for n, d in docs.items()},
                         {path: a.manifest.written() if path not in self.unpacked
                          and path not in self.sliced
                          else np.ones(a.manifest.shape, bool)  # missing: the fill unpacked
                          for path, a in keyed.items()},
                         {BOOKKEEPING: json.dumps({ATTRIBUTES_KEY: bookkeeping(group)})
                          .encode()})
        self.padded = {path: padded_along(a.grid, self.ends[path])
                       for path, a in self.arrays.items() if is_padded(a.grid, self.ends[path])}
        self.checked_arrays = {path for path, a in self.arrays.items()
                               if check_decoding and path not in self.unpacked
                               and decoded_by_zarr(a.codecs, a.dtype)}
        """Arrays whose chunks are decoded by refgrid before zarr's codecs see them."""
        self.files = OpenFiles()
        self._croppers: dict[str, Cropper] = {}
        self._local_sources: bool | None = None
        self._readers: dict[str, ArrayReader] = {}
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ChunkBatcher] = \
            weakref.WeakKeyDictionary()

    # -- the View protocol -----------------------------------------------------------------

    @property
    def documents(self) -> dict[str, bytes]:
        return self.tree.documents

    def parse(self, key: str) -> Parsed | None:
        return self.tree.parse(key)  # (never written: None, the fill value)

    def all_keys(self) -> Iterator[str]:
        yield from self.tree.keys()

    def route(self, chunk: Chunk) -> Route:
        """How ``chunk`` is read (see :data:`Route`)."""
        if chunk.array in self.sliced:
            return "sliced"
        manifest = self.arrays[chunk.array].manifest
        kind = int(manifest.locate([chunk.flat]).path_id[0])
        if chunk.array in self.unpacked:
            return "unpacked"
        if kind == MISSING:
            return "missing"
        padded = self.padded.get(chunk.array)
        if padded is not None and any(inside[c] for inside, c in zip(padded, chunk.coords,
                                                                      strict=True)):
            return "cropped"
        if kind == INLINE:
            return "inline"
        return "local" if is_local(manifest.table[kind]) else "remote"

    def size(self, chunk: Chunk) -> int | None:
        """A stored or inline chunk's length, as it is served (None: cropped, unpacked or a
        whole file of unknown size)."""
        route = self.route(chunk)
        manifest = self.arrays[chunk.array].manifest
        if route == "inline":
            return len(manifest.inline_chunk(chunk.flat))
        if route == "sliced":
            return self._slice_bytes(chunk.array)
        if route not in ("local", "remote"):
            return None
        length = int(manifest.locate([chunk.flat]).length[0])
        return None if length == UNSIZED else length

    def read(self, chunks: Sequence[Chunk]) -> list[bytes | None]:
        out: list[bytes | None] = [None] * len(chunks)
        stored: dict[str, list[int]] = {}
        for k, chunk in enumerate(chunks):
            route = self.route(chunk)
            if route == "unpacked":
                out[k] = self._unpacked(chunk)
            elif route == "cropped":  # (decoded by refgrid's reader to crop it)
                out[k] = self._cropped(chunk)
            elif route == "sliced":
                out[k] = self._slice(chunk)
            elif route == "inline":
                data = bytes(self.arrays[chunk.array].manifest.inline_chunk(chunk.flat))
                if chunk.array in self.checked_arrays:
                    self._check_decodes(chunk, data)
                out[k] = data
            elif route != "missing":
                stored.setdefault(chunk.array, []).append(k)
        for path, members in stored.items():  # (checked by the fetch)
            flats = [chunks[k].flat for k in members]
            blobs = self._single(path, flats[0]) if len(flats) == 1 else \
                self.fetch(path, flats)
            for k, blob in zip(members, blobs, strict=True):
                out[k] = blob
        return out

    async def aread(self, chunks: Sequence[Chunk]) -> list[bytes | None]:
        routes = [self.route(c) for c in chunks]
        if self.inline_reads and len(chunks) == 1 and (
                routes[0] == "inline" or (routes[0] == "local" and
                                          chunks[0].array not in self.checked_arrays)):
            return self.read(chunks)  # a pread: cheaper here than through a thread
        loop = asyncio.get_running_loop()
        remote = [k for k, route in enumerate(routes) if route == "remote"]
        if not remote:
            return await loop.run_in_executor(self.executor, self.read, list(chunks))
        batcher = self._batcher()
        fetched = await asyncio.gather(*(batcher.get(chunks[k].array, chunks[k].flat)
                                         for k in remote))
        others = [k for k, route in enumerate(routes) if route != "remote"]
        rest = await loop.run_in_executor(self.executor, self.read,
                                          [chunks[k] for k in others]) if others else []
        out: list[bytes | None] = [None] * len(chunks)
        for k, data in zip(remote, fetched, strict=True):
            out[k] = data
        for k, data in zip(others, rest, strict=True):
            out[k] = data
        return out

    def close(self) -> None:
        self.files.close()

    # -- reading ---------------------------------------------------------------------------

    def fetch(self, path: str, flats: list[int]) -> list[bytes | None]:
        """The stored bytes of chunks ``flats`` of array ``path`` (blocking; checks the
        sources' identities first, and decodes those of :attr:`checked_arrays` with refgrid's
        bounded decoders); None for a chunk file that is absent."""
        blobs = fetch_chunks(self.arrays[path], path, np.asarray(flats, dtype=np.int64),
                             self.storage_options, self.check)
        out = [bytes(b) if b is not None else None for b in blobs]
        if path in self.checked_arrays:
            shape = self.arrays[path].manifest.shape
            for flat, data in zip(flats, out, strict=True):
                if data is not None:
                    coords = tuple(int(c) for c in np.unravel_index(flat, shape))
                    self._check_decodes(Chunk(path, coords, flat), data)
        return out

    @property
    def local_sources(self) -> bool:
        """Whether the sources are local files (read in microseconds: cheaper to read at once
        than to hand to a thread) — a paged manifest judged by its first page."""
        if self._local_sources is None:
            for array in self.arrays.values():
                if all(array.manifest.shape):  # (no chunk: nothing to load)
                    array.manifest.locate([0])
            self._local_sources = all(is_local(u) for a in self.arrays.values()
                                      for u in a.manifest.table)
        return self._local_sources

    def reader(self, path: str) -> ArrayReader:
        """The reader of array ``path`` (made once)."""
        found = self._readers.get(path)
        if found is None:
            found = self._readers[path] = reader_of(self.arrays[path], path,
                                                    self.storage_options, self.check)
        return found

    def stored_reader(self, path: str) -> Reader:
        """The reader of array ``path`` whose chunks are served as stored (not
        :attr:`unpacked`): its decoder decodes the bytes served."""
        reader = self.reader(path)
        assert isinstance(reader, Reader), path
        return reader

    def _single(self, path: str, flat: int) -> list[bytes | None]:
        """One stored chunk: of a local file, one ``pread`` on the file kept open; anything
        else, and any read that fails or comes back short, through :meth:`fetch`, which
        names the reason."""
        manifest = self.arrays[path].manifest
        found = manifest.locate([flat])
        url = manifest.table[int(found.path_id[0])]
        length = int(found.length[0])
        if is_local(url) and held(url) is None and length != UNSIZED and \
                path not in self.checked_arrays:
            if self.check is not None and url not in self.check.checked:
                try:
                    self.check.start((url,))()
                except ReadError as e:  # a source changed: named with the chunk asked for
                    raise chunk_error(self.arrays[path], path, flat, str(e)) from e
            try:
                data = self.files.pread(url, int(found.offset[0]), length, self.check)
            except ReadError as e:  # rewritten while it was read: named with the chunk
                raise chunk_error(self.arrays[path], path, flat, str(e)) from e
            if data is not None and len(data) == length:
                return [data]
        return self.fetch(path, [flat])

    def _cropped(self, chunk: Chunk) -> bytes | None:
        cropper = self._croppers.get(chunk.array)
        if cropper is None:
            cropper = self._croppers[chunk.array] = Cropper(
                chunk.array, self.arrays[chunk.array], self.ends[chunk.array])
        return next(data for _, data in cropper.chunks(np.array([chunk.flat]),
                                                       self.storage_options, self.check))

    def _slice_bytes(self, path: str) -> int:
        array = self.arrays[path]
        return INLINE_PIECE * math.prod(array.shape[1:]) * array.dtype.itemsize

    def _slice(self, chunk: Chunk) -> bytes:
        """Piece ``chunk.coords[0]`` of a growing inline array, full length: past the
        array's end, zeros — bytes no reader reads, which the next appends fill in."""
        array, size = self.arrays[chunk.array], self._slice_bytes(chunk.array)
        data = array.manifest.inline[(0,) * len(array.dims)]
        piece = bytes(data[chunk.coords[0] * size:(chunk.coords[0] + 1) * size])
        return piece + bytes(size - len(piece))

    def _unpacked(self, chunk: Chunk) -> bytes:
        array, served = self.arrays[chunk.array], self.unpacked[chunk.array]
        region = tuple(slice(int(a.bounds[c]), int(a.bounds[c] + a.logical[c]))
                       for a, c in zip(served.grid.axes, chunk.coords, strict=True))
        values = self.reader(chunk.array).read(region)
        if self.unpack and packed(array):
            values = unpack_values(array, values)
        block = np.full(served.grid.encoded_chunk_shape(chunk.coords), read_fill(served),
                        served.dtype)
        block[tuple(slice(0, r.stop - r.start) for r in region) or ...] = values
        return np.ascontiguousarray(block, block.dtype.newbyteorder("<")).tobytes()

    def _check_decodes(self, chunk: Chunk, data: bytes) -> None:
        reader = self.stored_reader(chunk.array)
        try:
            reader.decoder.decode(data, self.arrays[chunk.array].grid.encoded_chunk_shape(
                chunk.coords))
        except Exception as e:
            reader.fail(chunk.flat, e)

    def _batcher(self) -> ChunkBatcher:
        loop = asyncio.get_running_loop()
        found = self._batchers.get(loop)
        if found is None:
            found = self._batchers[loop] = ChunkBatcher(self.fetch, self.executor,
                                                        gather=GATHER)
        return found


def _sliceable(array: VirtualArray, growing: str | None) -> bool:
    """Whether ``array`` is one inline chunk along ``growing``, its first dimension, stored
    uncompressed (so a piece of it is a slice of its bytes; an array in pieces is served as
    stored)."""
    return growing is not None and array.dims[:1] == (growing,) and array.grid.nchunks == 1 \
        and array.inline_bytes


def _sliced(array: VirtualArray) -> VirtualArray:
    """``array`` on the grid it is served on when growing (no chunks of its own: read by
    :meth:`NativeView._slice`)."""
    grid = RectilinearGrid.regular(array.shape, (INLINE_PIECE, *(max(1, n) for n in
                                                                  array.shape[1:])))
    return replace(array, grid=grid, manifest=ChunkManifest.empty(grid.chunk_counts))


def _in_group(group: VirtualGroup, path: str) -> str:
    """A node path as the group names it (a root array's path is its name there)."""
    root = root_array(group)
    return path if path or root is None else root.name
