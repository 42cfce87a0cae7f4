"""A read-only ``zarr.abc.store.Store`` over any refgrid input: ``xr.open_zarr(store)`` and
``zarr.open_group(store)`` read refgrid's references the way zarr >= 3.2 users read any Zarr
data.

    store = refgrid.open_store("tas.json")                  # native grids (zarr >= 3.2)
    with zarr.config.set({"array.rectilinear_chunks": True}):
        ds = xr.open_zarr(store, chunks={})                 # dask chunks: 31, 28, 31, ...
    ds = xr.open_zarr(refgrid.open_store("tas.json", chunks="auto"))  # regular, zarr 3.1

The store answers keys through the same views the HTTP service serves
(:mod:`refgrid.read.views`): ``chunks="native"`` is the dataset on its own grids (rectilinear
where irregular), each chunk's stored bytes passed through and chunks padded inside the array
served cropped and re-encoded (no ``encoded_chunk_shapes`` for a reader to understand);
``"auto"``, ``{dim: length}`` or ``unpack=True`` are the regular view of
:func:`refgrid.get_mapper`, for zarr 3.1 and readers without rectilinear grids. The root
document carries consolidated metadata.

The chunks zarr asks for concurrently — every chunk of a selection — are gathered into one
fetch per array (:mod:`refgrid.read.batching`), whose byte ranges are coalesced per source
file and read concurrently for remote files, each source's identity checked at its first
read. A chunk that cannot be read (a source changed since the scan, missing, short, or
undecodable) raises the :class:`~refgrid.errors.ReadError` naming array, chunk and URL; only
chunks that really are missing read as the fill value. The store pickles (its input, not its
state), so dask ships it to workers.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from refgrid.core.bounds import current
from refgrid.core.keys import chunk_key, chunk_of_key
from refgrid.core.util import thread_pool
from refgrid.errors import ArgumentError, ReadError
from refgrid.model.manifest import MISSING, chunk_coords, flat_index
from refgrid.model.virtual import VirtualArray
from refgrid.read import views
from refgrid.read.batching import ChunkBatcher
from refgrid.read.decode import decoded_by_zarr
from refgrid.read.views import NativeView, RegularView

Fetched = views.StoredChunk | views.Assembled | views.Cropped
"""Keys whose content is read: stored chunks, and chunks assembled or cropped by refgrid."""
GATHER = 0.002
"""Seconds a remote chunk request waits for the others of its selection: zarr holds only a
few gets at a time, which arrive a turn or two of the loop apart; a request costs a round
trip (milliseconds to tens), so gathering them into one coalesced fetch pays."""
WORKERS = 8
"""Threads fetching and decoding for the stores of this process."""


class RefgridStore(Store):
    """A read-only Zarr v3 store over one refgrid dataset (see the module docstring)."""

    def __init__(self, source: Any, chunks: Any = "native", unpack: bool = False,
                 storage_options: Mapping[str, Any] | None = None,
                 verify_sources: bool = True) -> None:
        super().__init__(read_only=True)
        self.source = source
        self.chunks = chunks
        self.unpack = unpack
        self.verify_sources = verify_sources
        self.storage_options = dict(storage_options or {})
        self._view: NativeView | RegularView | None = None
        self._batcher: ChunkBatcher | None = None

    # -- what zarr asks -------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefgridStore) and self.__getstate__() == other.__getstate__()

    def __repr__(self) -> str:
        where = self.source if isinstance(self.source, str) else type(self.source).__name__
        return f"RefgridStore({where!r}, chunks={self.chunks!r})"

    async def get(self, key: str, prototype: BufferPrototype,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        data = await self._content(key)
        if data is None:
            return None
        return prototype.buffer.from_bytes(_ranged(data, byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]
                                 ) -> list[Buffer | None]:
        return list(await asyncio.gather(*(self.get(key, prototype, byte_range)
                                           for key, byte_range in key_ranges)))

    async def exists(self, key: str) -> bool:
        found = self.view.lookup(key)
        return found is not None and not isinstance(found, views.Listing)

    @property
    def supports_writes(self) -> bool:
        return False

    @property
    def supports_deletes(self) -> bool:
        return False

    @property
    def supports_listing(self) -> bool:
        return True

    def close(self) -> None:
        """Close the source files kept open for reading (a later read opens them again)."""
        if isinstance(self._view, NativeView):
            self._view.files.close()
        super().close()

    async def set(self, key: str, value: Buffer) -> None:
        raise ArgumentError(f"{self!r} is read-only: it cannot store {key!r}")

    async def delete(self, key: str) -> None:
        raise ArgumentError(f"{self!r} is read-only: it cannot delete {key!r}")

    async def list(self) -> AsyncIterator[str]:
        for key in self._keys():
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in self._keys():
            if key.startswith(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        found = self.view.lookup(prefix.rstrip("/"))
        if isinstance(found, views.Listing):
            for name in found.names:
                yield name.rstrip("/")

    # -- how ------------------------------------------------------------------------------

    @property
    def view(self) -> NativeView | RegularView:
        """The view answering keys, made at the first question (so a pickled store opens its
        input where it is unpickled)."""
        if self._view is None:
            self._view = open_view(self.source, self.chunks, self.unpack, self.storage_options,
                                   self.verify_sources)
        return self._view

    async def _content(self, key: str) -> bytes | None:
        found = self.view.lookup(key)
        if not isinstance(found, Fetched):
            return self._at_hand(key, found)
        with _naming(key):
            view = self.view
            if isinstance(found, views.StoredChunk) and isinstance(view, NativeView):
                if view.local(found.array) and not decoded_by_zarr(
                        view.arrays[found.array].codecs, view.arrays[found.array].dtype):
                    return view.stored(found.array, found.flat)  # a pread: no thread hop
                if self._batcher is None:
                    self._batcher = ChunkBatcher(view.fetch, thread_pool("refgrid-store",
                                                                         WORKERS), gather=GATHER)
                data = await self._batcher.get(found.array, found.flat)
                return await asyncio.get_running_loop().run_in_executor(
                    thread_pool("refgrid-store", WORKERS), self._checked, found, data)
            return await asyncio.get_running_loop().run_in_executor(
                thread_pool("refgrid-store", WORKERS), self._fetched, key, found)

    def _fetched(self, key: str, found: Fetched) -> bytes | None:
        """A chunk's bytes read here (blocking): stored, assembled or cropped."""
        view = self.view
        if isinstance(found, views.StoredChunk) and isinstance(view, NativeView):
            return self._checked(found, view.stored(found.array, found.flat))
        return view.content(key)

    def _checked(self, found: views.StoredChunk, data: bytes | None) -> bytes | None:
        """``data``, once refgrid's bounded decoders have decoded it where zarr's own will
        decode it again whatever pipeline reads the store (strings, records, filters), and
        where no header states how large its values are: a decompression bomb is refused
        here, at the chunk's limit, rather than inflated by zarr."""
        view = self.view
        if data is None or not isinstance(view, NativeView):
            return data
        array = view.arrays[found.array]
        if decoded_by_zarr(array.codecs, array.dtype):
            coords = chunk_coords(found.flat, array.manifest.shape)
            reader = view.reader(found.array)
            try:
                reader.decoder.decode(data, array.grid.encoded_chunk_shape(coords))
            except Exception as e:
                reader.fail(found.flat, e)
        return data

    def _at_hand(self, key: str, found: views.Metadata | views.Listing | views.Bytes | None
                 ) -> bytes | None:
        """What a key holds without a read: a document, inline bytes (checked as stored
        chunks are), or nothing."""
        if isinstance(found, views.Metadata):
            return found.text
        if not isinstance(found, views.Bytes):
            return None
        chunk = chunk_of_key(key, self.view.arrays)
        view = self.view
        if chunk is not None and isinstance(view, NativeView):
            array = view.arrays[chunk[0]]
            coords = tuple(int(c) for c in chunk[1].split("/")) if chunk[1] else ()
            flat = flat_index(coords, array.manifest.shape)
            return self._checked(views.StoredChunk(chunk[0], flat, len(found.data)),
                                 found.data)
        return found.data

    # -- the synchronous surface: zarr's fused codec pipeline reads through it --------------

    @property
    def _supports_sync_io(self) -> bool:
        """Synchronous reads where they cost no round trip: every source a local file (zarr
        asks before taking its synchronous path; remote chunks go through the batcher)."""
        view = self.view
        return isinstance(view, NativeView) and all(view.local(p) for p in view.arrays)

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:
        data = self._content_sync(key)
        if data is None:
            return None
        buffer = (prototype or default_buffer_prototype()).buffer
        return buffer.from_bytes(_ranged(data, byte_range))

    def set_sync(self, key: str, value: Buffer) -> None:
        raise ArgumentError(f"{self!r} is read-only: it cannot store {key!r}")

    def delete_sync(self, key: str) -> None:
        raise ArgumentError(f"{self!r} is read-only: it cannot delete {key!r}")

    def _content_sync(self, key: str) -> bytes | None:
        found = self.view.lookup(key)
        if not isinstance(found, Fetched):
            return self._at_hand(key, found)
        with _naming(key):
            return self._fetched(key, found)

    def _keys(self) -> Iterable[str]:
        """Every key: the documents, and each array's chunk keys that hold data."""
        view = self.view
        for node in view.groups:
            yield f"{node}/zarr.json" if node else "zarr.json"
        for path, array in view.arrays.items():
            yield f"{path}/zarr.json"
            if isinstance(array, VirtualArray):
                manifest = array.manifest
                present = (manifest.path_id.reshape(-1) != MISSING).nonzero()[0]
                for flat in present.tolist():
                    yield chunk_key(path, chunk_coords(flat, manifest.shape))
            else:  # an array of the regular view: every chunk of its grid
                counts = [-(-n // c) for n, c in zip(array.array.shape, array.chunk_shape,
                                                     strict=True)]
                for coords in itertools.product(*map(range, counts)):
                    yield chunk_key(path, coords)

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "chunks": self.chunks, "unpack": self.unpack,
                "storage_options": self.storage_options, "verify_sources": self.verify_sources}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)  # type: ignore[misc]


@contextmanager
def _naming(key: str) -> Iterator[None]:
    """A read error raised within names the array and the chunk ``key`` where it does not
    yet."""
    try:
        yield
    except ReadError as e:
        if f"chunk {key}" in str(e):
            raise
        raise ReadError(f"array {key.rsplit('/c', 1)[0]!r}, chunk {key}: {e}") from e


def open_view(source: Any, chunks: Any, unpack: bool, storage_options: Mapping[str, Any],
              verify_sources: bool = True) -> NativeView | RegularView:
    """The view of ``source`` a store answers with."""
    from refgrid.scan import scan

    options = dict(storage_options)
    group = source if type(source).__name__ == "VirtualGroup" else scan(source, **options)
    if chunks == "native":
        return NativeView(group, options, verify_sources, unpack)
    spec = views.ViewSpec.parse(_chunks_text(chunks), "true" if unpack else "false")
    return RegularView.make(group, spec, options, current().max_chunk_bytes, 2**31,
                            verify_sources)


def _chunks_text(chunks: Any) -> str:
    if isinstance(chunks, str):
        return chunks
    if isinstance(chunks, Mapping):
        return ",".join(f"{d}:{n}" for d, n in chunks.items())
    raise ArgumentError(f"chunks must be 'native', 'auto' or {{dim: length}}, not {chunks!r}")


def _ranged(data: bytes, byte_range: ByteRequest | None) -> bytes:
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start:byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset:]
    if isinstance(byte_range, SuffixByteRequest):
        return data[-byte_range.suffix:] if byte_range.suffix else b""
    raise ArgumentError(f"unknown byte range {byte_range!r}")


def open_store(source: Any, *, chunks: Any = "native", unpack: bool = False,
               verify_sources: bool = True, **storage_options: Any) -> RefgridStore:
    """A read-only ``zarr.abc.store.Store`` over anything :func:`refgrid.scan` accepts (JSON or
    parquet references, a Zarr v3 store, one HDF5/NetCDF file scanned on the fly, a loaded
    dict), for ``xr.open_zarr(store)`` and ``zarr.open_group(store)``.

    ``chunks="native"``: the arrays on their own grids (rectilinear where irregular: zarr
    >= 3.2 with ``zarr.config.set({"array.rectilinear_chunks": True})``, see
    :func:`refgrid.zarr_config`); ``"auto"``, ``{dim: length}`` or ``unpack=True``: the
    regular view :func:`refgrid.get_mapper` gives, which any zarr reads. ``verify_sources``:
    check each source's recorded identity before its first read (a source changed since the
    scan is an error, not other data). ``storage_options`` reach the input and its source
    files.
    """
    store = RefgridStore(source, chunks, unpack, storage_options, verify_sources)
    _ = store.view  # open now: a bad input is an error here, not at zarr's first read
    return store
