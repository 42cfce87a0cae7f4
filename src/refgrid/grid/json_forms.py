"""JSON forms of chunk grids: ``regular``, ``rectilinear`` (+ encoded extents), ``rectangular``.

Kept apart from :mod:`refgrid.grid.rectilinear` because the wire formats change independently of the
in-memory model (the encoded-extent field is still a proposal: zarr-extensions #74 / #75).
"""

from __future__ import annotations

import itertools
import json
import operator
from collections.abc import Mapping, Sequence
from typing import NotRequired, TypedDict, TypeGuard, cast

import numpy as np

from refgrid.errors import GridError
from refgrid.grid.rectilinear import AxisChunks, GridForm, RectilinearGrid, check_chunk_count

EdgeSpec = int | list[int | list[int]]
"""One dimension's edges: a regular length, or lengths and ``[length, repeat]`` runs."""


class ChunkGridConfiguration(TypedDict, total=False):
    chunk_shape: list[EdgeSpec]
    """``regular``: one integer per dimension; ``rectangular``: an integer or a list each."""
    kind: str
    chunk_shapes: list[EdgeSpec]
    encoded_chunk_shapes: list[EdgeSpec]


class ChunkGridJSON(TypedDict):
    """A ``chunk_grid`` document (``zarr.json``)."""

    name: str
    configuration: ChunkGridConfiguration
    must_understand: NotRequired[bool]


def parse_chunk_grid(doc: Mapping[str, object] | str, shape: Sequence[int]) -> RectilinearGrid:
    """Build a grid from a ``chunk_grid`` document (or its JSON text) for ``shape``."""
    if isinstance(doc, str):
        try:
            doc = json.loads(doc)
        except json.JSONDecodeError as e:
            raise GridError(f"a chunk grid document is not JSON: {e}") from e
    if not isinstance(doc, Mapping) or not isinstance(doc.get("configuration"), Mapping):
        raise GridError(f"a chunk grid needs 'name' and a 'configuration' object, got {doc!r:.120}")
    # (the configuration is a mapping: checked just above)
    name, config = doc.get("name"), cast("Mapping[str, object]", doc["configuration"])
    if name == "regular":
        chunk_shape = _dims(config, "chunk_shape", shape, name)
        if not all(_is_int(c) for c in chunk_shape):
            raise GridError(f"regular chunk_shape must be a list of integers, got {chunk_shape!r}")
        return RectilinearGrid.regular(shape, cast("list[int]", chunk_shape))
    if name == "rectilinear":
        if config.get("kind") != "inline":
            raise GridError(f"rectilinear grid kind {config.get('kind')!r} is not supported "
                            "(only 'inline')")
        specs = _dims(config, "chunk_shapes", shape, name)
        encoded = config.get("encoded_chunk_shapes")
        if encoded is not None and (not isinstance(encoded, list) or len(encoded) != len(shape)):
            raise GridError(f"encoded_chunk_shapes must list one entry per dimension "
                            f"({len(shape)}), got {encoded!r:.120}")
        return _checked(RectilinearGrid(tuple(
            _parse_axis(dim, n, spec, None if encoded is None else encoded[dim], rle=True)
            for dim, (n, spec) in enumerate(zip(shape, specs, strict=True)))))
    if name == "rectangular":
        specs = _dims(config, "chunk_shape", shape, name)
        return _checked(RectilinearGrid(tuple(
            _parse_axis(dim, n, spec, None, rle=False)
            for dim, (n, spec) in enumerate(zip(shape, specs, strict=True)))))
    raise GridError(f"unknown chunk grid {name!r} (expected regular, rectilinear or rectangular)")


def _checked(grid: RectilinearGrid) -> RectilinearGrid:
    for count in grid.chunk_counts:
        check_chunk_count([count])
    return grid


def emit_chunk_grid(grid: RectilinearGrid, form: GridForm = "auto") -> ChunkGridJSON:
    """The shortest document for ``grid``: ``regular`` when possible under ``form="auto"``."""
    if form == "auto" and grid.is_regular:
        return {"name": "regular", "configuration": {"chunk_shape": list(grid.chunk_shape or ())}}
    if form == "rectangular":
        return {"name": "rectangular",
                "configuration": {"chunk_shape": [_rectangular_dim(d, a)
                                                  for d, a in enumerate(grid.axes)]}}
    if form not in ("auto", "rectilinear"):
        raise GridError(f"unknown grid form {form!r} (auto, rectilinear or rectangular)")
    with_encoded = any(a.padded_inside for a in grid.axes)
    config: ChunkGridConfiguration = {"kind": "inline",
                                      "chunk_shapes": [_edges_spec(a, with_encoded)
                                                       for a in grid.axes]}
    if with_encoded:
        config["encoded_chunk_shapes"] = [_encoded_spec(a) for a in grid.axes]
    return {"name": "rectilinear", "configuration": config}


def grown_chunk_grid(doc: object, shape: Sequence[int], drop: int,
                     tail: RectilinearGrid) -> tuple[ChunkGridJSON, int] | None:
    """The ``rectilinear`` document ``doc`` (of an array of ``shape``) with the chunks of its
    last ``drop`` elements along the first dimension replaced by ``tail``'s, and how many
    chunks along it are kept: what :func:`emit_chunk_grid` writes for the grown grid, made by
    editing the end of the run list (a grown archive's 10^5 files have 2x10^5 runs, parsed
    and written again otherwise). None where this does not apply — another form, padding
    inside, other chunks along other dimensions, the chunks not ending where the last
    ``drop`` elements begin, a grid that becomes regular — and the caller parses the grid
    whole."""
    config = doc.get("configuration") if isinstance(doc, Mapping) else None
    if not isinstance(config, Mapping) or cast(Mapping[str, object], doc).get("name") != \
            "rectilinear" or config.get("kind") != "inline" or \
            "encoded_chunk_shapes" in config or any(a.padded_inside for a in tail.axes):
        return None
    specs, grown = config.get("chunk_shapes"), [_edges_spec(a, False) for a in tail.axes]
    if not isinstance(specs, list) or len(specs) != len(shape) or specs[1:] != grown[1:] or \
            not isinstance(specs[0], list) or not isinstance(grown[0], list):
        return None
    runs_kept = list(specs[0])
    try:  # the final chunk is declared at its stored length: past the array's end
        padding = sum(itertools.starmap(operator.mul, runs_kept)) - int(shape[0])
        if not runs_kept or not 0 <= padding < runs_kept[-1][0]:
            return None  # (too short, or chunks past the end: the whole parse says which)
        remove, kept = drop + padding, sum(map(operator.itemgetter(1), runs_kept))
        while remove > 0 and runs_kept:
            length, repeat = runs_kept[-1]
            if type(length) is not int or type(repeat) is not int or length < 1:
                return None
            whole = min(repeat, remove // length)
            if whole < 1:
                return None  # the last elements begin inside a chunk
            remove, kept = remove - whole * length, kept - whole
            runs_kept[-1:] = [[length, repeat - whole]] if whole < repeat else []
    except (TypeError, ValueError):  # not runs
        return None
    new = list(cast(list[list[int]], grown[0]))
    if remove != 0 or drop > int(shape[0]):
        return None
    if runs_kept and new and runs_kept[-1][0] == new[0][0]:
        runs_kept[-1], new = [new[0][0], runs_kept[-1][1] + new[0][1]], new[1:]
    joined = runs_kept + new
    if len(joined) == 1 and all(isinstance(s, list) and len(s) == 1 for s in specs[1:]):
        return None  # regular now
    return {"name": "rectilinear",
            "configuration": {"kind": "inline", "chunk_shapes": [joined, *specs[1:]]}}, kept


def rle(values: np.ndarray) -> list[int | list[int]]:
    """Run-length encode edge lengths, using ``[length, repeat]`` where it is no longer."""
    if len(values) == 0:
        return []
    starts = np.concatenate(([0], np.flatnonzero(np.diff(values)) + 1))
    counts = np.diff(np.concatenate((starts, [len(values)])))
    out: list[int | list[int]] = []
    for v, n in zip(values[starts].tolist(), counts.tolist(), strict=True):
        if n > 1 and len(f"[{v},{n}]") <= n * (len(str(v)) + 1) - 1:
            out.append([v, n])
        else:
            out.extend([v] * n)
    return out


def runs(values: np.ndarray) -> list[int | list[int]]:
    """Edge lengths as ``[length, repeat]`` runs only: the one form of ``chunk_shapes``
    every rectilinear reader parses (Icechunk 2 refuses bare integers, for a dimension or
    mixed among runs, where zarr-python takes all three)."""
    if len(values) == 0:
        return []
    starts = np.concatenate(([0], np.flatnonzero(np.diff(values)) + 1))
    counts = np.diff(np.concatenate((starts, [len(values)])))
    return [[v, n] for v, n in zip(values[starts].tolist(), counts.tolist(), strict=True)]


def _edges_spec(axis: AxisChunks, with_encoded: bool) -> EdgeSpec:
    """Edges of one dimension, as runs; without ``encoded_chunk_shapes`` the last edge
    carries the padding of the array's final chunk (it overflows the shape, as the spec
    allows)."""
    size = axis.regular_size
    if size is not None:
        return [[size, axis.nchunks]] if axis.nchunks else size
    return runs(axis.logical if with_encoded else axis.declared())


def _encoded_spec(axis: AxisChunks) -> EdgeSpec:
    if axis.nchunks and (axis.encoded == axis.encoded[0]).all():
        return int(axis.encoded[0])
    return rle(axis.encoded)


def _rectangular_dim(dim: int, axis: AxisChunks) -> EdgeSpec:
    if axis.regular_size is not None:
        return axis.regular_size
    padded = np.flatnonzero(axis.encoded != axis.logical)
    if padded.size:
        c = int(padded[0])
        raise GridError(
            f"dimension {dim}: chunk {c} is stored padded ({int(axis.encoded[c])} elements for "
            f"{int(axis.logical[c])}), which a ZEP0003 'rectangular' grid cannot express; "
            "write the 'rectilinear' form instead")
    return axis.logical.tolist()


def _dims(config: Mapping[str, object], key: str, shape: Sequence[int], name: str
          ) -> list[object]:
    specs = config.get(key)
    if not isinstance(specs, list):
        raise GridError(f"{name} grid configuration needs a list {key!r}, got {specs!r:.120}")
    if len(specs) != len(shape):
        raise GridError(f"{name} grid has {len(specs)} dimensions in {key!r} but the array "
                        f"shape {tuple(shape)} has {len(shape)}")
    return specs


def _is_int(v: object) -> TypeGuard[int | np.integer]:
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


MAX_EDGE = 2**62
"""The longest chunk edge accepted (lengths are summed in int64 without overflow)."""


def _expand(dim: int, spec: object, what: str, rle_allowed: bool, *, reach: int | None = None,
            count: int | None = None) -> tuple[np.ndarray, int]:
    """Edge lengths from a list of lengths (with ``[length, repeat]`` runs if allowed),
    expanded only as far as needed — until they cover ``reach`` elements or number ``count``
    edges — so a run of 10^12 edges past the array's end costs nothing. Returns the edges
    and how many the list declares in all."""
    if not isinstance(spec, list):
        raise GridError(f"dimension {dim}: {what} must be an integer or a list, got {spec!r:.80}")
    clean = _clean_entries(spec, rle_allowed)
    if clean is None:  # large lengths or repeats, or something to refuse: item by item
        return _taken(*_checked_entries(dim, spec, what, rle_allowed), reach, count)
    values, repeats = clean
    ends = np.cumsum(repeats)  # edges declared up to each entry
    covered = np.cumsum(values * repeats)  # elements covered (< 2**62 in all: checked)
    taken, need = len(values), repeats.copy()
    if reach is not None and len(values) and covered[-1] >= reach:
        taken = int(np.searchsorted(covered, reach)) + 1
        before = int(covered[taken - 2]) if taken > 1 else 0
        need[taken - 1] = min(int(repeats[taken - 1]),
                              max(1, -(-(reach - before) // int(values[taken - 1]))))
    if count is not None and len(values) and ends[-1] >= count:
        taken = min(taken, int(np.searchsorted(ends, count)) + 1)
        before = int(ends[taken - 2]) if taken > 1 else 0
        need[taken - 1] = min(int(need[taken - 1]), count - before)
    check_chunk_count([int(need[:taken].sum())])  # before the edges are made
    return np.repeat(values[:taken], need[:taken]), int(ends[-1]) if len(ends) else 0


ENTRY_BOUND = 2**31
"""Lengths and repeats below this (and covering fewer than 2**62 elements in all) add up
without overflow as int64: the bulk path."""


def _clean_entries(spec: list[object], rle_allowed: bool
                   ) -> tuple[np.ndarray, np.ndarray] | None:
    """Lengths and repeats of a list of positive integers below :data:`ENTRY_BOUND` (and
    ``[length, repeat]`` runs if allowed), read in bulk — a grid of 10^6 chunks along time
    has as many entries — or None when any entry is anything else."""
    pairs = [x if type(x) is list else (x, 1) for x in spec] if rle_allowed else \
        [(x, 1) for x in spec]
    try:
        if not all(type(v) is int and type(r) is int for v, r in pairs):
            return None
        table = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    except (TypeError, ValueError, OverflowError):  # a run that is not a pair, a huge value
        return None
    if len(table) and ((table < 1).any() or (table >= ENTRY_BOUND).any()
                       or float(table[:, 0].astype(float) @ table[:, 1]) >= 2.0**62):
        return None  # (covered elements summed as int64 must not overflow)
    return table[:, 0], table[:, 1]


def _checked_entries(dim: int, spec: list[object], what: str, rle_allowed: bool
                     ) -> tuple[list[int], list[int]]:
    """The lengths and repeats of ``spec``, refusing the first entry that is not one."""
    values, repeats = [], []
    for item in spec:
        if _is_int(item):
            value, repeat = item, 1
        elif rle_allowed and isinstance(item, list) and len(item) == 2 and all(map(_is_int, item)):
            value, repeat = item
            if repeat < 1:
                raise GridError(f"dimension {dim}: run {item} in {what} has a repeat count "
                                "below 1")
        else:
            form = "an integer or a [length, repeat] pair" if rle_allowed else "an integer"
            raise GridError(f"dimension {dim}: malformed entry {item!r:.80} in {what}; each "
                            f"entry must be {form}")
        if not 1 <= value <= MAX_EDGE:
            raise GridError(f"dimension {dim}: {what} must be >= 1 and <= 2**62, "
                            f"got {value}")
        values.append(int(value))
        repeats.append(int(repeat))
    return values, repeats


def _taken(values: list[int], repeats: list[int], reach: int | None, count: int | None
           ) -> tuple[np.ndarray, int]:
    """The edges of :func:`_expand` in Python integers (lengths up to 2**62, runs of any
    length past the array's end)."""
    declared = sum(repeats)
    taken, covered, edges = 0, 0, 0
    for k, (value, repeat) in enumerate(zip(values, repeats, strict=True)):
        need = repeat
        if reach is not None:
            need = min(repeat, max(1, -(-(reach - covered) // value)))
        if count is not None:
            need = min(need, count - edges)
        repeats[k] = need
        covered += need * value
        edges += need
        taken = k + 1
        if (reach is not None and covered >= reach) or (count is not None and edges >= count):
            break
    check_chunk_count([edges])  # before the edges are made
    return np.repeat(np.asarray(values[:taken], dtype=np.int64), repeats[:taken]), declared


def _parse_axis(dim: int, length: int, spec: object, encoded_spec: object, rle: bool
                ) -> AxisChunks:
    if _is_int(spec):
        if not 1 <= spec <= MAX_EDGE:
            raise GridError(f"dimension {dim}: chunk length {spec} must be >= 1 and <= 2**62")
        regular = RectilinearGrid.regular([length], [int(spec)]).axes[0]  # (checks the count)
        edges = regular.encoded
        declared = len(edges)
    else:
        edges, declared = _expand(dim, spec, "chunk lengths", rle, reach=length)
    total = int(edges.sum())
    if total < length:
        raise GridError(f"dimension {dim}: chunk lengths sum to {total}, shorter than the "
                        f"array's length {length}")
    starts = np.cumsum(edges) - edges
    kept = int(np.searchsorted(starts, length))  # chunks that begin beyond the end hold nothing
    logical = np.minimum(edges[:kept], length - starts[:kept])
    if encoded_spec is None:
        encoded = edges[:kept]
    else:
        if _is_int(encoded_spec):
            if not 1 <= encoded_spec <= MAX_EDGE:
                raise GridError(f"dimension {dim}: encoded chunk length {encoded_spec} must "
                                "be >= 1 and <= 2**62")
            encoded_all, encoded_declared = (np.full(len(edges), int(encoded_spec), np.int64),
                                             declared)
        else:
            encoded_all, encoded_declared = _expand(dim, encoded_spec, "encoded chunk lengths",
                                                    True, count=len(edges))
        if encoded_declared != declared:
            raise GridError(f"dimension {dim}: encoded_chunk_shapes has {encoded_declared} "
                            f"edges but chunk_shapes has {declared}; they must be equal")
        encoded = encoded_all[:kept]
    return AxisChunks.of(dim, logical, encoded, int(spec) if _is_int(spec) else 1)
