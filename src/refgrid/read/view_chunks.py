"""The chunk shape of the regular view an array is served in to stock zarr (the mapper).

Stock zarr 3.1 spends ~250 µs of its own on every chunk it reads and refgrid about as much
assembling one — many times what a small native chunk costs to decode: served in native
chunks, an archive of small chunks reads 10-40 times slower through zarr than through h5py.
The view therefore serves *assembled* chunks — each a block of whole native chunks, decoded
by refgrid and served uncompressed — chosen by a cost model: for the whole array, a line along
the first dimension (a time series) and a slab one index thick across it (a map), the time
zarr and refgrid would take, as a multiple of what reading just the native chunks touched
takes; the shape with the smallest worst multiple wins, the larger one on ties. Larger blocks
mean fewer zarr calls; blocks that overshoot a selection decode native chunks nobody asked
for.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Mapping
from typing import Literal

from refgrid.errors import ArgumentError
from refgrid.grid.rectilinear import AxisChunks
from refgrid.model.virtual import INLINE_PIECE, VirtualArray

ViewChunks = Literal["auto", "native"] | Mapping[str, int]
"""``"auto"``: assembled blocks chosen by the cost model; ``"native"``: the native chunks
where the grid is regular (the most common native length along an irregular dimension);
``{dim: length}``: those lengths, the others as ``"native"``."""

ZARR_CALL = 500e-6
"""Seconds stock zarr and the view spend per view chunk besides decoding (measured on 2
cores: ~250 µs each)."""
NATIVE_CALL = 8e-6
"""Seconds a direct reader (h5py, refgrid's engine) spends per native chunk besides decoding."""
DECODE_FIXED, DECODE_BYTE = 3e-6, 1.2e-9
"""Decoding one native chunk: a fixed part and a part per decoded byte."""
COPY_BYTE = 0.6e-9
"""Seconds per byte served: assembling a block, serving it, zarr copying it out."""
MAX_BLOCK_BYTES = 64 * 2**20
"""No assembled block beyond this (memory per request, in the view and in zarr)."""
SMALL_ARRAY_BYTES = 2**20
"""An array of at most this many bytes is served as one chunk (a ``time_bnds`` of 730 native
chunks of 16 bytes: one zarr call instead of 730)."""
MAX_CANDIDATES = 1024
"""Block shapes weighed at most (many dimensions: fewer lengths tried along each)."""


def view_chunks(array: VirtualArray, chunks: ViewChunks,
                growing: str | None = None) -> tuple[tuple[int, ...], bool]:
    """The view's chunk shape for ``array``, and whether it is the native one (a missing
    native chunk then is a missing view chunk). Along ``growing`` (a followed archive's
    concat dimension) the length is one appends never change (:func:`growing_length`): a
    chunk's extent, and so its values, stay those an earlier reader was told."""
    grid = array.grid
    axis = array.dims.index(growing) if growing in array.dims else None
    if chunks == "auto":
        if not grid.ndim or array.dtype.kind in "OT":  # vlen: no gain from larger blocks
            return view_chunks(array, "native", growing)
        if axis is None and \
                math.prod(array.shape) * array.value_dtype.itemsize <= SMALL_ARRAY_BYTES:
            shape = tuple(max(1, n) for n in array.shape)
            return shape, grid.is_regular and shape == tuple(grid.chunk_shape or ())
        shape = assembled(array, axis)
        return shape, grid.is_regular and shape == tuple(grid.chunk_shape or ())
    if isinstance(chunks, str):
        if chunks != "native":
            raise ArgumentError(f"chunks must be 'auto', 'native' or {{dim: length}}, "
                                f"not {chunks!r}")
        chunks = {}
    if axis is None and grid.is_regular and not any(d in chunks for d in array.dims):
        return tuple(grid.chunk_shape or ()), True
    shape = tuple(max(1, int(chunks[dim])) if dim in chunks else
                  growing_length(array, axis) if d == axis else _typical(along)
                  for d, (dim, along) in enumerate(zip(array.dims, grid.axes, strict=True)))
    return shape, axis is not None and grid.is_regular and \
        shape == tuple(grid.chunk_shape or ())


def growing_length(array: VirtualArray, axis: int) -> int:
    """A chunk length along a growing dimension that appends leave as it is: the first
    chunk's (a file's own, or a piece of an array stored inline, which no append changes),
    or :data:`~refgrid.model.virtual.INLINE_PIECE` for an array stored as one inline chunk
    (which appends grow)."""
    along = array.grid.axes[axis]
    if (array.grid.nchunks == 1 and array.inline_bytes) or not along.nchunks:
        return INLINE_PIECE
    return max(1, int(along.logical[0]))


def _typical(axis: AxisChunks) -> int:
    if axis.regular_size is not None:
        return axis.regular_size
    return int(Counter(axis.logical.tolist()).most_common(1)[0][0])


def assembled(array: VirtualArray, growing: int | None = None) -> tuple[int, ...]:
    """The block shape with the smallest worst cost ratio over the model's selections;
    along axis ``growing``, :func:`growing_length` (weighed as if the array were that long
    there: its length changes with every append)."""
    native = tuple(growing_length(array, d) if d == growing else _typical(axis)
                   for d, axis in enumerate(array.grid.axes))
    shape = tuple(native[d] if d == growing else n for d, n in enumerate(array.shape))
    return _best(native, shape, array.value_dtype.itemsize)


@functools.lru_cache(maxsize=256)
def _best(native: tuple[int, ...], shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """(Cached: the variables of a dataset mostly share their shapes.)"""
    options = [_lengths(n, size) for n, size in zip(native, shape, strict=True)]
    while math.prod(map(len, options)) > MAX_CANDIDATES:
        longest = max(options, key=len)
        del longest[-2]  # the largest multiple short of the whole dimension
    patterns = _patterns(len(shape))
    smallest = tuple(o[0] for o in options)  # the native chunk (cut to the array): always
    best: tuple[float, int, tuple[int, ...]] | None = None
    for block in itertools.product(*options):
        nbytes = math.prod(block) * itemsize
        if nbytes > MAX_BLOCK_BYTES and block != smallest:
            continue
        worst = max(_ratio(block, native, shape, itemsize, p) for p in patterns)
        key = (round(worst, 3), -nbytes, block)
        if best is None or key < best:
            best = key
    assert best is not None
    return best[2]


def _lengths(native: int, size: int) -> list[int]:
    """Block lengths along one dimension: the native length times powers of two, and the
    whole dimension."""
    native = max(1, min(native, size))
    lengths = {native, max(size, 1)}
    k = 2
    while native * k < size:
        lengths.add(native * k)
        k *= 2
    return sorted(lengths)


def _patterns(ndim: int) -> list[tuple[bool, ...]]:
    """Selections as "whole along this dimension" flags: everything, a line along the first
    dimension (a time series) and a slab one index thick across it (a map)."""
    if ndim == 1:
        return [(True,), (False,)]
    return [(True,) * ndim, (True,) + (False,) * (ndim - 1), (False,) + (True,) * (ndim - 1)]


def _ratio(block: tuple[int, ...], native: tuple[int, ...], shape: tuple[int, ...], itemsize: int,
           whole: tuple[bool, ...]) -> float:
    """Time through the view over time reading the native chunks touched, for one
    selection."""
    touched = views = decoded = 1
    for b, n, size, w in zip(block, native, shape, whole, strict=True):
        along = math.ceil(size / n) if size else 0
        touched *= along if w else 1
        views *= math.ceil(size / b) if w and size else 1
        decoded *= along if w else min(math.ceil(b / n), along)
    chunk_bytes = math.prod(native) * itemsize
    decode = DECODE_FIXED + DECODE_BYTE * chunk_bytes
    view = ZARR_CALL * views + decode * decoded + COPY_BYTE * views * math.prod(block) * itemsize
    direct = (NATIVE_CALL + decode) * touched
    return view / direct if direct else 1.0
