"""The regular view: any refgrid dataset on *regular* chunk grids, a
:class:`~refgrid.read.view.View` that stock zarr 3.1 and every Zarr reader read.

Stock zarr 3.1 cannot read rectilinear grids, and reads archives of small chunks slowly.
In this view every chunk is decoded and assembled by refgrid's reader from the native chunks
it covers and served uncompressed. View chunks are

* by default (``chunks="auto"``) blocks of whole native chunks sized by a cost model
  (:mod:`refgrid.read.view_chunks`), so zarr makes few calls without decoding much it was not
  asked for; an array of at most 1 MiB is one chunk;
* with ``chunks="native"`` the native chunks themselves (along an irregular dimension the most
  common native length), a missing native chunk a missing view chunk;
* with ``chunks={"time": 30}`` the lengths given, the other dimensions as ``"native"``;

and with ``unpack``, packed variables are served unpacked (:mod:`.unpacked`). A growing
archive's view (``growing``: its concat dimension) chunks that dimension in lengths appends
never change (:func:`~refgrid.read.view_chunks.growing_length`), so what a reader was told of
a chunk stays true after an append: its last chunk gains values beyond the extent the reader
knows, and nothing else changes. The root
``zarr.json`` carries consolidated metadata, so opening costs one request.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

import numcodecs
import numpy as np

from refgrid.codecs.filters import plain_codec
from refgrid.core.dtypes import (
    ATTRIBUTE_TYPES_ATTR,
    DTYPE_ATTR,
    ENCODING_ATTR,
    original_dtype,
    zarr_records,
)
from refgrid.core.keys import BOOKKEEPING
from refgrid.core.sources import Verify, source_check
from refgrid.core.typed import Attributes, StorageOptions
from refgrid.core.util import thread_pool
from refgrid.errors import ArgumentError, FormatError, RefgridError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.manifest import ChunkManifest, PresentChunks
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import (
    KEY_ENCODING_ATTR,
    Document,
    array_document,
    bookkeeping,
    consolidated,
    group_document,
    node_paths,
)
from refgrid.read.array import ArrayReader, read_fill, reader_of
from refgrid.read.unpacked import packed, unpack_values, unpacked_array
from refgrid.read.view import Chunk, Parsed, Tree
from refgrid.read.view_chunks import ViewChunks, view_chunks
from refgrid.refs.section import ATTRIBUTES_KEY

if TYPE_CHECKING:
    from refgrid.model.zarr_json import GroupDocument

WORKERS = 8
"""Threads assembling chunks for the regular views of this process."""


@dataclass(frozen=True)
class ViewSpec:
    """Which regular view: its chunks (``"auto"``, ``"native"`` or lengths by dimension) and
    whether packed variables are served unpacked."""

    chunks: str | tuple[tuple[str, int], ...] = "auto"
    unpack: bool = False

    @classmethod
    def parse(cls, chunks: str | None, unpack: str | None) -> ViewSpec:
        """From the URL forms ``chunks=time:30,lat:10`` (or ``auto``/``native``) and
        ``unpack=true``."""
        flag = (unpack or "false").lower()
        if flag not in ("true", "false", "1", "0", "yes", "no"):
            raise ArgumentError(f"unpack={unpack!r}: say true or false")
        text = (chunks or "auto").strip()
        if text in ("auto", "native"):
            return cls(text, flag in ("true", "1", "yes"))
        lengths: dict[str, int] = {}
        for item in text.split(","):
            dim, sep, value = item.partition(":")
            if not sep or not dim or not value.isdigit() or int(value) < 1:
                raise ArgumentError(f"chunks={text!r}: expected auto, native or "
                                    "DIM:LENGTH[,DIM:LENGTH...] with lengths >= 1")
            lengths[dim] = int(value)
        return cls(tuple(sorted(lengths.items())), flag in ("true", "1", "yes"))

    @classmethod
    def of(cls, chunks: ViewChunks | str, unpack: bool = False) -> ViewSpec:
        """From the Python form: ``"auto"``, ``"native"`` or ``{dim: length}``."""
        if isinstance(chunks, str):
            return cls.parse(chunks, "true" if unpack else "false")
        if isinstance(chunks, Mapping):
            bad = {d: n for d, n in chunks.items()
                   if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1}
            if bad:
                raise ArgumentError(f"chunks={dict(chunks)!r}: lengths are integers >= 1, "
                                    f"not {bad!r}")
            return cls(tuple(sorted((str(d), int(n)) for d, n in chunks.items())), unpack)
        raise ArgumentError(f"chunks must be 'native', 'auto' or {{dim: length}}, not "
                            f"{chunks!r}")

    @property
    def view_chunks(self) -> ViewChunks:
        return dict(self.chunks) if isinstance(self.chunks, tuple) else self.chunks  # type: ignore[return-value]

    def __str__(self) -> str:
        chunks = self.chunks if isinstance(self.chunks, str) else \
            ",".join(f"{d}:{n}" for d, n in self.chunks)
        return f"chunks={chunks}" + (";unpack=true" if self.unpack else "")


@dataclass(frozen=True)
class Served:
    """How one array is served: in its native chunks or re-chunked to a regular grid,
    optionally CF-unpacked. Chunks are always decoded by refgrid and served uncompressed, so
    a chunk that does not decode is a :class:`refgrid.ReadError` naming it, not an error
    from inside zarr."""

    array: VirtualArray
    chunk_shape: tuple[int, ...]
    native: bool
    """The view's chunks are the native ones (a missing native chunk is a missing chunk)."""
    unpacked: bool = False
    records: np.dtype | None = None
    """Records stored as raw bytes, served typed (packed, little-endian fields)."""

    @property
    def grid(self) -> RectilinearGrid:
        return RectilinearGrid.regular(self.array.shape, self.chunk_shape)

    def document(self) -> Document:
        grid = self.grid
        empty = ChunkManifest.empty(grid.chunk_counts)
        if self.unpacked:
            return array_document(replace(unpacked_array(self.array), grid=grid,
                                          manifest=empty))
        if self.records is not None:
            dtype, fill = self.records, None
            attrs = {k: v for k, v in readable_attrs(self.array).items() if k != DTYPE_ATTR}
        else:
            dtype = self.array.dtype if self.array.dtype.kind in "OT" else \
                self.array.value_dtype
            fill, attrs = self.array.fill_value, readable_attrs(self.array)
        return array_document(VirtualArray(self.array.name, self.array.dims, dtype, grid, empty,
                                           fill, (plain_codec(dtype),), attrs))


def readable_attrs(array: VirtualArray) -> Attributes:
    """The attributes, less a ``_FillValue`` an integer array cannot hold (NaN, say): xarray
    drops it with a warning reading the source file, but fails on it reading zarr."""
    attrs = {k: v for k, v in array.attrs.items() if k != ENCODING_ATTR}
    fill = attrs.get("_FillValue")
    if array.dtype.kind in "iu" and isinstance(fill, float) and not fill.is_integer():
        del attrs["_FillValue"]
    return attrs


@dataclass(frozen=True)
class ViewLimits:
    max_chunk_bytes: int = 256 * 2**20
    """The largest view chunk one read may assemble."""
    max_native_chunks: int = 4096
    """The most native chunks one view chunk may be assembled from."""


class RegularView:
    """The regular-grid view of a dataset (see the module docstring); an
    :class:`~refgrid.errors.ArgumentError` where its chunks are more than ``limits`` allow
    one read to assemble."""

    def __init__(self, group: VirtualGroup, spec: ViewSpec = ViewSpec(),
                 storage_options: StorageOptions | None = None,
                 verify_sources: Verify = True, limits: ViewLimits | None = None, *,
                 executor: Executor | None = None, inline_reads: bool = True,
                 name: str = "<dataset>", growing: str | None = None) -> None:
        self.spec = spec
        self.executor = executor or thread_pool("refgrid-view", WORKERS)
        self.inline_reads = inline_reads
        """Whether :meth:`aread` assembles on the caller's thread (zarr's loop, in a store or
        a mapper: a hop to a thread per chunk costs more than most assemblies, which decode
        on refgrid's threads where large), not on :attr:`executor` (the service's loop must
        stay free)."""
        self.storage_options = dict(storage_options or {})
        self.check = source_check(group.sources, self.storage_options, verify_sources)
        arrays = node_paths(group)
        if isinstance(spec.chunks, tuple):
            dims = {d for a in arrays.values() for d in a.dims}
            unknown = sorted({d for d, _ in spec.chunks} - dims)
            if unknown:
                raise ArgumentError(f"{spec}: no dimension {', '.join(map(repr, unknown))} "
                                    f"(the dimensions are {', '.join(sorted(dims))})")
        self.served: dict[str, Served] = {}
        try:
            for path, node in arrays.items():
                node = replace(node, attrs={k: v for k, v in node.attrs.items()
                                            if k != KEY_ENCODING_ATTR})  # its own keys
                shape, native = view_chunks(node, spec.view_chunks, growing)
                records = zarr_records(original_dtype(node.attrs, node.value_dtype)) \
                    if DTYPE_ATTR in node.attrs else None
                self.served[path] = Served(node, shape, native, spec.unpack and packed(node),
                                           records)
            docs: dict[str, Document] = {path: v.document() for path, v in self.served.items()}
            if "" not in docs:
                docs.update({path: group_document(g) for path, g in
                             [("", group), *group.walk()] if isinstance(g, VirtualGroup)})
                docs[""] = cast("GroupDocument", consolidated(docs[""], docs))
        except RefgridError:
            raise
        except Exception as e:  # metadata the scan accepted but no Zarr document can hold
            raise FormatError(name, None, f"cannot be served as Zarr: "
                              f"{type(e).__name__}: {e}") from e
        self.arrays = {path: replace(v.array, grid=v.grid, segments=None,
                                     manifest=ChunkManifest.empty(v.grid.chunk_counts))
                       for path, v in self.served.items()}
        """The arrays as the view's keys name them: on the view's grids."""
        self.tree = Tree(group, self.arrays, {n: json.dumps(d).encode() for n, d in
                                              docs.items()},
                         {path: _held(v) for path, v in self.served.items()},
                         {BOOKKEEPING: _bookkeeping(group)})
        if limits is not None:
            self._check(limits)
        self._readers: dict[str, ArrayReader] = {}

    def _check(self, limits: ViewLimits) -> None:
        for path, served in self.served.items():
            nbytes = math.prod(served.chunk_shape) * served.array.dtype.itemsize
            if nbytes > limits.max_chunk_bytes:
                raise ArgumentError(f"{self.spec}: a chunk of {path!r} would be {nbytes:,} "
                                    f"bytes, more than the limit of "
                                    f"{limits.max_chunk_bytes:,}")
            sources = _native_per_chunk(served.array, served.chunk_shape)
            if sources > limits.max_native_chunks:
                raise ArgumentError(f"{self.spec}: a chunk of {path!r} would be assembled "
                                    f"from up to {sources:,} native chunks, more than the "
                                    f"limit of {limits.max_native_chunks:,}")

    # -- the View protocol -----------------------------------------------------------------

    @property
    def documents(self) -> dict[str, bytes]:
        return self.tree.documents

    def parse(self, key: str) -> Parsed | None:
        return self.tree.parse(key)

    def all_keys(self) -> Iterator[str]:
        yield from self.tree.keys()

    def size(self, chunk: Chunk) -> int | None:
        return None  # assembled when asked for

    def read(self, chunks: Sequence[Chunk]) -> list[bytes | None]:
        return [self._assembled(chunk) for chunk in chunks]

    async def aread(self, chunks: Sequence[Chunk]) -> list[bytes | None]:
        if self.inline_reads:
            return self.read(chunks)
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.read,
                                                                list(chunks))

    def close(self) -> None:
        pass

    # -- assembling ------------------------------------------------------------------------

    def _assembled(self, chunk: Chunk) -> bytes | None:
        served = self.served[chunk.array]
        array = served.array
        region = tuple(slice(c * n, min((c + 1) * n, size)) for c, n, size in
                       zip(chunk.coords, served.chunk_shape, array.shape, strict=True))
        if any(r.start >= r.stop for r in region) and array.shape:
            return None
        reader = self._readers.get(chunk.array)
        if reader is None:
            reader = self._readers[chunk.array] = reader_of(array, chunk.array,
                                                         self.storage_options, self.check)
        values = reader.read(region)
        fill = read_fill(array)
        if served.records is not None:
            values = values.view(original_dtype(array.attrs, array.value_dtype))
            values, fill = values.astype(served.records), np.zeros((), served.records)[()]
        if served.unpacked:
            values, fill = unpack_values(array, values), np.nan
        block = np.full(served.chunk_shape, fill, dtype=values.dtype)
        block[tuple(slice(0, r.stop - r.start) for r in region) or ...] = values  # (0-d too)
        if values.dtype.kind == "O":
            codec = numcodecs.VLenUTF8() if array.dtype.kind == "T" else numcodecs.VLenBytes()
            return bytes(codec.encode(block.reshape(-1)))
        return np.ascontiguousarray(block, dtype=block.dtype.newbyteorder("<")
                                    if block.dtype.itemsize > 1 and block.dtype.kind != "V"
                                    else block.dtype).tobytes()


def _held(served: Served) -> np.ndarray | PresentChunks:
    """The view chunks a view holds: those with elements (an array with a dimension of
    length 0 has none), and where a view chunk is a native chunk, only the native chunks
    written (one never written is the fill value, as in the source) — but for an array in
    segments, where such a chunk reads as its own segment's fill, decoded."""
    counts = served.grid.chunk_counts
    if served.native and served.array.segments is None:  # (in segments, a chunk never
        return served.array.manifest.written()  # written reads as its segment's fill)
    if 0 in served.array.shape:
        return np.zeros(counts, bool)
    return np.ones(counts, bool)


SERVED_BOOKKEEPING = (ATTRIBUTE_TYPES_ATTR, ENCODING_ATTR)
"""What of refgrid's bookkeeping still holds for the values this view serves (typed records
and sequences, its own keys: not the rest)."""


def _bookkeeping(group: VirtualGroup) -> bytes:
    """refgrid's bookkeeping for a reader of this view (refgrid's engine pointed at a served
    regular view unpacks float32 factors to float32 with it)."""
    kept = {node: {k: v for k, v in attrs.items() if k in SERVED_BOOKKEEPING}
            for node, attrs in bookkeeping(group).items()}
    return json.dumps({ATTRIBUTES_KEY: {n: a for n, a in kept.items() if a}}).encode()


def _native_per_chunk(array: VirtualArray, chunk_shape: tuple[int, ...]) -> int:
    """The most native chunks a view chunk of ``chunk_shape`` overlaps."""
    return math.prod(int(axis.overlaps(n).max()) for axis, n in
                     zip(array.grid.axes, chunk_shape, strict=True) if axis.nchunks)
