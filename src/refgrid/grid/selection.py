"""Orthogonal selections on a rectilinear grid, vectorized per axis.

A reader turns ``array[selection]`` into: which chunks to read along each axis, and where the
selected elements lie inside them. Everything is per axis and in numpy — never a Python object
per chunk or per element — because a single read may touch 10^5 chunks.

Chunks are read in *boxes*: for a range of the touched chunks on every axis, the decoded chunks
are laid side by side, each axis at a common *tile* length (the largest encoded length among
the box's chunks), so one numpy indexing step extracts the selection from all of them. Where a
chunk is padded (encoded longer than logical) or shorter than the tile, the unused tile
positions are simply never selected.

Semantics are numpy's *orthogonal* indexing (zarr's ``oindex``): each integer array indexes
its own axis independently.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import NamedTuple, Protocol

import numpy as np

from refgrid.core.reprs import Axis
from refgrid.core.util import lazy


class AxisChunks(Axis, Protocol):
    """What a selection needs of one axis of a grid
    (:class:`refgrid.grid.rectilinear.AxisChunks` is it): declared here so that the grid
    depends on selections, not the other way round. Its chunks' lengths as a summary reads
    them (:class:`refgrid.core.reprs.Axis`), and:"""

    @property
    def bounds(self) -> np.ndarray: ...
    @property
    def length(self) -> int: ...

AxisIndex = int | slice | np.ndarray
"""A normalised index on one axis: an in-range int, a slice, or a 1-d int64 array."""
Indexer = slice | np.ndarray


class AxisTile(NamedTuple):
    """A run of touched chunks along one axis, decoded side by side at ``length`` each."""

    chunks: np.ndarray
    """Chunk ids, ascending."""
    length: int
    """The tile length: every chunk's decoded data starts at a multiple of it."""
    out: Indexer
    """Where the selected elements of these chunks go along the output axis."""
    tiled: Indexer
    """Where they are along the tiled axis (``len(chunks) * length`` long)."""


@dataclass(frozen=True, eq=False)
class AxisSelection:
    """What one axis of a selection takes, as the chunks it touches.

    A step-1 slice is kept as its bounds (``span``) so that reading a whole axis of 10^8
    elements allocates nothing per element; other indices keep their element ``positions``.
    """

    axis: AxisChunks
    dropped: bool
    span: tuple[int, int] | None = None
    positions: np.ndarray | None = None

    @classmethod
    def of(cls, index: AxisIndex, axis: AxisChunks) -> AxisSelection:
        if isinstance(index, slice):
            start, stop, step = index.indices(axis.length)
            if step == 1:
                return cls(axis, False, span=(start, max(start, stop)))
            return cls(axis, False, positions=np.arange(start, stop, step, dtype=np.int64))
        if isinstance(index, int):
            return cls(axis, True, positions=np.array([index], np.int64))
        return cls(axis, False, positions=index)

    @property
    def size(self) -> int:
        """Selected elements (1 for a dropped axis, which the output keeps until the end)."""
        if self.span is not None:
            return self.span[1] - self.span[0]
        return len(self.elements)

    @property
    def elements(self) -> np.ndarray:
        """The selected element positions of a selection that is not a span."""
        if self.positions is None:
            raise TypeError("a span selection keeps no element positions")
        return self.positions

    def _chunk_of(self, elements: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.axis.bounds, elements, side="right") - 1

    @lazy
    def _position_chunks(self) -> np.ndarray:
        return self._chunk_of(self.elements)

    @lazy
    def chunks(self) -> np.ndarray:
        """Ids of the chunks touched, ascending."""
        if self.span is not None:
            start, stop = self.span
            if start == stop:
                return np.zeros(0, np.int64)
            first, last = self._chunk_of(np.array([start, stop - 1]))
            return np.arange(first, last + 1)
        return np.unique(self._position_chunks)

    def tile(self, chunks: np.ndarray) -> AxisTile:
        """The tile of ``chunks`` (consecutive touched chunks, ascending)."""
        length = int(self.axis.encoded[chunks].max())
        first, last = int(chunks[0]), int(chunks[-1])
        if self.span is not None:
            lo = max(self.span[0], int(self.axis.bounds[first]))
            hi = min(self.span[1], int(self.axis.bounds[last + 1]))
            out: Indexer = slice(lo - self.span[0], hi - self.span[0])
            if (self.axis.logical[first:last] == length).all():  # no gaps between the chunks
                base = int(self.axis.bounds[first])
                return AxisTile(chunks, length, out, slice(lo - base, hi - base))
            elements = np.arange(lo, hi)
            within = self._chunk_of(elements)
        else:
            within = self._position_chunks
            keep = (within >= first) & (within <= last)
            out = as_slice(np.flatnonzero(keep))
            elements = self.elements[keep]
            within = within[keep]
        rank = np.searchsorted(chunks, within)
        return AxisTile(chunks, length, out,
                        as_slice(rank * length + elements - self.axis.bounds[within]))


def as_slice(index: np.ndarray) -> Indexer:
    """``index`` as an equivalent slice when it is an arithmetic progression (faster to apply)."""
    if len(index) == 0:
        return slice(0, 0)
    first = int(index[0])
    if len(index) == 1:
        return slice(first, first + 1)
    step = int(index[1]) - first
    if step == 0 or not (np.diff(index) == step).all():
        return index
    stop = int(index[-1]) + (1 if step > 0 else -1)
    return slice(first, stop if stop >= 0 else None, step)


def orthogonal_index(index: Sequence[Indexer], shape: Sequence[int]) -> tuple[Indexer, ...]:
    """Per-axis ``index`` with numpy's orthogonal meaning (``np.ix_`` once two take arrays)."""
    if sum(isinstance(i, np.ndarray) for i in index) <= 1:
        return tuple(index)
    return np.ix_(*(np.arange(n)[i] if isinstance(i, slice) else i
                    for i, n in zip(index, shape, strict=True)))


@dataclass(frozen=True, eq=False)
class GridSelection:
    """An orthogonal selection on a grid, one :class:`AxisSelection` per axis."""

    axes: tuple[AxisSelection, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the result (integer-indexed axes dropped)."""
        return tuple(a.size for a in self.axes if not a.dropped)

    @property
    def kept_shape(self) -> tuple[int, ...]:
        """The result's shape with integer-indexed axes kept at length 1."""
        return tuple(a.size for a in self.axes)

    @property
    def nchunks(self) -> int:
        return math.prod(len(a.chunks) for a in self.axes)

    def boxes(self, itemsize: int, limit: int, at_least: int = 1) -> Iterator[tuple[AxisTile, ...]]:
        """The touched chunks in boxes whose tiles hold at most ``limit`` bytes (or one chunk),
        and at least ``at_least`` boxes where there are enough chunks (for threads to share).

        A box takes whole runs of chunks along the inner axes and as many along the outermost
        axis that still fits, so that boxes are few and each is one numpy step to assemble.
        """
        chunks = [a.chunks for a in self.axes]
        if any(len(c) == 0 for c in chunks):
            return
        if not chunks:  # a scalar
            yield ()
            return
        tile = [int(a.axis.encoded[c].max()) for a, c in zip(self.axes, chunks, strict=True)]
        counts = [len(c) for c in chunks]
        slab = [itemsize * tile[a] * math.prod(n * t for n, t in zip(counts[a + 1:], tile[a + 1:],
                                                                     strict=True))
                for a in range(len(chunks))]
        split = next((a for a in range(len(chunks)) if slab[a] <= limit), len(chunks) - 1)
        while split < len(chunks) - 1 and math.prod(counts[: split + 1]) < at_least:
            split += 1
        before = math.prod(counts[:split])
        step = min(max(1, limit // slab[split]), -(-counts[split] // -(-at_least // before)))
        inner = [a.tile(c) for a, c in zip(self.axes[split + 1:], chunks[split + 1:],
                                           strict=True)]
        for outer in itertools.product(*(range(n) for n in counts[:split])):
            head = [a.tile(c[k: k + 1]) for a, c, k in zip(self.axes, chunks, outer,
                                                             strict=False)]
            along = chunks[split]
            for first in range(0, len(along), step):
                yield (*head, self.axes[split].tile(along[first: first + step]), *inner)


def normalize_selection(selection: object, shape: Sequence[int]) -> tuple[AxisIndex, ...]:
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


def _normalize_axis(index: object, length: int, axis: int) -> AxisIndex:
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
