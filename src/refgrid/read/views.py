"""The two Zarr v3 stores a dataset is served as, as plain lookups from key to content.

* :class:`NativeView`: the dataset as it is — its own ``zarr.json`` documents (rectilinear
  grids, codecs) and each chunk's stored bytes, passed through; a chunk padded inside the
  array (an HDF5 file's padded last chunk, once files are concatenated) is served cropped and
  re-encoded, and the documents declare its real extent, so zarr >= 3.2 reads it (no
  ``encoded_chunk_shapes`` left for a reader to understand);
* :class:`RegularView`: the regular-grid view of :mod:`refgrid.read.mapper`, which stock zarr
  3.1 reads, assembled and decoded by refgrid.

Nothing here knows HTTP: the app asks what a key is (:meth:`NativeView.lookup`), then fetches
chunk bytes on worker threads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refgrid.core.keys import BOOKKEEPING, chunk_of_key, document_node
from refgrid.core.sources import ATTRIBUTES_KEY, SourceCheck, held, is_local
from refgrid.errors import ArgumentError, FormatError, RefgridError
from refgrid.model.manifest import INLINE, MISSING, UNSIZED, flat_index
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.model.zarr_json import bookkeeping, consolidated, documents
from refgrid.read.array import Reader, fetch_chunks
from refgrid.read.cropped import (
    Cropper,
    padded_arrays,
    padded_mask,
    portable_documents_group,
)
from refgrid.read.fetch import OpenFiles
from refgrid.read.mapper import RegularViewFileSystem, packed, unpack_values, unpacked_array
from refgrid.read.view_chunks import ViewChunks


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

    @property
    def view_chunks(self) -> ViewChunks:
        return dict(self.chunks) if isinstance(self.chunks, tuple) else self.chunks  # type: ignore[return-value]

    def __str__(self) -> str:
        chunks = self.chunks if isinstance(self.chunks, str) else \
            ",".join(f"{d}:{n}" for d, n in self.chunks)
        return f"chunks={chunks}" + (";unpack=true" if self.unpack else "")


@dataclass(frozen=True)
class Metadata:
    """A ``zarr.json`` (its JSON text)."""

    text: bytes


@dataclass(frozen=True)
class Listing:
    """A node's directory: the names below it (a trailing ``/`` for nodes)."""

    names: tuple[str, ...]


class StoredChunk(NamedTuple):
    """A chunk whose bytes are in a source file: ``flat`` is its C-order index; ``nbytes``
    None where it is a whole file of unknown size (which may be absent)."""

    array: str
    flat: int
    nbytes: int | None


@dataclass(frozen=True)
class Assembled:
    """A chunk of the regular view: decoded and assembled from native chunks on request."""

    key: str


@dataclass(frozen=True)
class Cropped:
    """A chunk padded inside its array: fetched, cropped and re-encoded on request."""

    key: str


@dataclass(frozen=True)
class Bytes:
    """Content already at hand (an inlined chunk)."""

    data: bytes


Found = Metadata | Listing | StoredChunk | Assembled | Cropped | Bytes | None
"""What a key is: None for nothing (404, which for a chunk key means "fill value")."""


def _tree(group: VirtualGroup) -> tuple[dict[str, VirtualGroup], dict[str, VirtualArray]]:
    groups: dict[str, VirtualGroup] = {"": group}
    arrays: dict[str, VirtualArray] = {}
    for path, node in group.walk():
        if isinstance(node, VirtualGroup):
            groups[path] = node
        else:
            arrays[path] = node
    return groups, arrays


def _names(node: str, groups: Mapping[str, VirtualGroup]) -> list[str]:
    group = groups[node]
    return ["zarr.json", *(f"{n}/" for n in (*group.arrays, *group.groups))]


class _View:
    """What both views share: node documents (JSON text) and node directories."""

    groups: Mapping[str, VirtualGroup]
    arrays: Mapping[str, Any]
    documents: dict[str, bytes]

    documents_extra: dict[str, bytes] = {}  # noqa: RUF012 (read only)
    """Documents by key that are not Zarr's, and not listed: refgrid's bookkeeping."""

    def _node(self, key: str) -> tuple[bool, Found]:
        """``(True, answer)`` for a document's or a group's key, ``(False, None)`` for a key
        the view itself answers."""
        if key in self.documents_extra:
            return True, Metadata(self.documents_extra[key])
        node = document_node(key)
        if node is not None:
            text = self.documents.get(node)
            return True, (Metadata(text) if text is not None else None)
        if key in self.groups:
            return True, Listing(tuple(_names(key, self.groups)))
        return False, None


class NativeView(_View):
    """The dataset's own Zarr v3 store: its documents, and its chunks byte for byte.

    ``unpack``: packed variables (``scale_factor``/``add_offset``) are served as xarray
    unpacks the source file — float32 for int16 with float32 factors, masked — on their own
    grid, each chunk decoded, unpacked and served uncompressed: JSON attributes lose their
    float32 type, so a stock reader would unpack in float64 itself."""

    def __init__(self, group: VirtualGroup, storage_options: dict[str, Any],
                 verify_sources: bool = True, unpack: bool = False) -> None:
        self.groups, self.arrays = _tree(group)
        self.padded = {path: padded_mask(array.grid).reshape(-1)
                       for path, array in padded_arrays(group).items()}
        portable = portable_documents_group(group)
        self.unpacked = {path: unpacked_array(node) for path, node in portable.walk()
                         if unpack and isinstance(node, VirtualArray) and packed(node)}
        docs: dict[str, Any] = {k[:-len("zarr.json")].rstrip("/"): v for k, v in
                                documents(portable.with_arrays(self.unpacked)).items()}
        docs[""] = consolidated(docs[""], docs)
        self.documents = {node: json.dumps(doc).encode() for node, doc in docs.items()}
        self.documents_extra = {BOOKKEEPING: json.dumps(
            {ATTRIBUTES_KEY: bookkeeping(group)}).encode()}
        self.storage_options = storage_options
        self.check = SourceCheck(group.sources, storage_options) \
            if verify_sources and group.sources else None
        self._local: dict[str, bool] = {}
        self.files = OpenFiles()
        self._croppers: dict[str, Cropper] = {}
        self._readers: dict[str, Reader] = {}

    def lookup(self, key: str) -> Found:
        answered, found = self._node(key)
        if answered:
            return found
        if key in self.arrays:
            names = ["zarr.json"]
            if (self.arrays[key].manifest.path_id != MISSING).any():
                names.append("c" if self.arrays[key].grid.ndim == 0 else "c/")
            return Listing(tuple(names))
        chunk = chunk_of_key(key, self.arrays)
        if chunk is None:
            return None
        path, tail = chunk
        array = self.arrays[path]
        coords = _coords(tail, array.manifest.shape)
        if coords is None:
            return _chunk_directory(array, tail)
        flat = flat_index(coords, array.manifest.shape)
        kind = int(array.manifest.path_id.reshape(-1)[flat])
        if kind == MISSING:
            return None
        if path in self.unpacked:
            return Assembled(key)
        if path in self.padded and self.padded[path][flat]:
            return Cropped(key)
        if kind == INLINE:
            return Bytes(bytes(array.manifest.inline[coords]))
        nbytes = int(array.manifest.length.reshape(-1)[flat])
        return StoredChunk(path, flat, nbytes if nbytes != UNSIZED else None)

    def content(self, key: str) -> bytes | None:
        """A padded chunk (:class:`Cropped`), cropped to its extent, or a chunk of a packed
        array served unpacked (:class:`Assembled`) — blocking."""
        found = chunk_of_key(key, self.arrays)
        assert found is not None
        path, tail = found
        array = self.arrays[path]
        coords = _coords(tail, array.manifest.shape)
        assert coords is not None
        if path in self.unpacked:
            return self._unpacked(path, coords)
        cropper = self._croppers.get(path)
        if cropper is None:
            cropper = self._croppers[path] = Cropper(path, array)
        flat = np.array([flat_index(coords, array.manifest.shape)])
        return next(data for _, data in cropper.chunks(flat, self.storage_options, self.check))

    def reader(self, path: str) -> Reader:
        """The reader of array ``path`` (made once)."""
        found = self._readers.get(path)
        if found is None:
            found = self._readers[path] = Reader(self.arrays[path], path,
                                                 self.storage_options, self.check)
        return found

    def _unpacked(self, path: str, coords: tuple[int, ...]) -> bytes:
        array, served = self.arrays[path], self.unpacked[path]
        grid = served.grid
        region = tuple(slice(int(a.bounds[c]), int(a.bounds[c] + a.logical[c]))
                       for a, c in zip(grid.axes, coords, strict=True))
        values = self.reader(path).read(region)
        block = np.full(grid.encoded_chunk_shape(coords), np.nan, served.dtype)
        block[tuple(slice(0, r.stop - r.start) for r in region) or ...] = \
            unpack_values(array, values)
        return np.ascontiguousarray(block, block.dtype.newbyteorder("<")).tobytes()

    def local(self, path: str) -> bool:
        """Whether every source of array ``path`` is a local file (read in microseconds:
        cheaper to read at once than to hand to a thread)."""
        local = self._local.get(path)
        if local is None:
            local = self._local[path] = all(is_local(u) for u in
                                            self.arrays[path].manifest.paths)
        return local

    def stored(self, path: str, flat: int) -> bytes | None:
        """The stored bytes of one chunk (blocking): of a local file, one ``pread`` on the
        file kept open (a store answers zarr's gets one chunk at a time, where the general
        :meth:`fetch` would cost ten times the read); anything else, and any read that
        fails or comes back short, goes through :meth:`fetch`, which names the reason."""
        manifest = self.arrays[path].manifest
        url = manifest.paths[int(manifest.path_id.reshape(-1)[flat])]
        length = int(manifest.length.reshape(-1)[flat])
        if is_local(url) and held(url) is None and length != UNSIZED:
            if self.check is not None and url not in self.check.checked:
                self.check.start((url,))()
            data = self.files.pread(url, int(manifest.offset.reshape(-1)[flat]), length)
            if data is not None and len(data) == length:
                return data
        return self.fetch(path, [flat])[0]

    def fetch(self, path: str, flats: list[int]) -> list[bytes | None]:
        """The stored bytes of chunks ``flats`` of array ``path`` (blocking; checks the
        sources' identities first); None for a chunk file that is absent."""
        blobs = fetch_chunks(self.arrays[path], path, np.asarray(flats, dtype=np.int64),
                             self.storage_options, self.check)
        return [bytes(b) if b is not None else None for b in blobs]


def _chunk_directory(array: VirtualArray, tail: str) -> Listing | None:
    """The directory ``c/0/`` of an array's chunk keys (as a static server would list the
    files of a store on disk): the present chunks' next coordinates below it."""
    parts = tail.split("/") if tail else []
    ndim = array.grid.ndim
    if len(parts) >= ndim or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    present = array.manifest.path_id != MISSING
    where = tuple(int(p) for p in parts)
    if any(c >= n for c, n in zip(where, present.shape, strict=False)):
        return None
    block = present[where] if parts else present
    if not block.any():
        return None
    below = np.flatnonzero(block.reshape(block.shape[0], -1).any(axis=1))
    last = len(parts) == ndim - 1
    return Listing(tuple(f"{i}" if last else f"{i}/" for i in below.tolist()))


def _coords(tail: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """Chunk coordinates from ``"0/3/1"`` (``""`` for a 0-d array), or None if they are not
    coordinates of a chunk of a grid of ``shape``."""
    parts = tail.split("/") if tail else []
    if len(parts) != len(shape) or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    coords = tuple(int(p) for p in parts)
    return coords if all(c < n for c, n in zip(coords, shape, strict=True)) else None


class RegularView(_View):
    """The regular-grid view of a dataset, with limits on what one chunk may cost."""

    def __init__(self, fs: RegularViewFileSystem) -> None:
        self.fs = fs
        self.groups, self.arrays = fs.groups, fs.views
        self.documents = {node: json.dumps(doc).encode() for node, doc in fs.documents.items()}

    @classmethod
    def make(cls, group: VirtualGroup, spec: ViewSpec, storage_options: dict[str, Any],
             max_chunk_bytes: int, max_native_chunks: int, verify_sources: bool = True
             ) -> RegularView:
        """The view; an :class:`ArgumentError` when its chunks are more than one request may
        assemble."""
        if isinstance(spec.chunks, tuple):
            dims = {d for _, node in group.walk() if isinstance(node, VirtualArray)
                    for d in node.dims}
            unknown = sorted({d for d, _ in spec.chunks} - dims)
            if unknown:
                raise ArgumentError(f"{spec}: no dimension {', '.join(map(repr, unknown))} "
                                    f"(the dimensions are {', '.join(sorted(dims))})")
        try:
            fs = RegularViewFileSystem(group, spec.view_chunks, storage_options, spec.unpack,
                                       verify_sources)
        except RefgridError:
            raise
        except Exception as e:  # metadata no Zarr document can hold
            raise FormatError("<dataset>", None, f"cannot be served as Zarr: "
                              f"{type(e).__name__}: {e}") from e
        for path, view in fs.views.items():
            nbytes = math.prod(view.chunk_shape) * view.array.dtype.itemsize
            if nbytes > max_chunk_bytes:
                raise ArgumentError(f"{spec}: a chunk of {path!r} would be {nbytes:,} bytes, "
                                    f"more than the limit of {max_chunk_bytes:,}")
            sources = _native_per_chunk(view.array, view.chunk_shape)
            if sources > max_native_chunks:
                raise ArgumentError(f"{spec}: a chunk of {path!r} would be assembled from up "
                                    f"to {sources:,} native chunks, more than the limit of "
                                    f"{max_native_chunks:,}")
        return cls(fs)

    def lookup(self, key: str) -> Found:
        answered, found = self._node(key)
        if answered:
            return found
        if key in self.arrays:
            return Listing(("zarr.json",))
        return Assembled(key) if chunk_of_key(key, self.arrays) else None

    def content(self, key: str) -> bytes | None:
        """A chunk of the view (blocking: decodes and assembles), None if it is absent."""
        try:
            return self.fs.cat_file(key)
        except FileNotFoundError:
            return None


def _native_per_chunk(array: VirtualArray, chunk_shape: tuple[int, ...]) -> int:
    """The most native chunks a view chunk of ``chunk_shape`` overlaps."""
    return math.prod(int(axis.overlaps(n).max()) for axis, n in
                     zip(array.grid.axes, chunk_shape, strict=True) if axis.nchunks)
