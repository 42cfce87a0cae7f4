"""Chunks padded inside an array, read at their real extent: the portable form every Zarr
reader decodes.

Where files are concatenated, an HDF5 chunk that was padded at a file's end sits inside the
combined array. refgrid's model describes it (an encoded extent longer than the logical one),
but a Zarr reader decodes every chunk to its declared edge, and Icechunk as well. Here such
chunks are found (:func:`padded_mask`), the grid they would have at their real extent is made
(:func:`portable_grid`: the array's last chunk may still overflow, as the spec's trailing edge
does), and each is fetched, decoded, cropped and re-encoded with the array's own codecs
(:func:`cropped_chunks`). The writers store the result (``padded="rewrite"``, Icechunk); the
served native view and the zarr store serve it as they are asked.

A growing archive's served view crops the *final* chunk along the growing dimension as well
(``end``): declared at its real extent, its bytes are those it will have once a file is
appended after it (cropped then, as every interior chunk), so a reader holding the earlier
metadata decodes the later bytes exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from refgrid.codecs.pipeline import ChunkCodec
from refgrid.core.sources import SourceCheck
from refgrid.core.typed import Bytes, StorageOptions
from refgrid.errors import ReadError, RefgridError
from refgrid.grid.rectilinear import AxisChunks, RectilinearGrid, check_chunk_count
from refgrid.model.manifest import MISSING, chunk_coords
from refgrid.model.virtual import VirtualArray, VirtualGroup
from refgrid.read.array import chunk_error, fetch_chunks

BATCH = 64
"""Chunks fetched per request round."""


def portable_documents_group(group: VirtualGroup, end: str | None = None) -> VirtualGroup:
    """``group`` with its arrays on their portable grids (``end``: the dimension along which
    the final chunk is cropped too), for their ``zarr.json`` documents only: the manifests
    still name the padded chunks' stored bytes, which a reader must crop
    (:func:`cropped_chunks`) before handing them out."""
    arrays = {path: node for path, node in group.walk() if isinstance(node, VirtualArray)
              and is_padded(node.grid, end_axis(node, end))}
    return group.with_arrays({path: replace(array, grid=portable_grid(
        array.grid, end_axis(array, end))) for path, array in arrays.items()})


def end_axis(array: VirtualArray, end: str | None) -> int | None:
    """The axis of dimension ``end`` in ``array`` (None: it has no such dimension, or it is
    the first of an array stored inline, :attr:`~VirtualArray.inline_pieces`: its last
    piece is full length, and the appends that fill it keep the values before, so a reader
    of an earlier version reads it as its own)."""
    if end is None or end not in array.dims or (array.dims[0] == end and
                                                 array.inline_pieces):
        return None
    return array.dims.index(end)


def padded_arrays(group: VirtualGroup) -> dict[str, VirtualArray]:
    """The arrays of ``group`` (by path) with a chunk padded inside them."""
    return {path: node for path, node in group.walk()
            if isinstance(node, VirtualArray) and padded_inside(node.grid)}


def padded_inside(grid: RectilinearGrid) -> bool:
    return any(a.padded_inside for a in grid.axes)


def padded_mask(grid: RectilinearGrid, end: int | None = None) -> np.ndarray:
    """Boolean grid of the chunks padded somewhere other than the array's end (along axis
    ``end``, its end as well)."""
    check_chunk_count(grid.chunk_counts)
    mask = np.zeros(grid.chunk_counts, dtype=bool)
    for dim, inside in enumerate(padded_along(grid, end)):
        shape = [1] * grid.ndim
        shape[dim] = len(inside)
        mask |= inside.reshape(shape)
    return mask


def is_padded(grid: RectilinearGrid, end: int | None = None) -> bool:
    """Whether :func:`padded_mask` has a chunk (asked of each axis: a grid of 10^8 chunks
    needs no mask of 10^8 to say it has none)."""
    return any(inside.any() for inside in padded_along(grid, end))


def padded_along(grid: RectilinearGrid, end: int | None = None) -> list[np.ndarray]:
    """Per axis, which chunks :func:`padded_mask` would mark along it: a chunk is padded
    where any of its coordinates is (asked a chunk at a time, a grid of 10^8 chunks needs
    no mask of 10^8)."""
    out = []
    for dim, axis in enumerate(grid.axes):
        inside = (axis.encoded != axis.logical)
        if dim != end:
            inside[-1:] = False
        out.append(inside)
    return out


def portable_grid(grid: RectilinearGrid, end: int | None = None) -> RectilinearGrid:
    """Encoded lengths equal to logical ones, but the last chunk's: the array's final chunk
    may still overflow the shape (the spec's trailing edge does exactly that), except along
    axis ``end``."""
    axes = []
    for dim, axis in enumerate(grid.axes):
        encoded = axis.logical.copy()
        if axis.nchunks and dim != end:
            encoded[-1] = axis.encoded[-1]
        axes.append(AxisChunks(axis.logical, encoded, axis.empty_chunk))
    return RectilinearGrid(tuple(axes))


def cropped_chunks(path: str, array: VirtualArray, storage_options: StorageOptions,
                   check: SourceCheck | None
                   ) -> Iterator[tuple[tuple[int, ...], bytes | None]]:
    """Each padded interior chunk of ``array`` (not missing), decoded, cropped to its extent
    on :func:`portable_grid` and re-encoded with the array's codecs."""
    mask = padded_mask(array.grid).reshape(-1) & (array.manifest.path_id.reshape(-1) != MISSING)
    return Cropper(path, array).chunks(np.flatnonzero(mask), storage_options, check)


class Cropper:
    """What cropping one array's padded chunks needs — its portable grid and codec — made
    once, for a reader asked for such chunks one at a time (the served view, the store)."""

    def __init__(self, path: str, array: VirtualArray, end: int | None = None) -> None:
        self.path = path
        self.array = array
        self.grid = portable_grid(array.grid, end)
        segments = array.segments
        stored = [(array.codecs, array.dtype)] if segments is None else [
            (e.codecs, e.dtype) for e in segments.encodings]
        try:
            self.codecs = [ChunkCodec(codecs, dtype) for codecs, dtype in stored]
        except Exception as e:  # a codec's own configuration checks raise anything
            raise ReadError(f"array {path!r}: cannot decode its codecs to crop its padded "
                            f"chunks: {type(e).__name__}: {e}") from e
        self.starts = np.zeros(1, np.int64) if segments is None else np.asarray(
            segments.starts)
        """Where each segment's chunks begin along :attr:`axis`: a chunk is cropped and
        re-encoded in its own segment's encoding (one, where the array has none)."""
        self.axis = 0 if segments is None else array.axis(segments.dim)

    def chunks(self, flats: np.ndarray, storage_options: StorageOptions,
               check: SourceCheck | None) -> Iterator[tuple[tuple[int, ...], bytes | None]]:
        """Padded chunks ``flats`` (C-order indexes of chunks that are not missing),
        cropped, fetched a batch at a time (sources checked) so memory holds one batch."""
        array, manifest = self.array, self.array.manifest
        for start in range(0, len(flats), BATCH):
            flat = flats[start:start + BATCH]
            stored = flat[manifest.locate(flat).path_id >= 0]
            blobs = dict(zip(stored.tolist(), fetch_chunks(array, self.path, stored,
                                                           dict(storage_options), check),
                             strict=True))
            for f in flat.tolist():
                coords = chunk_coords(f, manifest.shape)
                data = blobs[f] if f in blobs else manifest.inline_chunk(f)
                # a chunk file that is absent (a store never wrote it): no bytes to crop
                yield coords, None if data is None else self._cropped(f, coords, data)

    def _cropped(self, flat: int, coords: tuple[int, ...], data: Bytes) -> bytes:
        """One chunk's stored bytes decoded, cropped to its portable extent, re-encoded."""
        encoded_shape = self.array.grid.encoded_chunk_shape(coords)
        keep = tuple(slice(0, n) for n in self.grid.encoded_chunk_shape(coords))
        codec = self.codecs[int(np.searchsorted(self.starts, coords[self.axis],
                                                side="right")) - 1] if coords else self.codecs[0]
        try:
            values = codec.decode(data, encoded_shape)
            return codec.encode(np.ascontiguousarray(values[keep]))
        except RefgridError:
            raise
        except Exception as e:  # codecs raise anything on bytes they cannot take
            raise chunk_error(self.array, self.path, flat, f"cannot crop the padded chunk: "
                              f"{type(e).__name__}: {e}") from e
