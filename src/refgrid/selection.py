"""Orthogonal selections decomposed into per-chunk pieces on a rectilinear grid.

A reader turns ``array[selection]`` into "read these chunks, take this region of each, put it
there in the output". The decomposition is computed per axis from the chunk bounds with numpy
(no Python loop per element), then combined as a cartesian product of the per-axis pieces.
Semantics are numpy's *orthogonal* indexing (zarr's ``oindex``): each integer array indexes its
own axis independently.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Any, NamedTuple

import numpy as np

from refgrid.gc_pause import gc_paused

AxisIndex = int | slice | np.ndarray
"""A normalised index on one axis: an in-range int, a slice, or a 1-d int64 array."""


class AxisPiece(NamedTuple):
    """The part of one chunk, along one axis, that a selection touches.

    ``out`` is ``None`` when the axis is dropped from the output (an integer index).
    A named tuple, not a dataclass: a selection over 10^6 chunks creates 10^6 of them.
    """

    chunk: int
    in_chunk: int | slice | np.ndarray
    out: slice | np.ndarray | None


class ChunkSelection(NamedTuple):
    """What to take from one chunk and where to put it in the output array."""

    coords: tuple[int, ...]
    in_chunk: tuple[int | slice | np.ndarray, ...]
    out: tuple[slice | np.ndarray, ...]

    def read_from(self, chunk: np.ndarray) -> np.ndarray:
        """Apply ``in_chunk`` to a decoded chunk with orthogonal semantics."""
        basic = tuple(slice(i, i + 1) if isinstance(i, int) else (
            i if isinstance(i, slice) else slice(None)) for i in self.in_chunk)
        part = chunk[basic]
        for axis, index in enumerate(self.in_chunk):
            if isinstance(index, np.ndarray):
                part = np.take(part, index, axis=axis)
        dropped = tuple(a for a, i in enumerate(self.in_chunk) if isinstance(i, int))
        return part.squeeze(axis=dropped) if dropped else part

    def write_into(self, out: np.ndarray, values: np.ndarray) -> None:
        """Assign ``values`` to the ``out`` region of the output with orthogonal semantics."""
        if sum(isinstance(i, np.ndarray) for i in self.out) <= 1:
            out[self.out] = values
            return
        axes = [np.arange(n)[i] if isinstance(i, slice) else i
                for i, n in zip(self.out, out.shape, strict=True)]
        out[np.ix_(*axes)] = values


@dataclass(frozen=True)
class GridSelection:
    """A selection decomposed per axis; iterate it for the chunks it touches."""

    shape: tuple[int, ...]
    axes: tuple[tuple[AxisPiece, ...], ...]

    @property
    def nchunks(self) -> int:
        return math.prod(len(pieces) for pieces in self.axes)

    def __iter__(self) -> Iterator[ChunkSelection]:
        for combo in itertools.product(*self.axes):
            yield ChunkSelection(
                coords=tuple(p.chunk for p in combo),
                in_chunk=tuple(p.in_chunk for p in combo),
                out=tuple(p.out for p in combo if p.out is not None),
            )


def normalize_selection(selection: Any, shape: Sequence[int]) -> tuple[AxisIndex, ...]:
    """Expand ``selection`` to one normalised index per axis (numpy's rules, orthogonal)."""
    items = selection if isinstance(selection, tuple) else (selection,)
    n_ellipsis = sum(isinstance(i, EllipsisType) for i in items)
    if n_ellipsis > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if n_ellipsis:
        at = next(k for k, i in enumerate(items) if isinstance(i, EllipsisType))
        fill = (slice(None),) * (len(shape) - len(items) + 1)
        items = items[:at] + fill + items[at + 1:]
    if len(items) > len(shape):
        raise IndexError(
            f"too many indices: array is {len(shape)}-dimensional, but {len(items)} were given")
    items = items + (slice(None),) * (len(shape) - len(items))
    pairs = zip(items, shape, strict=True)
    return tuple(_normalize_axis(i, n, axis) for axis, (i, n) in enumerate(pairs))


def _normalize_axis(index: Any, length: int, axis: int) -> AxisIndex:
    if isinstance(index, slice):
        return index
    if isinstance(index, bool | np.bool_):
        raise IndexError(f"boolean scalar index on axis {axis} is not supported")
    if isinstance(index, int | np.integer):
        i = int(index)
        if not -length <= i < length:
            raise IndexError(f"index {i} is out of bounds for axis {axis} with size {length}")
        return i + length if i < 0 else i
    if index is None:
        raise IndexError("new axes (None / np.newaxis) are not supported")
    arr = np.asarray(index)
    if arr.dtype == bool:
        if arr.shape != (length,):
            raise IndexError(
                f"boolean index on axis {axis} has shape {arr.shape}, expected ({length},)")
        return np.flatnonzero(arr)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise IndexError(
            f"index on axis {axis} must be an int, a slice, or a 1-d integer or boolean array; "
            f"got {arr.dtype} array of shape {arr.shape}")
    arr = arr.astype(np.int64)
    bad = (arr < -length) | (arr >= length)
    if bad.any():
        raise IndexError(
            f"index {int(arr[bad][0])} is out of bounds for axis {axis} with size {length}")
    return np.where(arr < 0, arr + length, arr)


def decompose_axis(
    index: AxisIndex, bounds: np.ndarray
) -> tuple[tuple[AxisPiece, ...], int | None]:
    """Pieces of one axis, in output order, and the output length (``None`` if dropped)."""
    if isinstance(index, int):
        chunk = int(np.searchsorted(bounds, index, side="right")) - 1
        return (AxisPiece(chunk, index - int(bounds[chunk]), None),), None
    with gc_paused():
        if isinstance(index, slice):
            return _slice_pieces(index, bounds)
        return _array_pieces(index, bounds), len(index)


def _slice_pieces(index: slice, bounds: np.ndarray) -> tuple[tuple[AxisPiece, ...], int]:
    start, stop, step = index.indices(int(bounds[-1]))
    n = len(range(start, stop, step))
    if n == 0:
        return (), 0
    last = start + (n - 1) * step
    lo, hi = min(start, last), max(start, last)
    first_chunk, last_chunk = np.searchsorted(bounds, [lo, hi], side="right") - 1
    chunks = np.arange(first_chunk, last_chunk + 1)
    b0, b1 = bounds[chunks], bounds[chunks + 1]
    if step > 0:
        k0 = np.maximum(0, -((start - b0) // step))
        k1 = np.minimum(n, -((start - b1) // step))
    else:
        chunks, b0, b1 = chunks[::-1], b0[::-1], b1[::-1]
        k0 = np.maximum(0, -((b1 - 1 - start) // -step))
        k1 = np.minimum(n, (start - b0) // -step + 1)
    keep = k1 > k0
    chunks, b0, k0, k1 = chunks[keep], b0[keep], k0[keep], k1[keep]
    first = start + k0 * step - b0
    end = first + (k1 - k0 - 1) * step + (1 if step > 0 else -1)
    pieces = tuple(
        AxisPiece(c, slice(f, e if e >= 0 else None, step), slice(a, b))
        for c, f, e, a, b in zip(chunks.tolist(), first.tolist(), end.tolist(), k0.tolist(),
                                 k1.tolist(), strict=True)
    )
    return pieces, n


def _array_pieces(index: np.ndarray, bounds: np.ndarray) -> tuple[AxisPiece, ...]:
    if index.size == 0:
        return ()
    chunk_of = np.searchsorted(bounds, index, side="right") - 1
    order = np.argsort(chunk_of, kind="stable")
    chunks, starts = np.unique(chunk_of[order], return_index=True)
    return tuple(
        AxisPiece(int(c), index[positions] - bounds[c], positions)
        for c, positions in zip(chunks, np.split(order, starts[1:]), strict=True)
    )
