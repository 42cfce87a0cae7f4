"""Reading a virtual array: selection → chunks → byte ranges → decode → crop → assemble.

The selection is decomposed per axis (:mod:`refgrid.grid.selection`) and read in boxes of chunks.
A box's chunks are fetched as coalesced byte ranges, decompressed as one batch, laid side by
side as tiles, and the selection is copied out of all of them in one numpy step: beyond the
decompressor call there is no Python work per chunk. Chunks decode to their *encoded* shape and
only logical elements are ever selected, so padded chunks inside a rectilinear grid read
correctly; missing chunks read as the fill value. Boxes are small (a few MiB, so buffers stay
in cache and are reused) and are read by a thread pool — ``os.pread``, the decompressors and
numpy's copies release the GIL, so every core works. Remote chunks are fetched for all boxes
in one round of concurrent requests first, so a read costs about one request per file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn, cast

import numpy as np

from refgrid.core.bounds import current as current_limits
from refgrid.core.keys import chunk_key
from refgrid.core.sources import SourceCheck
from refgrid.core.typed import Bytes, StorageOptions
from refgrid.core.util import thread_pool
from refgrid.errors import ReadError, RefgridError
from refgrid.grid.selection import AxisTile, orthogonal_index
from refgrid.model.manifest import INLINE, MISSING, UNSIZED, chunk_coords
from refgrid.model.virtual import VirtualArray
from refgrid.model.zarr_json import key_encoding
from refgrid.read.decode import ChunkDecodeError, chunk_decoder
from refgrid.read.fetch import FetchError, is_local, read_ranges
from refgrid.read.segmented import ArrayReader, SegmentedReader

BOX_BYTES = 8 * 2**20
"""Decoded bytes of one box: small enough to stay in cache and for its buffers to be reused."""
PARALLEL_BYTES = 256 * 2**10
"""Reads decoding less than this stay in the calling thread (a thread hop costs more)."""
WORKERS = max(2, min(8, os.cpu_count() or 1))

def _executor() -> ThreadPoolExecutor:
    return thread_pool("refgrid-read", WORKERS)


def read_fill(array: VirtualArray) -> object:
    """What a missing chunk reads as: the fill value, else zero of the output type."""
    if array.fill_value is not None:
        return array.fill_value
    return np.zeros((), array.value_dtype)[()]


def read(array: VirtualArray, selection: object = ..., *,
         storage_options: StorageOptions | None = None, path: str | None = None,
         check: SourceCheck | None = None) -> np.ndarray:
    """``array[selection]`` (orthogonal indexing) read through the references; ``check``
    verifies each source file's identity before its first read."""
    return reader_of(array, path or array.name, storage_options, check).read(selection)


def reader_of(array: VirtualArray, name: str, storage_options: StorageOptions | None,
              check: SourceCheck | None) -> ArrayReader:
    """The reader of ``array``: :class:`Reader`, made per segment where it has them."""
    if array.segments is not None:
        return SegmentedReader(array, name, storage_options, check, Reader)
    return Reader(array, name, storage_options, check)


def chunk_error(array: VirtualArray, name: str, flat: int, reason: str) -> ReadError:
    """The one way a chunk that cannot be read is named: the array (``name``), the chunk's
    key, where its bytes are — ``URL bytes START-END``, ``URL, the whole file`` or ``inline
    bytes`` — and the reason."""
    manifest = array.manifest
    key = chunk_key(name, chunk_coords(flat, manifest.shape), key_encoding(array))
    found = manifest.locate([flat])
    pid = int(found.path_id[0])
    if pid == INLINE:
        where = "inline bytes"
    elif pid == MISSING:
        where = "never written"
    else:
        url = manifest.table[pid]
        start, length = int(found.offset[0]), int(found.length[0])
        where = f"{url}, the whole file" if length == UNSIZED else \
            f"{url} bytes {start}-{start + length}"
    return ReadError(f"array {name!r}, chunk {key} ({where}): {reason}")


def fetch_chunks(array: VirtualArray, name: str, flat: np.ndarray,
                 storage_options: StorageOptions | None,
                 check: SourceCheck | None = None) -> list[Bytes | None]:
    """The stored bytes of chunks ``flat`` (C-order indices of stored chunks), checked for
    length; a missing file, a changed source, a failed request or a short read is a
    :class:`ReadError` naming the chunk (:func:`chunk_error`). A chunk that is a whole file
    of unknown size (:data:`~refgrid.model.manifest.UNSIZED`) and absent is None."""
    path_id, offset, length = array.manifest.locate(flat)
    table = array.manifest.table
    try:
        checked = check.start(table[int(i)] for i in np.unique(path_id[path_id >= 0])) \
            if check is not None else None
        try:
            blobs = read_ranges(table, path_id, offset, length, storage_options, check)
        finally:  # no bytes handed out, nor a failed read reported, before the check is done
            if checked is not None:
                checked()
    except FetchError as e:
        reason = "source file not found" if e.missing else e.reason
        raise chunk_error(array, name, int(flat[e.index]), reason) from e
    except ReadError as e:  # a source that changed: name a chunk of it
        named = next((k for k, i in enumerate(path_id.tolist())
                      if i >= 0 and table[i] in str(e)), 0)
        raise chunk_error(array, name, int(flat[named]), str(e)) from e
    except RefgridError:
        raise
    except Exception as e:  # a URL no filesystem takes, ...: named, whatever it was
        raise chunk_error(array, name, int(flat[0]), f"cannot fetch: {type(e).__name__}: "
                          f"{e}") from e
    got = np.fromiter(map(len, cast("list[Bytes]", blobs)) if not (length == UNSIZED).any()
                      else (len(b) if b is not None else -1 for b in blobs),  # (only those
                      np.int64, len(blobs))  # may be None)
    short = np.flatnonzero((got != length.astype(np.int64)) & (length != UNSIZED))
    if len(short):
        j = int(short[0])
        raise chunk_error(array, name, int(flat[j]), f"short read ({got[j]} of "
                          f"{int(length[j])} bytes)")
    return blobs


class Reader:
    """What every read of one array shares: the array, its decoder, names for messages.
    Kept by callers that read one array many times in small pieces (the views)."""

    def __init__(self, array: VirtualArray, name: str,
                 storage_options: StorageOptions | None, check: SourceCheck | None) -> None:
        self.array = array
        self.name = name
        self.storage_options = storage_options
        self.check = check
        first = tuple(int(a.encoded[0]) if a.nchunks else 1 for a in array.grid.axes)
        self.chunk_nbytes = math.prod(first) * array.dtype.itemsize
        """About what one chunk decodes to (the first one's size)."""
        largest = math.prod(int(a.encoded.max()) if a.nchunks else 1
                            for a in array.grid.axes) * array.dtype.itemsize
        if largest > current_limits().max_chunk_bytes:
            raise ReadError(f"array {name!r}: chunks decode to up to {largest} bytes, more than "
                            f"the limit of {current_limits().max_chunk_bytes} "
                            "(refgrid.set_limits(max_chunk_bytes=...) raises it)")
        try:
            self.decoder = chunk_decoder(array.codecs, array.dtype)
        except Exception as e:  # a codec's own checks of its configuration raise anything
            names = [c.get("name") if isinstance(c, dict) else c for c in array.codecs]
            raise ReadError(f"array {name!r}: cannot decode codecs {names}: "
                            f"{type(e).__name__}: {e}") from e
        self.slot_dtype = self.decoder.stored if self.decoder.plain else array.value_dtype
        self.fill = read_fill(array)

    def read(self, selection: object = ...) -> np.ndarray:
        """``array[selection]``, as :func:`read`."""
        chosen = self.array.grid.select(selection)
        out = np.empty(chosen.kept_shape, dtype=self.array.value_dtype)
        threads = WORKERS if chosen.nchunks * self.chunk_nbytes >= PARALLEL_BYTES else 1
        boxes = [_Box(self, tiles) for tiles in chosen.boxes(self.slot_dtype.itemsize,
                                                             BOX_BYTES, threads)]
        remote = [b for b in boxes if b.remote]
        if remote:
            self.prefetch(remote)
        if len(boxes) == 1:
            boxes[0].read_into(out)
        elif boxes:
            futures = [_executor().submit(box.read_into, out) for box in boxes]
            try:
                for future in futures:
                    future.result()
            finally:
                for future in futures:
                    future.cancel()
        return out.reshape(chosen.shape)

    def fail(self, flat: int, error: Exception) -> NoReturn:
        """Chunk ``flat`` does not decode: named, its cause chained (``--debug`` shows it)."""
        reason = str(error) if isinstance(error, ChunkDecodeError) else \
            f"{type(error).__name__}: {error}"  # (a batch's error names its cause already)
        raise chunk_error(self.array, self.name, flat, f"does not decode: {reason}") from error

    def fetch(self, flat: np.ndarray) -> list[Bytes | None]:
        return fetch_chunks(self.array, self.name, flat, self.storage_options, self.check)

    def prefetch(self, boxes: list[_Box]) -> None:
        """Fetch the stored chunks of all ``boxes`` in one round of requests."""
        blobs = self.fetch(np.concatenate([b.flat[b.stored] for b in boxes]))
        first = 0
        for box in boxes:
            box.blobs = blobs[first: first + len(box.stored)]
            first += len(box.stored)


class _Box:
    """One box of chunks: fetched, decoded into tiles, copied into the output."""

    def __init__(self, reader: Reader, tiles: tuple[AxisTile, ...]) -> None:
        self.reader = reader
        self.tiles = tiles
        manifest = reader.array.manifest
        self.flat = np.ravel_multi_index(np.ix_(*(t.chunks for t in tiles)),
                                         manifest.shape).reshape(-1) if tiles else \
            np.zeros(1, np.intp)
        located = manifest.locate(self.flat)
        self.path_id = located.path_id
        self.length = located.length
        self.stored = np.flatnonzero(self.path_id >= 0)
        ids = np.unique(self.path_id[self.stored]).tolist()
        self.remote = not all(is_local(manifest.table[p]) for p in ids)
        self.blobs: list[Bytes | None] | None = None
        encoded = [reader.array.grid.axes[a].encoded[t.chunks] for a, t in enumerate(tiles)]
        self.shapes = None if all((e == t.length).all() for e, t in zip(encoded, tiles,
                                                                        strict=True)) else \
            np.stack([g.reshape(-1) for g in np.meshgrid(*encoded, indexing="ij")], axis=-1)
        """The encoded shape of each chunk, or None where every one fills its tile."""

    @property
    def tile(self) -> tuple[int, ...]:
        return tuple(t.length for t in self.tiles)

    def shape(self, k: int) -> tuple[int, ...]:
        return self.tile if self.shapes is None else tuple(self.shapes[k].tolist())

    def read_into(self, out: np.ndarray) -> None:
        slots = self.decode()
        counts = [len(t.chunks) for t in self.tiles]
        blocks = slots.reshape((*counts, *self.tile))
        order = [a for pair in zip(range(len(counts)), range(len(counts), 2 * len(counts)),
                                   strict=True) for a in pair]
        whole = all(isinstance(t.out, slice) and isinstance(t.tiled, slice)
                    and t.tiled == slice(0, n * t.length)
                    for t, n in zip(self.tiles, counts, strict=True))
        if whole and self.tiles:  # every tiled element is selected: one copy, no temporary
            target = out[tuple(t.out for t in self.tiles)]
            split = [n for pair in zip(counts, self.tile, strict=True) for n in pair]
            np.copyto(np.reshape(target, split, copy=False), blocks.transpose(order))
            return
        tiled = blocks.transpose(order).reshape([n * t for n, t in zip(counts, self.tile,
                                                                       strict=True)])
        out[orthogonal_index([t.out for t in self.tiles], out.shape)] = \
            tiled[orthogonal_index([t.tiled for t in self.tiles], tiled.shape)]

    def decode(self) -> np.ndarray:
        """Every chunk of the box decoded into its slot: ``(chunks, *tile)``, chunks of one
        encoded shape decoded as one batch (:meth:`ChunkDecoder.decode_many`)."""
        reader = self.reader
        manifest = reader.array.manifest
        stored_flat = self.flat[self.stored]
        blobs = self.blobs if self.blobs is not None else reader.fetch(stored_flat)
        # (only whole chunk files may be None; `None in blobs` costs a raised and cleared
        # exception per memoryview)
        if (self.length[self.stored] == UNSIZED).any() and None in blobs:  # absent: fill
            gone = np.array([b is None for b in blobs])
            self.path_id = self.path_id.copy()
            self.path_id[self.stored[gone]] = MISSING
            self.stored = self.stored[~gone]
        elif self.shapes is None and len(blobs) == len(self.flat):  # every slot, one shape
            return self._decoded(range(len(blobs)), cast("list[Bytes]", blobs), self.tile)
        data: dict[int, Bytes] = dict(zip(self.stored.tolist(), (b for b in blobs if b is not
                                                                 None), strict=True))
        for k in np.flatnonzero(self.path_id == INLINE).tolist():
            data[k] = manifest.inline_chunk(int(self.flat[k]))
        if self.shapes is None and len(data) == len(self.flat):  # every slot, one shape
            order = sorted(data)
            return self._decoded(order, [data[k] for k in order], self.tile)
        slots = self._slots()
        groups: dict[tuple[int, ...], list[int]] = {}
        for k in data:
            groups.setdefault(self.shape(k), []).append(k)
        for shape, members in groups.items():
            values = self._decoded(members, [data[k] for k in members], shape)
            if shape == self.tile:
                slots[members] = values
            else:  # a padded or edge chunk: its logical part
                for k, block in zip(members, values, strict=True):
                    self._place(slots, k, block)
        return slots

    def _decoded(self, members: Sequence[int], chunks: Sequence[Bytes],
                 shape: tuple[int, ...]) -> np.ndarray:
        try:
            return self.reader.decoder.decode_many(chunks, shape)
        except ChunkDecodeError as e:
            self.reader.fail(int(self.flat[members[e.index]]), e)

    def _slots(self) -> np.ndarray:
        slots = np.empty((len(self.flat), *self.tile), dtype=self.reader.slot_dtype)
        slots[self.path_id == MISSING] = self.reader.fill
        return slots

    def _place(self, slots: np.ndarray, k: int, block: np.ndarray) -> None:
        region: tuple[int | slice, ...] = (k, *[slice(0, n) for n in block.shape])
        slots[region] = block if block.ndim else block[()]  # (an object, not a 0-d array)
