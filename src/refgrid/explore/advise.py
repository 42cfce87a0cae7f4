"""The chunk-shape advisor: which regular chunks to copy a virtual array into.

Two methods:

* ``"balanced-3d"`` — the algorithm of the Project Pythia notebook "Choosing an Optimal Chunk
  Size and Shape" (``../shared/seeds``), for 3-D arrays whose first dimension is time: the
  shape whose time series and maps touch about as many chunks, as large as the size allows,
  whose partial edge chunks keep at least a fraction of a chunk. Kept exactly, so its worked
  examples come out as published.
* ``"general"`` (the default) — any rank and any mix of access patterns. Every combination of
  candidate lengths per dimension (divisors, powers of two, multiples of the native chunks,
  the whole dimension) within the size window — and within a factor of 2 of the size aimed
  at, where any shape is — is scored by the modelled time of each access
  pattern — chunks touched x (a request's overhead + a chunk's bytes / bandwidth), weighted
  as asked — plus, since refgrid knows where the source chunks are, how many source chunks
  a copy into those chunks reads per source chunk (1 when the boundaries align: each source
  chunk is read once).

An access pattern names the dimensions one read spans whole, the others taken at one index:
``{"time": 1}`` is a time series, ``{("lat", "lon"): 1}`` a map.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from refgrid.errors import ArgumentError
from refgrid.grid.rectilinear import AxisChunks, RectilinearGrid
from refgrid.model.virtual import VirtualArray, VirtualGroup

Method = Literal["general", "balanced-3d"]
Access = Mapping[str | tuple[str, ...], float]
SIZE_WINDOW = (10 * 2**20, 200 * 2**20)
"""The chunk sizes the notebook recommends (uncompressed bytes)."""
REQUEST_OVERHEAD = 0.01
"""Seconds a chunk read costs besides its bytes (an object store's first-byte latency)."""
BANDWIDTH = 200e6
"""Bytes a second one reader gets."""
MAX_PER_DIM = 48
"""Candidate lengths per dimension (more are thinned, keeping the smallest and largest)."""
MAX_COMBINATIONS = 2_000_000
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20,
          "gib": 2**30}


def parse_size(size: int | float | str, what: str = "size") -> int:
    """Bytes from ``10_000_000``, ``"10MiB"``, ``"10 MB"``, ``"1.5GiB"``."""
    if isinstance(size, int | float) and not isinstance(size, bool):
        return int(size)
    found = re.fullmatch(r"\s*([0-9.]+)\s*([a-zA-Z]*)\s*", str(size))
    if not found or found.group(2).lower() not in _UNITS:
        raise ArgumentError(f"{what} {size!r}: expected bytes, or a number with a unit "
                            f"({', '.join(u for u in _UNITS if u)})")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


SMALL = 4
"""An array this many times smaller than the chunk size aimed at is called far below it."""


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


@dataclass(frozen=True)
class PatternCost:
    """What one access pattern costs with a chunk shape."""

    dims: tuple[str, ...]
    weight: float
    chunks: int
    """Chunks one such read touches."""
    amplification: float
    """Bytes read / bytes wanted."""
    seconds: float
    """Modelled time of one such read."""


@dataclass(frozen=True)
class ChunkAdvice:
    """A chunk shape and the numbers behind it."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    itemsize: int
    method: Method
    partial_fraction: float
    """The smallest edge chunk, as a fraction of a whole one (1.0: no partial chunks)."""
    patterns: tuple[PatternCost, ...]
    copy_reads: float | None
    """Source chunks read per source chunk when copying into these chunks (None: unknown)."""
    candidates: tuple[tuple[tuple[int, ...], float], ...] = field(default=(), repr=False)
    """The best shapes considered with their scores (lower is better), best first."""
    target_bytes: int | None = None
    """The chunk size aimed at."""

    @property
    def array_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def chunk_bytes(self) -> int:
        return math.prod(self.chunks) * self.itemsize

    @property
    def encoding(self) -> dict[str, int]:
        """``{dim: length}``, for ``chunks=`` arguments."""
        return dict(zip(self.dims, self.chunks, strict=True))

    def __repr__(self) -> str:
        lines = [f"ChunkAdvice({self.method}): chunks {self.encoding} "
                 f"({self.chunk_bytes / 2**20:.2f} MiB), partial fraction "
                 f"{self.partial_fraction:.3f}"
                 + (f", copy reads {self.copy_reads:.2f}x" if self.copy_reads else "")]
        for p in self.patterns:
            lines.append(f"  one read along {'+'.join(p.dims)} (weight {p.weight:g}): "
                         f"{p.chunks:,} chunk{'s' if p.chunks != 1 else ''}, "
                         f"{p.amplification:.1f} times the bytes it wants, ~{p.seconds:.3g} s")
        if self.target_bytes and self.array_bytes * SMALL < self.target_bytes:
            lines.append(f"  note: the whole array is {_mib(self.array_bytes)}, far below the "
                         f"{_mib(self.target_bytes)} aimed at: one chunk holds it all, and "
                         "every read reads all of it (fine for a small array)")
        return "\n".join(lines)


def advise_chunks(target: VirtualArray | VirtualGroup | Sequence[int],
                  size: int | str = "10MiB", access: Access | None = None, *,
                  method: Method = "general", window: tuple[int | str, int | str] | None = None,
                  partial_fraction: float = 0.5, itemsize: int | None = None,
                  dims: Sequence[str] | None = None, variable: str | None = None,
                  align: bool = True) -> ChunkAdvice:
    """Advise a regular chunk shape for copying ``target`` (an array, a dataset — its largest
    array, or ``variable`` — or a bare shape with ``itemsize``).

    ``size``: the chunk size aimed at (uncompressed; ``"balanced-3d"``: the largest allowed).
    ``access``: weights of access patterns (default: time series along the first dimension and
    maps across the others, equally). ``window``: the sizes allowed (default 10-200 MiB, or
    down to ``size`` when it is smaller). ``partial_fraction``: the smallest edge chunk allowed,
    as a fraction of a chunk. ``align``: prefer shapes whose boundaries fall on the native
    chunks' (a copy then reads each source chunk once).
    """
    array = _array(target, variable)
    if array is not None:
        shape, names, itemsize = array.shape, list(dims or array.dims), array.dtype.itemsize
        grid: RectilinearGrid | None = array.grid
    else:
        shape = tuple(int(n) for n in target)  # type: ignore[union-attr]
        names = list(dims or [f"dim_{i}" for i in range(len(shape))])
        grid = None
        if itemsize is None:
            raise ArgumentError("a bare shape needs itemsize= (bytes per value)")
    if len(names) != len(shape):
        raise ArgumentError(f"{len(names)} dimension names for a shape of rank {len(shape)}")
    if not shape or min(shape) < 1:
        raise ArgumentError(f"cannot chunk an array of shape {tuple(shape)}")
    target_bytes = parse_size(size, "size")
    if target_bytes < itemsize:
        raise ArgumentError(f"size {size!r} is smaller than one value ({itemsize} bytes)")
    if not 0 <= partial_fraction <= 1:
        raise ArgumentError(f"partial_fraction {partial_fraction} must lie in [0, 1]")
    patterns = _patterns(access, names)
    if method == "balanced-3d":
        if len(shape) != 3:
            raise ArgumentError(f"the balanced-3d method takes 3-D arrays, not rank {len(shape)}")
        chunks = _balanced_3d(shape, target_bytes, itemsize, partial_fraction)
        advice = _advice(names, shape, chunks, itemsize, method, patterns, grid, ())
    elif method != "general":
        raise ArgumentError(f"method {method!r}: general or balanced-3d")
    else:
        low, high = (parse_size(w, "window") for w in window) if window else (
            min(SIZE_WINDOW[0], target_bytes), max(SIZE_WINDOW[1], target_bytes))
        advice = _general(names, shape, itemsize, target_bytes, (low, high), partial_fraction,
                          patterns, grid if align else None)
    return replace(advice, target_bytes=target_bytes)


def _array(target: VirtualArray | VirtualGroup | Sequence[int],
           variable: str | None) -> VirtualArray | None:
    if isinstance(target, VirtualArray):
        return target
    if isinstance(target, VirtualGroup):
        arrays = {p: a for p, a in target.walk() if isinstance(a, VirtualArray)}
        if variable is not None:
            if variable not in arrays:
                raise ArgumentError(f"no array {variable!r} (arrays: {', '.join(arrays)})")
            return arrays[variable]
        if not arrays:
            raise ArgumentError("the dataset has no arrays")
        return max(arrays.values(), key=lambda a: (math.prod(a.shape) * a.dtype.itemsize))
    return None


def _patterns(access: Access | None, names: list[str]) -> list[tuple[tuple[int, ...], float]]:
    """Access patterns as (axes read whole, weight)."""
    if access is None:
        if len(names) == 1:
            return [((0,), 1.0)]
        return [((0,), 1.0), (tuple(range(1, len(names))), 1.0)]
    out = []
    for key, weight in access.items():
        group = (key,) if isinstance(key, str) else tuple(key)
        unknown = [d for d in group if d not in names]
        if unknown:
            raise ArgumentError(f"access pattern {key!r}: no dimension {unknown[0]!r} "
                                f"(dimensions: {', '.join(names)})")
        if not weight >= 0:
            raise ArgumentError(f"access pattern {key!r}: weight {weight!r} must be >= 0")
        out.append((tuple(names.index(d) for d in group), float(weight)))
    if not out or sum(w for _, w in out) <= 0:
        raise ArgumentError("access needs at least one pattern with a positive weight")
    return out


# -- the notebook's algorithm ------------------------------------------------------------

def _edge_fraction(shape: Sequence[int], chunks: Sequence[float]) -> float:
    """The notebook's partial chunk fraction: the product over dimensions of the edge chunk's
    share of a chunk (1 where the chunk length divides the dimension)."""
    rest = np.remainder(np.asarray(shape, float), np.asarray(chunks, float)) / np.asarray(
        chunks, float)
    return float(np.where(rest == 0, 1, rest).prod())


def _balanced_3d(shape: Sequence[int], size: int, itemsize: int,
                 fraction: float) -> tuple[int, ...]:
    """The seed notebook's ``chunk_shape_3D``: the same steps, the same ties."""
    values = size / itemsize
    count = max(math.prod(shape) / values, 1.0)
    per_series = math.sqrt(count)  # chunks along time for a time series
    per_side = math.sqrt(per_series)  # chunks along each spatial dimension for a map
    if shape[0] < per_series:
        ideal = [1.0]
        per_side /= math.sqrt(shape[0] / per_series)
    else:
        ideal = [float(shape[0] // per_series)]
    widen = math.prod(per_side / n for n in shape[1:] if n < per_side)
    ideal += [1.0 if n < per_side else float((widen * n) // per_side) for n in shape[1:]]
    best: list[float] = []
    best_bytes = 0
    for step in itertools.product((0, 1), repeat=3):
        trial = [c + s for c, s in zip(ideal, step, strict=True)]
        nbytes = int(itemsize * math.prod(trial))
        if best_bytes < nbytes <= size and _edge_fraction(shape, trial) >= fraction:
            best, best_bytes = trial, nbytes
    if best:
        return tuple(int(c) for c in best)
    best_distance = float(np.linalg.norm(ideal))
    for steps in (((-1, 0, 0), (0, 1, 0), (0, 0, 1)), ((1, 0, 0), (0, -1, 0), (0, 0, -1))):
        reached = _edge_fraction(shape, ideal)
        trial = list(ideal)
        while reached < fraction:
            if min(trial) < 1 or any(c > n for c, n in zip(trial, shape, strict=True)):
                break
            for step in steps:
                trial = [c + s for c, s in zip(trial, step, strict=True)]
                nbytes = int(itemsize * math.prod(trial))
                edge = _edge_fraction(shape, trial)
                if nbytes <= size and edge >= fraction:
                    reached = edge
                    distance = float(np.linalg.norm(np.subtract(ideal, trial)))
                    if distance < best_distance:
                        best_distance, best = distance, list(trial)
    if not best:
        raise ArgumentError(f"no chunk shape of at most {size} bytes for {tuple(shape)} keeps "
                            f"edge chunks of at least {fraction} of a chunk")
    return tuple(int(c) for c in best)


# -- the general method ----------------------------------------------------------------------

def _lengths(n: int, native: np.ndarray | None, itemsize: int, high: int) -> np.ndarray:
    """Candidate chunk lengths along a dimension of length ``n``."""
    found = {n, 1}
    found.update(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    found.update(n // d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    found.update(2**k for k in range(int(math.log2(n)) + 1))
    found.update(round(n / k) for k in range(1, 65))
    aligned: set[int] = set()
    if native is not None and len(native):
        step = int(np.argmax(np.bincount(native)))  # the most common native length
        aligned = {step * k for k in range(1, n // step + 1)} | {n}
    return np.union1d(_thinned(found - aligned, n, itemsize, high),
                      _thinned(aligned, n, itemsize, high)).astype(np.int64)


def _thinned(lengths: set[int], n: int, itemsize: int, high: int) -> np.ndarray:
    """``lengths`` that fit, at most half of :data:`MAX_PER_DIM`, evenly in log space."""
    kept = np.array(sorted(c for c in lengths if 1 <= c <= n and c * itemsize <= high),
                    dtype=np.int64)
    if len(kept) > MAX_PER_DIM // 2:
        keep = np.unique(np.round(np.geomspace(1, len(kept), MAX_PER_DIM // 2)).astype(int) - 1)
        kept = kept[keep]
    return kept


def _copy_reads(axis: AxisChunks, length: int) -> float:
    """Source chunks (those of ``axis``) read per source chunk when copying into chunks of
    ``length``: 1.0 when every new boundary is a source boundary."""
    return float(axis.overlaps(length).sum()) / axis.nchunks


def _general(names: list[str], shape: tuple[int, ...], itemsize: int, size: int,
             window: tuple[int, int], fraction: float,
             patterns: list[tuple[tuple[int, ...], float]],
             grid: RectilinearGrid | None) -> ChunkAdvice:
    low, high = window
    per_dim = [_lengths(n, grid.axes[d].logical if grid is not None else None, itemsize, high)
               for d, n in enumerate(shape)]
    total = math.prod(len(c) for c in per_dim)
    if total > MAX_COMBINATIONS:
        raise ArgumentError(f"{total:,} candidate shapes for rank {len(shape)}: too many")
    mesh = np.meshgrid(*[c.astype(np.float64) for c in per_dim], indexing="ij")
    flat = [m.reshape(-1) for m in mesh]
    values = np.prod(flat, axis=0)
    nbytes = values * itemsize
    edge = np.ones_like(values)
    for c, n in zip(flat, shape, strict=True):
        rest = np.remainder(n, c) / c
        edge *= np.where(rest == 0, 1, rest)
    ok = (nbytes <= high) & (edge >= fraction)
    if math.prod(shape) * itemsize >= low:  # (a smaller array: any size up to it will do)
        ok &= nbytes >= low
    if not ok.any():
        raise ArgumentError(f"no chunk shape of {low:,}-{high:,} bytes for {shape} keeps edge "
                            f"chunks of at least {fraction} of a chunk; widen the window or "
                            "lower partial_fraction")
    near = ok & (nbytes >= size / 2) & (nbytes <= size * 2)
    if near.any():  # the size aimed at: within a factor of 2 of it where anything fits
        ok = near
    score = np.zeros_like(values)
    weights = sum(w for _, w in patterns)
    for axes, weight in patterns:
        touched = np.ones_like(values)
        for a in axes:
            touched *= np.ceil(shape[a] / flat[a])
        score += weight / weights * touched * (REQUEST_OVERHEAD + nbytes / BANDWIDTH)
    copy = np.ones_like(values)
    if grid is not None:
        for d, lengths in enumerate(per_dim):
            reads = np.array([_copy_reads(grid.axes[d], int(c)) for c in lengths])
            copy *= reads[np.searchsorted(lengths, flat[d])]
        score *= copy  # a copy reading sources twice costs twice
    score += np.abs(np.log(nbytes / size)) * 1e-9 * np.max(score)  # ties: nearest the size
    order = np.flatnonzero(ok)[np.argsort(score[ok], kind="stable")]
    best = order[0]
    chunks = tuple(int(f[best]) for f in flat)
    candidates = tuple((tuple(int(f[i]) for f in flat), float(score[i])) for i in order[:20])
    return _advice(names, shape, chunks, itemsize, "general", patterns, grid, candidates)


def _advice(names: list[str], shape: tuple[int, ...], chunks: tuple[int, ...], itemsize: int,
            method: Method, patterns: list[tuple[tuple[int, ...], float]],
            grid: RectilinearGrid | None,
            candidates: tuple[tuple[tuple[int, ...], float], ...]) -> ChunkAdvice:
    nbytes = math.prod(chunks) * itemsize
    costs = []
    for axes, weight in patterns:
        touched = math.prod(math.ceil(shape[a] / chunks[a]) for a in axes)
        wanted = math.prod(shape[a] for a in axes)
        costs.append(PatternCost(tuple(names[a] for a in axes), weight, touched,
                                 touched * math.prod(chunks) / wanted,
                                 touched * (REQUEST_OVERHEAD + nbytes / BANDWIDTH)))
    copy = math.prod(_copy_reads(grid.axes[d], c) for d, c in enumerate(chunks)) \
        if grid is not None else None
    return ChunkAdvice(tuple(names), shape, chunks, itemsize, method,
                       _edge_fraction(shape, chunks), tuple(costs), copy, candidates)
