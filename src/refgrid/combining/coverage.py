"""Parts that cover other values along the concat dimension: an outer join, file by file.

Stacked members and merged file sets are put side by side as xarray's ``join="outer"``
puts them: along the concat dimension, the union of every part's values, and a part that
lacks some of them reads its data variables as their fill values there (``missing="fill"``;
refused by default, naming the part and the first value it lacks).

No byte is written for it. The files of other parts that hold exactly the values a part
lacks *stand in* for it: their coordinates come along (so every part's coordinates agree,
and the combine checks they do) and so do their data variables' chunk grids, with no chunk
stored (so a member's grid along time is the other members' where it has no file, as one
Zarr array needs). A variable no standing file holds (another file set's: ``pr`` where only
``tas`` files cover a year) is filled as any variable absent from a file is, over the
standing file's length. Where no set of whole files holds exactly what a part lacks — a
file of one part ends in the middle of another's — the join is refused, naming both files:
one array has one grid, and a grid cut mid-chunk cannot be written without copying.

Values compare as xarray aligns them: CF times decoded (whatever units each file writes
them in), other coordinates by value in one set of units.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from refgrid.combining.arrays import inlined
from refgrid.combining.concat import fillable, retimed
from refgrid.core import cf
from refgrid.errors import CombineError
from refgrid.model.choose import coordinate_names
from refgrid.model.manifest import ChunkManifest
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup

Values = np.ndarray
"""One file's values along the concat dimension, as they compare: CF times decoded (numpy
dates, or cftime dates of one calendar), other values as numbers of one set of units."""


@dataclass(frozen=True)
class Part:
    """One stacked member or merged file set: its name in messages and its files'."""

    name: str
    files: Sequence[str]
    kind: Hashable
    """What its files hold (a file set's data variables): files of the same kind stand in
    first, as their data variables' grids are the part's own."""


def standing(parts: Sequence[Part], values: Sequence[Sequence[Values]], dim: str,
             fill: bool, per_file: bool, shown: Callable[[object], str]
             ) -> tuple[list[list[tuple[int, int]]], list[ReportEntry]]:
    """For each part, the files ``(part, file)`` of other parts that stand in for the values
    it lacks, and what the report says of them; ``values``: each part's files' (``shown``
    as messages show them); ``per_file``: variables without ``dim`` are kept per file
    (``others="stack"``), which a file standing in would give values no file holds."""
    chosen: list[list[tuple[int, int]]] = [[] for _ in parts]
    held = [np.unique(np.concatenate(files)) for files in values]
    union = np.unique(np.concatenate(held))
    if all(len(h) == len(union) for h in held):  # (the common case: one sort per part)
        return chosen, []
    report: list[ReportEntry] = []
    for p, part in enumerate(parts):
        lacking = np.setdiff1d(union, held[p], assume_unique=True)
        if not len(lacking):
            continue
        q, k = _holder(values, lacking[0])
        if not fill:
            raise CombineError(
                f"the parts do not agree along {dim!r}: {part.name} lacks {len(lacking)} of "
                f"the {len(union)} values the others hold (the first, {shown(lacking[0])}, "
                f"is in {parts[q].files[k]} of {parts[q].name}) — pass missing='fill' to "
                "join them as xarray's join='outer' does: the values a part lacks read as "
                "fill values there")
        _alignable(parts, values, dim, per_file)
        order = sorted((q for q in range(len(parts)) if q != p),
                       key=lambda q: parts[q].kind != part.kind)
        left = lacking
        for q in order:
            for k, v in enumerate(values[q]):
                if len(v) and len(left) and np.isin(v, left).all():
                    chosen[p].append((q, k))
                    left = np.setdiff1d(left, v)
        if len(left):
            q, k = _holder(values, left[0])
            raise CombineError(
                f"{part.name} lacks {dim} {shown(left[0])}, which {parts[q].files[k]} holds "
                f"with values {part.name} has: one array has one grid along {dim!r}, and a "
                "file that covers part of what another part lacks cannot stand in for it")
        _in_order(part, values[p], [(parts[q].files[k], values[q][k]) for q, k in chosen[p]],
                  dim)
        sources = [parts[q].files[k] for q, k in chosen[p]]
        report.append(ReportEntry(sources[0], "", "filled", (
            f"{part.name} lacks {len(lacking)} of the {len(union)} values of {dim!r} the "
            f"others hold (from {shown(lacking[0])}): {len(sources)} file(s) of others "
            f"({sources[0]}{' and more' if len(sources) > 1 else ''}) stand in with no chunk "
            "— its variables read as their fill values there (an outer join)")))
    return chosen, report


def _alignable(parts: Sequence[Part], values: Sequence[Sequence[Values]], dim: str,
               per_file: bool) -> None:
    """Refuses a join xarray's would not make as files stand in: values that repeat
    (xarray cannot align them), a file's values that do not increase (the union is
    sorted, and a file is never reordered), variables kept per file."""
    if per_file:
        raise CombineError(f"the parts cover other values of {dim!r}, and others='stack' keeps "
                           "variables without it per file: a file standing in for a part "
                           "would give them values no file of the part holds (combine the "
                           "parts apart, or keep such variables once)")
    for part, files in zip(parts, values, strict=True):
        every = np.concatenate(files)
        if len(np.unique(every)) != len(every):
            raise CombineError(f"{part.name} repeats values of {dim!r}: parts that cover "
                               "other values are aligned by value, which needs each once")
        for name, v in zip(part.files, files, strict=True):
            if len(v) > 1 and not (v[1:] > v[:-1]).all():
                raise CombineError(f"{name}: its values of {dim!r} do not increase: parts "
                                   "that cover other values are aligned on their sorted "
                                   "union, and a file's values are never reordered")


def _in_order(part: Part, own: Sequence[Values], standing: Sequence[tuple[str, Values]],
              dim: str) -> None:
    """Refuses files that would stand in among a part's values rather than between its
    files (whole files are placed by their first value; the union is sorted)."""
    spans = [(v.min(), v.max(), "") for v in own if len(v)] + [
        (v.min(), v.max(), name) for name, v in standing]
    spans.sort(key=lambda s: s[0])
    reach: dict[bool, tuple[object, str]] = {}  # (the furthest own and standing value yet)
    for first, last, name in spans:
        for standing_before, (far, other) in reach.items():
            if (name or standing_before) and not far < first:
                raise CombineError(
                    f"{part.name}: {name or other} would stand in for values of {dim!r} "
                    "among its own files' values, not between them: whole files cannot "
                    "align there")
        kind = bool(name)
        if kind not in reach or reach[kind][0] < last:
            reach[kind] = (last, name)


def stand_in(source: VirtualGroup, like: VirtualGroup, dim: str, where: str,
             read: Callable[[VirtualArray], np.ndarray]) -> VirtualGroup:
    """``source`` (another part's file) standing in for a part whose first file is
    ``like``, as that part would hold it: its coordinates with ``like``'s attributes (and
    times re-encoded to ``like``'s units, as the concat encodes them); the data variables
    along ``dim`` that ``like`` holds as ``like`` stores them, on ``source``'s grid with none
    of its chunks; the rest left out (a data variable without ``dim`` is the part's own,
    which the concat takes from its files); ``like``'s own attributes."""
    coords = coordinate_names(source)
    times = cf.time_encodings({n: a.attrs for n, a in source.arrays.items()})
    theirs = cf.time_encodings({n: a.attrs for n, a in like.arrays.items()})
    arrays: dict[str, VirtualArray] = {}
    for name, a in source.arrays.items():
        own = like.arrays.get(name)
        if own is not None and own.dims != a.dims:
            raise CombineError(f"{name}: dimensions {own.dims} in {where} but {a.dims} in "
                               "the file of another part that would stand in for it")
        if name in coords:
            if own is not None and times.get(name) != theirs.get(name):
                arrays[name] = _retimed(a, own, times.get(name), theirs.get(name), read, where)
            else:
                arrays[name] = a if own is None else replace(a, attrs=own.attrs)
        elif own is not None and dim in a.dims:  # (the part's own encoding, no chunk)
            fillable(own, f"{where} lacks values of {dim!r} others hold", name)
            arrays[name] = replace(own, grid=a.grid, segments=None,
                                   manifest=ChunkManifest.empty(a.grid.chunk_counts))
    groups = {name: stand_in(g, like.groups[name], dim, where, read)
              for name, g in source.groups.items() if name in like.groups}
    return replace(source, attrs=like.attrs, arrays=arrays, groups=groups, report=())


def _retimed(array: VirtualArray, own: VirtualArray, encoding: cf.TimeEncoding | None,
             target: cf.TimeEncoding | None, read: Callable[[VirtualArray], np.ndarray],
             where: str) -> VirtualArray:
    """A coordinate of times in ``encoding`` as ``own`` holds them (``target``), inline."""
    if encoding is None or target is None or any(k in own.attrs for k in cf.PACKING_ATTRS):
        raise CombineError(f"{array.name}: {where} holds it as {target or 'no CF times'}, the "
                           f"file that would stand in for it as {encoding or 'no CF times'}: "
                           "it cannot be re-encoded exactly")
    try:
        values = retimed(read(array), encoding, target, own)
    except ValueError as e:
        raise CombineError(f"{array.name}: the times of the file that would stand in for "
                           f"{where} ({encoding[0]!r}) {e}") from e
    return inlined(own, values, pieces=False)


def comparable(coordinates: Sequence[VirtualArray], data: Sequence[np.ndarray],
               labels: Sequence[str], dim: str
               ) -> tuple[list[Values], Callable[[object], str]]:
    """Each file's values along ``dim`` (its ``coordinates``, read as ``data``; the files
    named by ``labels``) as they compare: raw where every file writes them in one set of
    units, else CF times decoded once per distinct units and calendar; and how a message
    shows one of them."""
    keys = [cf.time_encodings({dim: c.attrs}).get(dim) or ("", str(c.attrs.get("units")))
            for c in coordinates]
    out: list[Values] = list(data)
    kinds: set[str] = set()
    for key in dict.fromkeys(keys):
        members = [k for k, kk in enumerate(keys) if kk == key]
        if not key[0] or len(members) == len(keys):  # numbers, in one set of units (the
            kinds.add(f"numbers in {key[1]!r}")  # common case: no cftime date is made,
            continue  # which sort slowly)
        try:
            decoded = cf.decode_times(np.concatenate([data[k].reshape(-1) for k in members]),
                                      *key)
        except (ValueError, TypeError, OverflowError) as e:
            raise CombineError(f"cannot decode the times of {labels[members[0]]} "
                               f"({key[0]!r}, {key[1]!r}): {e}") from e
        if decoded.dtype.kind == "M":  # dates as dates, at one resolution
            decoded = decoded.astype("datetime64[us]")
            kinds.add("dates")
        else:
            kinds.add(f"dates of the {key[1]} calendar")
        pieces = np.split(decoded, np.cumsum([data[k].size for k in members])[:-1])
        for k, piece in zip(members, pieces, strict=True):
            out[k] = piece
    if len(kinds) > 1:
        raise CombineError(f"the values of {dim!r} do not compare between the files: they "
                           f"are {', '.join(sorted(kinds))}")
    only = keys[0] if len(set(keys)) == 1 and keys[0][0] else None

    def shown(value: object) -> str:
        if only is not None:  # (raw times: shown as the date they are)
            value = cf.decode_times(np.asarray([value]), *only)[0]
        if isinstance(value, np.datetime64):
            return str(np.datetime_as_string(value.astype("datetime64[us]"), unit="s"))
        return str(value)

    return out, shown


@dataclass(frozen=True)
class Join:
    """What :func:`outer_join` found: the files of others that stand in for each part
    (``(part, file)``), each part's first file by value (whose encoding a stand-in takes),
    and what the report says."""

    standing: list[list[tuple[int, int]]]
    firsts: list[int]
    report: list[ReportEntry]


def outer_join(parts: Sequence[Part], group: Callable[[int, int], VirtualGroup], dim: str,
               fill: bool, per_file: bool, read: Callable[[VirtualArray], np.ndarray]) -> Join:
    """:func:`standing` for ``parts``, whose file ``k`` of part ``p`` is ``group(p, k)``
    (read only where there are several parts, and not aligned where a file has no
    coordinate along ``dim``: the concat says what it makes of such a file)."""
    none = Join([[] for _ in parts], [0] * len(parts), [])
    if len(parts) < 2:
        return none
    coordinates = [[group(p, k).arrays.get(dim) for k in range(len(part.files))]
                   for p, part in enumerate(parts)]
    flat = [c for files in coordinates for c in files]
    if not all(c is not None and c.dims == (dim,) for c in flat):
        return none
    found, shown = comparable(cast("list[VirtualArray]", flat),
                       [read(cast(VirtualArray, c)) for c in flat],
                       [name for part in parts for name in part.files], dim)
    stops = np.cumsum([len(files) for files in coordinates])
    values = [found[stop - len(files):stop] for files, stop in
              zip(coordinates, stops, strict=True)]
    standing_, report = standing(parts, values, dim, fill, per_file, shown)
    firsts = [min((k for k, v in enumerate(files) if len(v)), key=lambda k: files[k].min(),
                  default=0) for files in values]
    return Join(standing_, firsts, report)


def part_name(stack_dim: str | None, value: object, files: Sequence[str]) -> str:
    """How messages name a part: its member, its file set, or both."""
    kept = f"file set of {files[0]}"
    return f"the {kept}" if stack_dim is None else f"{stack_dim}={value} ({kept})"


def _holder(values: Sequence[Sequence[Values]], value: object) -> tuple[int, int]:
    """The first file ``(part, file)`` that holds ``value``."""
    return next((q, k) for q, files in enumerate(values) for k, v in enumerate(files)
                if (v == value).any())
