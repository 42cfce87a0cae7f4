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

import numpy as np

from refgrid.combining.concat import fillable
from refgrid.core import cf
from refgrid.errors import CombineError
from refgrid.model.choose import coordinate_names
from refgrid.model.manifest import ChunkManifest
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup

Values = tuple[Hashable, ...]
"""One file's values along the concat dimension, as they compare (dates decoded)."""


@dataclass(frozen=True)
class Part:
    """One stacked member or merged file set: its name in messages and its files'."""

    name: str
    files: Sequence[str]
    kind: Hashable
    """What its files hold (a file set's data variables): files of the same kind stand in
    first, as their data variables' grids are the part's own."""


def standing(parts: Sequence[Part], values: Sequence[Sequence[Values | None]], dim: str,
             fill: bool) -> tuple[list[list[tuple[int, int]]], list[ReportEntry]]:
    """For each part, the files ``(part, file)`` of other parts that stand in for the values
    it lacks, and what the report says of them; ``values``: each part's files' (None: a
    file without a coordinate along ``dim``, which is not aligned)."""
    none: list[list[tuple[int, int]]] = [[] for _ in parts]
    if len(parts) < 2 or any(v is None for files in values for v in files):
        return none, []
    held = [{x for v in files for x in v or ()} for files in values]
    union = set().union(*held)
    if all(len(h) == len(union) for h in held):
        return none, []
    report: list[ReportEntry] = []
    for p, part in enumerate(parts):
        lacking = union - held[p]
        if not lacking:
            continue
        first = _first(lacking, dim)
        q, k = _holder(values, lacking)
        if not fill:
            raise CombineError(
                f"the parts do not agree along {dim!r}: {part.name} lacks {len(lacking)} of "
                f"the {len(union)} values the others hold (the first, {first}, is in "
                f"{parts[q].files[k]} of {parts[q].name}) — pass missing='fill' to join "
                "them as xarray's join='outer' does: the values a part lacks read as fill "
                "values there")
        order = sorted((q for q in range(len(parts)) if q != p),
                       key=lambda q: parts[q].kind != part.kind)
        left = set(lacking)
        for q in order:
            for k, v in enumerate(values[q]):
                if v and left.issuperset(v):
                    none[p].append((q, k))
                    left.difference_update(v)
        if left:
            first = _first(left, dim)
            q, k = _holder(values, left)
            raise CombineError(
                f"{part.name} lacks {dim} {first}, which {parts[q].files[k]} holds with "
                f"values {part.name} has: one array has one grid along {dim!r}, and a file "
                "that covers part of what another part lacks cannot stand in for it")
        sources = [parts[q].files[k] for q, k in none[p]]
        report.append(ReportEntry(sources[0], "", "filled", (
            f"{part.name} lacks {len(lacking)} of the {len(union)} values of {dim!r} the "
            f"others hold (from {_first(lacking, dim)}): {len(sources)} file(s) of others "
            f"({sources[0]}{' and more' if len(sources) > 1 else ''}) stand in with no chunk "
            "— its variables read as their fill values there (an outer join)")))
    return none, report


def stand_in(source: VirtualGroup, like: VirtualGroup, dim: str, where: str) -> VirtualGroup:
    """``source`` (another part's file) standing in for a part whose files are ``like``:
    its coordinates kept; the data variables along ``dim`` that ``like`` holds as ``like``
    stores them, on ``source``'s grid with none of its chunks; the rest left out (a data
    variable without ``dim`` is the part's own, which the concat takes from its files)."""
    coords = coordinate_names(source)
    arrays: dict[str, VirtualArray] = {}
    for name, a in source.arrays.items():
        if name in coords:
            arrays[name] = a
        elif name in like.arrays and dim in a.dims:  # (the part's own encoding, no chunk)
            own = like.arrays[name]
            if own.dims != a.dims:
                raise CombineError(f"{name}: dimensions {own.dims} in {where} but {a.dims} "
                                   "in the file of another part that would stand in for it")
            fillable(own, f"{where} lacks values of {dim!r} others hold", name)
            arrays[name] = replace(own, grid=a.grid, segments=None,
                                   manifest=ChunkManifest.empty(a.grid.chunk_counts))
    groups = {name: stand_in(g, like.groups[name], dim, where)
              for name, g in source.groups.items() if name in like.groups}
    return replace(source, arrays=arrays, groups=groups, report=())


def file_values(group: VirtualGroup, dim: str,
                read: Callable[[VirtualArray], np.ndarray]) -> Values | None:
    """A file's values along ``dim`` as they compare (None: it has no such coordinate)."""
    coordinate = group.arrays.get(dim)
    if coordinate is None or coordinate.dims != (dim,):
        return None
    data = read(coordinate)
    time = cf.time_encodings({dim: coordinate.attrs}).get(dim)
    if time is None:  # (numbers of one set of units compare)
        kind, found = str(coordinate.attrs.get("units")), data.tolist()
    else:
        decoded = cf.decode_times(data, *time)
        # dates as dates at one resolution; other calendars' (cftime) only in their own
        kind = "" if decoded.dtype.kind == "M" else time[1]
        found = decoded.astype("datetime64[us]").tolist() if not kind else decoded.tolist()
    return tuple((kind, x) for x in found)


def _first(values: set[Hashable], dim: str) -> object:
    """The least of ``values`` as a message shows it."""
    try:
        return min(values)[1]  # type: ignore[type-var,index]
    except TypeError as e:
        raise CombineError(f"the values of {dim!r} do not compare between the parts (their "
                           f"calendars or kinds differ): {e}") from e


def _holder(values: Sequence[Sequence[Values | None]], wanted: set[Hashable]
            ) -> tuple[int, int]:
    """The file ``(part, file)`` that holds the least of ``wanted``."""
    least = min(wanted)  # type: ignore[type-var]
    return next((q, k) for q, files in enumerate(values) for k, v in enumerate(files)
                if least in (v or ()))


def outer_join(parts: Sequence[Part], group: Callable[[int, int], VirtualGroup], dim: str,
               fill: bool, read: Callable[[VirtualArray], np.ndarray]
               ) -> tuple[list[list[tuple[int, int]]], list[ReportEntry]]:
    """:func:`standing` for ``parts``, whose file ``k`` of part ``p`` is ``group(p, k)``
    (read only where there are several parts)."""
    if len(parts) < 2:
        return [[] for _ in parts], []
    values = [[file_values(group(p, k), dim, read) for k in range(len(part.files))]
              for p, part in enumerate(parts)]
    return standing(parts, values, dim, fill)


def part_name(stack_dim: str | None, value: object, files: Sequence[str]) -> str:
    """How messages name a part: its member, its file set, or both."""
    kept = f"file set of {files[0]}"
    return f"the {kept}" if stack_dim is None else f"{stack_dim}={value} ({kept})"
