"""A read-only ``zarr.abc.store.Store`` over any refgrid input: ``xr.open_zarr(store)`` and
``zarr.open_group(store)`` read refgrid's references the way zarr >= 3.2 users read any Zarr
data.

    store = refgrid.open_store("tas.json")                  # native grids (zarr >= 3.2)
    with zarr.config.set({"array.rectilinear_chunks": True}):
        ds = xr.open_zarr(store, chunks={})                 # dask chunks: 31, 28, 31, ...
    ds = xr.open_zarr(refgrid.open_store("tas.json", chunks="auto"))  # regular, zarr 3.1

A thin adapter over a :class:`~refgrid.read.view.View`, the one the HTTP service serves
too: ``chunks="native"`` the :class:`~refgrid.read.native.NativeView` (with ``unpack``,
packed variables unpacked on their own grids), anything else the
:class:`~refgrid.read.regular.RegularView`. Each key zarr asks for is parsed once by the
view; the chunks of concurrent requests are read together; a chunk that cannot be read is
the :class:`~refgrid.errors.ReadError` naming array, chunk and URL — only chunks that really
are missing read as the fill value. Chunks that zarr's own codecs decode (strings, records,
filters) are checked by refgrid's bounded decoders first. The store pickles (its input, not
its state), so dask ships it to workers.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, TypedDict

from zarr.abc.store import (
    ByteRequest,
    OffsetByteRequest,
    RangeByteRequest,
    Store,
    SuffixByteRequest,
)
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype

from refgrid.core.bounds import current
from refgrid.core.typed import StorageOptions
from refgrid.errors import ArgumentError
from refgrid.model.virtual import VirtualGroup
from refgrid.read.native import NativeView
from refgrid.read.regular import RegularView, ViewLimits, ViewSpec
from refgrid.read.view import Chunk, Directory, Document, View, acontents, contents
from refgrid.read.view_chunks import ViewChunks

if TYPE_CHECKING:
    from zarr.core.common import BytesLike

    from refgrid.core.sources import Verify
    from refgrid.scanners import Input

READ_ONLY = "store was opened in read-only mode and does not support writing"
"""What zarr's stores say to a write when read-only."""

StoreChunks: TypeAlias = ViewChunks | str
"""``"native"``, ``"auto"`` or ``{dimension: length}`` (:data:`~refgrid.read.view_chunks.
ViewChunks`; another string is refused when the view is made)."""


class _State(TypedDict):
    """What a store pickles: the arguments it was made with."""

    source: Input | VirtualGroup
    chunks: StoreChunks
    unpack: bool
    storage_options: dict[str, object]
    verify_sources: Verify


class RefgridStore(Store):
    """A read-only Zarr v3 store over one refgrid dataset (see the module docstring)."""

    def __init__(self, source: Input | VirtualGroup, chunks: StoreChunks = "native",
                 unpack: bool = False, storage_options: StorageOptions | None = None,
                 verify_sources: Verify = True, *, read_only: bool = True) -> None:
        if not read_only:
            raise ArgumentError("a refgrid store is read-only: it cannot be opened with "
                                "read_only=False")
        super().__init__(read_only=True)
        self.source = os.fspath(source) if isinstance(source, os.PathLike) else source
        self.chunks = chunks
        self.unpack = unpack
        self.verify_sources = verify_sources
        self.storage_options = dict(storage_options or {})
        self._view: View | None = None

    # -- what zarr asks -------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RefgridStore) and self.__getstate__() == other.__getstate__()

    def __repr__(self) -> str:
        where = self.source if isinstance(self.source, str) else type(self.source).__name__
        return f"RefgridStore({where!r}, chunks={self.chunks!r})"

    async def get(self, key: str, prototype: BufferPrototype,
                  byte_range: ByteRequest | None = None) -> Buffer | None:
        data = (await acontents(self.view, [self.view.parse(key)]))[0]
        return None if data is None else prototype.buffer.from_bytes(_ranged(data, byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]
                                 ) -> list[Buffer | None]:
        asked = list(key_ranges)
        held = await acontents(self.view, [self.view.parse(key) for key, _ in asked])
        return [None if data is None else prototype.buffer.from_bytes(_ranged(data, byte_range))
                for data, (_, byte_range) in zip(held, asked, strict=True)]

    async def getsize(self, key: str) -> int:
        return (await self._sizes([key]))[0]

    async def getsize_prefix(self, prefix: str) -> int:
        """The bytes under a node (``prefix`` a node's path, as zarr >= 3.2 reads it on 3.1
        too), sizes known from the references read from them, the others read together."""
        under = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
        keys = [k for k in self.view.all_keys() if k.startswith(under)]
        total = 0
        for start in range(0, len(keys), SIZE_BATCH):  # chunks of a batch held, not all
            total += sum(await self._sizes(keys[start:start + SIZE_BATCH]))
        return total

    async def _sizes(self, keys: Sequence[str]) -> list[int]:
        found = [self.view.parse(key) for key in keys]
        sizes = [len(f.text) if isinstance(f, Document) else
                 self.view.size(f) if isinstance(f, Chunk) else None for f in found]
        unknown = [f for f, n in zip(found, sizes, strict=True)
                   if n is None and isinstance(f, Chunk)]
        read = iter(await self.view.aread(unknown) if unknown else [])
        out = []
        for key, f, n in zip(keys, found, sizes, strict=True):
            data = next(read) if n is None and isinstance(f, Chunk) else None
            if n is None and data is None:
                raise FileNotFoundError(key)
            out.append(n if n is not None else len(data or b""))
        return out

    async def exists(self, key: str) -> bool:
        found = self.view.parse(key)
        return found is not None and not isinstance(found, Directory)

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
        if self._view is not None:
            self._view.close()
        super().close()

    async def set(self, key: str, value: Buffer) -> None:
        raise self._refuse(f"store {key!r}")

    async def set_partial_values(self, key_start_values: Iterable[tuple[str, int, BytesLike]]
                                 ) -> None:
        raise self._refuse("store anything")

    async def delete(self, key: str) -> None:
        raise self._refuse(f"delete {key!r}")

    def _refuse(self, what: str) -> ArgumentError:
        """zarr's own words for a write to a read-only store (tools match them), and ours."""
        return ArgumentError(f"{self!r}: {READ_ONLY} (cannot {what})")

    async def list(self) -> AsyncIterator[str]:
        for key in self.view.all_keys():
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        for key in self.view.all_keys():
            if key.startswith(prefix):
                yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        found = self.view.parse(prefix.rstrip("/"))
        if isinstance(found, Directory):
            for name in found.names:
                yield name.rstrip("/")

    # -- the synchronous surface: zarr's fused codec pipeline reads through it --------------

    @property
    def _supports_sync_io(self) -> bool:
        """Synchronous reads where they cost no round trip: every source a local file (zarr
        asks before taking its synchronous path; remote chunks are gathered by ``aread``)."""
        view = self.view
        return isinstance(view, NativeView) and view.local_sources

    def get_sync(self, key: str, *, prototype: BufferPrototype | None = None,
                 byte_range: ByteRequest | None = None) -> Buffer | None:
        data = contents(self.view, [self.view.parse(key)])[0]
        if data is None:
            return None
        buffer = (prototype or default_buffer_prototype()).buffer
        return buffer.from_bytes(_ranged(data, byte_range))

    def set_sync(self, key: str, value: Buffer) -> None:
        raise self._refuse(f"store {key!r}")

    def delete_sync(self, key: str) -> None:
        raise self._refuse(f"delete {key!r}")

    # -- the view ---------------------------------------------------------------------------

    @property
    def native_view(self) -> NativeView | None:
        """The native view, for refgrid's codec pipeline (None: the regular view, whose
        chunks zarr decodes as they are served)."""
        view = self.view
        return view if isinstance(view, NativeView) else None

    @property
    def view(self) -> View:
        """The view answering keys, made at the first question (so a pickled store opens its
        input where it is unpickled)."""
        if self._view is None:
            self._view = open_view(self.source, self.chunks, self.unpack, self.storage_options,
                                   self.verify_sources)
        return self._view

    def __getstate__(self) -> _State:
        return {"source": self.source, "chunks": self.chunks, "unpack": self.unpack,
                "storage_options": self.storage_options, "verify_sources": self.verify_sources}

    def __setstate__(self, state: _State) -> None:
        self.__init__(**state)  # type: ignore[misc]


STORE_NATIVE_CHUNKS = 2**31
"""A store's view chunk may be assembled from any number of native chunks: its reader asked
for that chunk shape (the service, answering anyone, bounds it: :class:`ViewLimits`)."""
SIZE_BATCH = 256
"""Chunks whose size must be read to know it, read together in :meth:`getsize_prefix`."""


def open_view(source: Input | VirtualGroup, chunks: StoreChunks, unpack: bool,
              storage_options: StorageOptions, verify_sources: Verify = True) -> View:
    """The view of ``source`` a store answers with."""
    from refgrid.scanners import scan

    options: dict[str, Any] = dict(storage_options)  # scan's **storage_options: untyped
    group = source if isinstance(source, VirtualGroup) else scan(source, **options)
    if chunks == "native":
        return NativeView(group, options, verify_sources, unpack, check_decoding=True)
    return RegularView(group, ViewSpec.of(chunks, unpack), options, verify_sources,
                       ViewLimits(current().max_chunk_bytes, STORE_NATIVE_CHUNKS),
                       name=source if isinstance(source, str) else type(source).__name__)


def _ranged(data: bytes, byte_range: ByteRequest | None) -> bytes:
    if byte_range is None:
        return data
    if isinstance(byte_range, RangeByteRequest):
        return data[byte_range.start:byte_range.end]
    if isinstance(byte_range, OffsetByteRequest):
        return data[byte_range.offset:]
    if isinstance(byte_range, SuffixByteRequest):
        return data[-byte_range.suffix:] if byte_range.suffix else b""
    raise ArgumentError(f"Unexpected byte_range, got {byte_range!r}")  # zarr's wording


def open_store(source: Input | VirtualGroup, *, chunks: ViewChunks | str = "native",
               unpack: bool = False, verify_sources: Verify = True,
               **storage_options: object) -> RefgridStore:
    """A read-only ``zarr.abc.store.Store`` over anything :func:`refgrid.scan` accepts (JSON or
    parquet references, a Zarr v3 store, one HDF5/NetCDF file scanned on the fly, a loaded
    dict), for ``xr.open_zarr(store)`` and ``zarr.open_group(store)``.

    ``chunks="native"``: the arrays on their own grids (rectilinear where irregular: zarr
    >= 3.2 with ``zarr.config.set({"array.rectilinear_chunks": True})``, see
    :func:`refgrid.zarr_config`); with ``unpack=True`` packed variables are unpacked (float32
    for float32 factors) on those grids. ``"auto"`` or ``{dim: length}``: the regular view
    :func:`refgrid.get_mapper` gives, which any zarr reads. ``verify_sources``: check each
    source's recorded identity before its first read, and every local read (a source changed
    since the scan, or while it is read, is an error, not other data; ``"strict"``: see the
    engine). ``storage_options`` reach the input and its source files.
    """
    store = RefgridStore(source, chunks, unpack, storage_options, verify_sources)
    _ = store.view  # open now: a bad input is an error here, not at zarr's first read
    return store


__all__ = ["RefgridStore", "open_store", "open_view"]
