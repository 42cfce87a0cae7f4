"""The rectilinear chunk grid: per-dimension chunk lengths, logical and encoded.

Along each dimension a grid holds the *logical* chunk lengths (they sum to the array's length)
and the *encoded* lengths, what a stored chunk decodes to (>= logical). They differ where HDF5
pads an edge chunk: at the array's end that is ordinary Zarr behaviour, but once files are
concatenated the padded chunk sits inside the array. JSON forms read and written here:

* ``regular`` — every dimension regular and no chunk padded except at the array's end;
* zarr-extensions ``rectilinear`` (RLE runs ``[length, repeat]``), with the proposed
  ``encoded_chunk_shapes`` only when some chunk inside the array is padded;
* ZEP0003 ``rectangular`` (read always, written on request).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from refgrid.core.bounds import current as current_limits
from refgrid.core.reprs import Displayed
from refgrid.core.util import lazy
from refgrid.errors import GridError
from refgrid.grid.selection import AxisSelection, GridSelection, normalize_selection
from refgrid.grid.svg import grid_svg

GridForm = Literal["auto", "rectilinear", "rectangular"]


@dataclass(frozen=True, eq=False)
class AxisChunks:
    """Chunk lengths along one dimension (validated by :class:`RectilinearGrid`)."""

    logical: np.ndarray
    encoded: np.ndarray
    empty_chunk: int = 1
    """The chunk length to declare when the dimension has no chunks (length 0)."""

    @lazy
    def bounds(self) -> np.ndarray:
        """Cumulative chunk starts, ``nchunks + 1`` of them, from 0 to the length."""
        return np.concatenate(([0], np.cumsum(self.logical)))

    @property
    def length(self) -> int:
        return int(self.bounds[-1])

    @property
    def nchunks(self) -> int:
        return len(self.logical)

    @lazy
    def regular_size(self) -> int | None:
        """The chunk length if this dimension is a regular grid (edge padding allowed)."""
        if self.nchunks == 0:
            return self.empty_chunk
        size = int(self.encoded[0])
        if (self.encoded == size).all() and (self.logical[:-1] == size).all():
            return size
        return None

    @lazy
    def padded_inside(self) -> bool:
        """True if a chunk other than the last decodes to more than its logical length."""
        return bool((self.encoded[:-1] != self.logical[:-1]).any())

    def declared(self) -> np.ndarray:
        """Edge lengths as written in JSON: logical, but the last one at its encoded length."""
        edges = self.logical.copy()
        if self.nchunks:
            edges[-1] = self.encoded[-1]
        return edges

    def overlaps(self, length: int) -> np.ndarray:
        """For each chunk of a regular grid of ``length`` along this dimension, how many of
        this dimension's chunks it overlaps."""
        starts = np.arange(0, self.length, length)
        first = np.searchsorted(self.bounds, starts, side="right") - 1
        last = np.searchsorted(self.bounds, np.minimum(starts + length, self.length),
                               side="left")
        return last - first

    def same_as(self, other: AxisChunks) -> bool:
        return np.array_equal(self.logical, other.logical) and np.array_equal(
            self.encoded, other.encoded)

    @classmethod
    def of(cls, dim: int, logical: npt.ArrayLike, encoded: npt.ArrayLike | None = None,
           empty_chunk: int = 1) -> AxisChunks:
        """Validated chunk lengths of dimension ``dim`` (logical >= 1, encoded >= logical)."""
        lengths = _as_lengths(logical, f"chunk lengths of dimension {dim}")
        if (lengths <= 0).any():
            bad = int(np.flatnonzero(lengths <= 0)[0])
            raise GridError(f"dimension {dim}: chunk {bad} has length {int(lengths[bad])}; "
                            "lengths must be >= 1")
        if encoded is None:
            enc = lengths
        else:
            enc = _as_lengths(encoded, f"encoded chunk lengths of dimension {dim}")
            if len(enc) != len(lengths):
                raise GridError(
                    f"dimension {dim}: {len(enc)} encoded chunk lengths for {len(lengths)} chunks; "
                    "encoded and logical edge counts must be equal")
            short = np.flatnonzero(enc < lengths)
            if short.size:
                c = int(short[0])
                raise GridError(
                    f"dimension {dim}: chunk {c} is encoded with {int(enc[c])} elements, shorter "
                    f"than its logical length {int(lengths[c])}")
        return cls(lengths, enc, empty_chunk)


def check_chunk_count(counts: Sequence[int]) -> None:
    """Refuse more chunks than :attr:`refgrid.limits.Limits.max_chunks` before anything of
    their number is allocated: along each dimension of a grid (its edges), and in a grid
    whose chunks are all held at once (a manifest read whole, a mask per chunk). A grid
    read a page at a time (:class:`~refgrid.model.manifest.PagedManifest`) may hold more."""
    limit = current_limits().max_chunks
    total = math.prod(max(int(c), 0) for c in counts)
    if total > limit:
        raise GridError(f"a grid of {total} chunks ({' x '.join(map(str, counts))}) exceeds the "
                        f"limit of {limit} (refgrid.set_limits(max_chunks=...) raises it)")


def _as_lengths(values: npt.ArrayLike, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise GridError(f"{what} must be a 1-d sequence of integers, got {values!r:.80}")
    return arr.astype(np.int64)


@dataclass(frozen=True, eq=False)
class RectilinearGrid(Displayed):
    """A chunk grid whose chunk lengths may differ along every dimension (its HTML repr is
    the chunk picture)."""

    _display = "grid"

    axes: tuple[AxisChunks, ...]

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def regular(cls, shape: Sequence[int], chunk_shape: Sequence[int]) -> RectilinearGrid:
        """The Zarr regular grid: full chunks, the last one along each dimension padded."""
        if len(shape) != len(chunk_shape):
            raise GridError(
                f"chunk shape {tuple(chunk_shape)} has rank {len(chunk_shape)}, "
                f"array shape {tuple(shape)} has rank {len(shape)}")
        axes = []
        counts = [-(-int(n) // max(int(c), 1)) for n, c in zip(shape, chunk_shape, strict=True)]
        for count in counts:
            check_chunk_count([count])
        for dim, (n, c) in enumerate(zip(shape, chunk_shape, strict=True)):
            if int(c) < 1 or int(n) < 0:
                raise GridError(
                    f"dimension {dim}: chunk length {c} for length {n}; chunk lengths must be "
                    ">= 1 and lengths >= 0")
            count = counts[dim]
            logical = np.full(count, int(c), dtype=np.int64)
            if count:
                logical[-1] = int(n) - (count - 1) * int(c)
            axes.append(AxisChunks(logical, np.full(count, int(c), dtype=np.int64), int(c)))
        return cls(tuple(axes))

    @classmethod
    def from_lengths(
        cls,
        lengths: Sequence[Sequence[int] | np.ndarray],
        encoded: Sequence[Sequence[int] | np.ndarray | None] | None = None,
    ) -> RectilinearGrid:
        """A grid from logical chunk lengths (and encoded ones where they differ)."""
        if encoded is not None and len(encoded) != len(lengths):
            raise GridError(
                f"encoded lengths given for {len(encoded)} dimensions, logical for {len(lengths)}")
        enc = encoded if encoded is not None else [None] * len(lengths)
        return cls(tuple(AxisChunks.of(d, lo, e) for d, (lo, e) in enumerate(zip(lengths, enc,
                                                                            strict=True))))

    # -- queries ----------------------------------------------------------------------------

    @property
    def ndim(self) -> int:
        return len(self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(a.length for a in self.axes)

    @property
    def chunk_counts(self) -> tuple[int, ...]:
        return tuple(a.nchunks for a in self.axes)

    @property
    def nchunks(self) -> int:
        return int(np.prod(self.chunk_counts, dtype=np.int64))

    @property
    def is_regular(self) -> bool:
        """True when the grid can be written as a Zarr ``regular`` grid."""
        return all(a.regular_size is not None for a in self.axes)

    @property
    def chunk_shape(self) -> tuple[int, ...] | None:
        """The regular chunk shape, or ``None`` if the grid is not regular."""
        sizes = tuple(a.regular_size for a in self.axes)
        return None if None in sizes else sizes  # type: ignore[return-value]

    def lengths(self, dim: int) -> np.ndarray:
        """Logical chunk lengths along ``dim``."""
        return self.axes[dim].logical

    def encoded_lengths(self, dim: int) -> np.ndarray:
        """What each chunk along ``dim`` decodes to."""
        return self.axes[dim].encoded

    def bounds(self, dim: int) -> np.ndarray:
        """Chunk start positions along ``dim``, followed by the dimension's length."""
        return self.axes[dim].bounds

    def locate(self, dim: int, index: int | np.ndarray
               ) -> tuple[int, int] | tuple[np.ndarray, np.ndarray]:
        """Map index/indices along ``dim`` to (chunk, offset within the chunk), vectorised
        (ints for a scalar index)."""
        axis = self.axes[dim]
        idx = np.asarray(index, dtype=np.int64)
        idx = np.where(idx < 0, idx + axis.length, idx)
        bad = (idx < 0) | (idx >= axis.length)
        if bad.any():
            raise IndexError(
                f"index {int(np.asarray(index).flat[np.flatnonzero(bad)[0]])} is out of bounds "
                f"for dimension {dim} with length {axis.length}")
        chunk = np.searchsorted(axis.bounds, idx, side="right") - 1
        offset = idx - axis.bounds[chunk]
        if np.ndim(index) == 0:
            return int(chunk), int(offset)
        return chunk, offset

    def chunk_region(self, coords: Sequence[int]) -> tuple[slice, ...]:
        """The region of the array that chunk ``coords`` holds (logical extent)."""
        return tuple(slice(int(a.bounds[c]), int(a.bounds[c + 1]))
                     for a, c in zip(self.axes, coords, strict=True))

    def logical_chunk_shape(self, coords: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(a.logical[c]) for a, c in zip(self.axes, coords, strict=True))

    def encoded_chunk_shape(self, coords: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(a.encoded[c]) for a, c in zip(self.axes, coords, strict=True))

    def select(self, selection: object) -> GridSelection:
        """An orthogonal selection, per axis: the chunks it touches (see selection.py)."""
        indices = normalize_selection(selection, self.shape)
        return GridSelection(tuple(AxisSelection.of(i, a)
                                   for i, a in zip(indices, self.axes, strict=True)))

    # -- transformations --------------------------------------------------------------------

    def slice(self, dim: int, start: int, stop: int) -> tuple[RectilinearGrid, slice]:
        """Restrict ``dim`` to ``[start, stop)``; returns the new grid and the chunks kept.

        ``start`` must fall on a chunk boundary (a chunk cannot begin mid-way, since a stored
        chunk keeps its leading elements); ``stop`` may fall inside a chunk, which then keeps
        its encoded length and a shorter logical one.
        """
        axis = self.axes[dim]
        if not 0 <= start <= stop <= axis.length:
            raise GridError(
                f"dimension {dim}: cannot slice [{start}, {stop}) from length {axis.length}")
        first = int(np.searchsorted(axis.bounds, start))
        if axis.bounds[first] != start:
            raise GridError(
                f"dimension {dim}: start {start} falls inside chunk {first - 1} "
                f"[{int(axis.bounds[first - 1])}, {int(axis.bounds[first])}); a slice must start "
                "on a chunk boundary")
        end = int(np.searchsorted(axis.bounds, stop)) if stop > start else first
        logical = axis.logical[first:end].copy()
        if end > first:
            logical[-1] = stop - axis.bounds[end - 1]
        new = AxisChunks(logical, axis.encoded[first:end].copy(),
                         axis.regular_size or axis.empty_chunk)
        return RectilinearGrid((*self.axes[:dim], new, *self.axes[dim + 1:])), slice(first, end)

    @classmethod
    def concat(cls, grids: Sequence[RectilinearGrid], dim: int) -> RectilinearGrid:
        """Concatenate grids along ``dim``; the other dimensions must be chunked identically."""
        if not grids:
            raise GridError("cannot concatenate an empty list of grids")
        first = grids[0]
        for k, g in enumerate(grids[1:], start=1):
            if g.ndim != first.ndim:
                raise GridError(f"grid {k} has {g.ndim} dimensions, grid 0 has {first.ndim}")
            for d in range(first.ndim):
                if d != dim and not g.axes[d].same_as(first.axes[d]):
                    raise GridError(
                        f"grid {k} is chunked differently from grid 0 along dimension {d} "
                        f"(lengths {_brief(g.axes[d].logical)} vs {_brief(first.axes[d].logical)})")
        joined = AxisChunks(
            np.concatenate([g.axes[dim].logical for g in grids]),
            np.concatenate([g.axes[dim].encoded for g in grids]),
            first.axes[dim].empty_chunk,
        )
        return cls((*first.axes[:dim], joined, *first.axes[dim + 1:]))

    # -- protocol ---------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RectilinearGrid):
            return NotImplemented
        return self.ndim == other.ndim and all(
            a.same_as(b) for a, b in zip(self.axes, other.axes, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        dims = ", ".join(
            str(a.regular_size) if a.regular_size is not None else _brief(a.logical)
            for a in self.axes)
        return f"RectilinearGrid(shape={self.shape}, chunks=({dims}))"

    def svg(self, dims: Sequence[str] | None = None, title: str | None = None) -> str:
        """The chunk picture (:mod:`refgrid.grid.svg`): boundaries where they fall, padded
        chunks marked."""
        return grid_svg([(a.logical, a.encoded) for a in self.axes], dims, title)


def _brief(values: np.ndarray, limit: int = 8) -> str:
    items = ", ".join(str(int(v)) for v in values[:limit])
    return f"[{items}{', ...' if len(values) > limit else ''}]"
