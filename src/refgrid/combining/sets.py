"""Datasets side by side: merged (one variable per file set) or stacked along a new dimension.

**Merge** — CMIP-like archives keep one variable per file set (``tas_*.nc``, ``pr_*.nc``),
each with its own files and chunks along time. Each set is combined on its own, so each
variable keeps its own chunk grid, then the sets are merged as ``xr.merge`` of the combined
sets gives: a variable in several sets (the shared ``time``, ``lat``, bounds) must hold the
same values in each — dates compared as dates, whatever units each set wrote them in — or the
merge is refused naming the variable, the sets and the first difference; the first set's
copy is kept. Dimensions shared by sets must have one length.

**Stack** — ensemble members, runs, experiments: datasets of the same variables stacked
along a new leading dimension, whose coordinate holds each one's value (from a file-name
field or a global attribute, :mod:`.shaping`). Data variables gain the dimension; coordinates
(and bounds, grid mappings) must be identical across members and are kept once, as
``xr.concat(..., dim)`` of decoded datasets does with ``coords="different"``. A data
variable's chunks along its other dimensions must be the same in every member (a Zarr array
has one grid): members whose files split time differently are refused, naming them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from refgrid.combining.arrays import brief, with_leading_axis
from refgrid.combining.concat import Combine, attribute_conflicts
from refgrid.combining.shaping import value_coordinate
from refgrid.core import cf
from refgrid.core.dtypes import reader_attrs
from refgrid.core.names import Value
from refgrid.errors import CombineError
from refgrid.model.choose import coordinate_names
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup, same_value


def merged(groups: Sequence[VirtualGroup], labels: Sequence[str],
           storage_options: dict[str, object],
           fingerprint: Callable[[VirtualArray], str | None]) -> VirtualGroup:
    """The union of ``groups`` (combined file sets, named by ``labels``): see above."""
    report: list[ReportEntry] = []
    values: dict[int, np.ndarray] = {}

    def read(array: VirtualArray) -> np.ndarray:
        if id(array) not in values:
            from refgrid.read.array import read as read_array

            values[id(array)] = read_array(array, storage_options=storage_options)
        return values[id(array)]

    def node(held: list[tuple[VirtualGroup, str]], path: str) -> VirtualGroup:
        arrays: dict[str, VirtualArray] = {}
        names = list(dict.fromkeys(n for g, _ in held for n in g.arrays))
        # the units and calendar each set's times are read with (bounds take their
        # coordinate's where they have none of their own, as xarray reads them)
        times = [cf.time_encodings({n: a.attrs for n, a in g.arrays.items()}) for g, _ in held]
        taken: dict[str, cf.TimeEncoding | None] = {}
        for name in names:
            holders = [(g.arrays[name], lab, t.get(name)) for (g, lab), t in
                       zip(held, times, strict=True) if name in g.arrays]
            where = f"{path}{name}"
            first, first_label, first_time = holders[0]
            for other, lab, other_time in holders[1:]:
                difference = _difference(first, other, (first_time, other_time), read,
                                         fingerprint)
                if difference:
                    raise CombineError(f"{where}: differs between the file sets of "
                                       f"{first_label} and of {lab}: {difference}")
            report.extend(attribute_conflicts([h[0].attrs for h in holders],
                                              [h[1] for h in holders], where))
            arrays[name] = first
            taken[name] = first_time
        merged_times = cf.time_encodings({n: a.attrs for n, a in arrays.items()})
        for name, encoding in taken.items():  # bounds that read as times in their own set
            if encoding is not None and merged_times.get(name) != encoding:
                arrays[name] = replace(arrays[name], attrs={
                    **arrays[name].attrs, "units": encoding[0], "calendar": encoding[1]})
        children = {}
        for name in dict.fromkeys(n for g, _ in held for n in g.groups):
            children[name] = node([(g.groups[name], lab) for g, lab in held
                                   if name in g.groups], f"{path}{name}/")
        report.extend(attribute_conflicts([g.attrs for g, _ in held], [lab for _, lab in held],
                                          path or "/"))
        return VirtualGroup(held[0][0].attrs, arrays, children)

    root = node(list(zip(groups, labels, strict=True)), "")
    _one_length_per_dimension(root)
    scanned = tuple(e for g in groups for e in g.report)
    sources = {url: identity for g in groups for url, identity in g.sources.items()}
    return replace(root, report=(*scanned, *report), sources=sources)


def stacked(groups: Sequence[VirtualGroup], values: Sequence[Value], dim: str,
            labels: Sequence[str], job: Combine) -> VirtualGroup:
    """``groups`` (one per value, whose files ``labels`` count) stacked along the new
    dimension ``dim``: see above."""
    held = {d for g in groups for _, a in g.walk() if isinstance(a, VirtualArray)
            for d in a.dims}
    if dim in held:
        raise CombineError(f"cannot stack along {dim!r}: the files already have a dimension "
                           f"{dim!r}")
    try:  # (one group per value: files of one value are one member, combined along time)
        order = sorted(range(len(groups)), key=lambda k: values[k])  # type: ignore[arg-type,return-value,unused-ignore]
    except TypeError as e:
        raise CombineError(f"{dim}: its values are of several kinds ({e})") from e
    ordered = [_leading(groups[k], dim) for k in order]
    named = [f"{dim}={values[k]} ({labels[k]})" for k in order]
    job.lengths = dict.fromkeys(named, (1, 1))  # (a member lacking a variable: one step)
    try:
        root = job.group(ordered, named, "")
    except CombineError as e:
        raise CombineError(f"the groups stacked along {dim!r} do not agree: {e}") from e
    coordinate = value_coordinate(dim, [values[k] for k in order], dim)
    scanned = tuple(e for g in groups for e in g.report)
    sources = {url: identity for g in groups for url, identity in g.sources.items()}
    return replace(root, arrays={dim: coordinate, **root.arrays},
                   report=(*scanned, *job.report), sources=sources)


PACKED = ("scale_factor", "add_offset")
"""Attributes that make stored times other numbers than the dates' (compared unpacked only
where both sets pack them alike and write them in the same units)."""


def _leading(group: VirtualGroup, dim: str) -> VirtualGroup:
    """``group`` with its data variables given a leading ``dim`` of length 1."""
    coords = coordinate_names(group)
    return replace(group, arrays={n: a if n in coords else with_leading_axis(a, dim)
                                  for n, a in group.arrays.items()},
                   groups={n: _leading(g, dim) for n, g in group.groups.items()})


def _difference(a: VirtualArray, b: VirtualArray,
                times: tuple[cf.TimeEncoding | None, cf.TimeEncoding | None],
                read: Callable[[VirtualArray], np.ndarray],
                fingerprint: Callable[[VirtualArray], str | None]) -> str | None:
    """Why ``b`` does not hold ``a``'s values (None: it does); ``times``: the encodings
    their sets read them with, if times."""
    if a.dims != b.dims or a.shape != b.shape:
        return f"dimensions {dict(zip(a.dims, a.shape, strict=True))} vs " \
               f"{dict(zip(b.dims, b.shape, strict=True))}"
    retimed = times[0] is not None and times[1] is not None and times[0] != times[1]
    if retimed and any(name in x.attrs for x in (a, b) for name in PACKED):
        return "packed times in other units cannot be compared exactly"
    if not retimed:  # the same numbers mean the same only with the same meaning attributes
        for name in cf.MEANING_ATTRS:
            if not same_value(a.attrs.get(name), b.attrs.get(name)):
                return f"attribute {name} {brief(a.attrs.get(name))} vs " \
                       f"{brief(b.attrs.get(name))}"
        known = fingerprint(a)
        if (known is not None and fingerprint(b) == known) or (
                a.manifest == b.manifest and a.grid == b.grid and a.dtype == b.dtype):
            return None
    x, y = read(a), read(b)
    if retimed:  # dates compared as dates, whatever their units (gaps where gaps are)
        assert times[0] is not None and times[1] is not None
        mx, my = cf.stored_mask(x, reader_attrs(a.attrs)), cf.stored_mask(y, reader_attrs(b.attrs))
        dates = np.zeros(x.shape, dtype=object), np.zeros(y.shape, dtype=object)
        dates[0][~mx] = list(cf.decode_times(x[~mx], *times[0]))
        dates[1][~my] = list(cf.decode_times(y[~my], *times[1]))
        dates[0][mx], dates[1][my] = "fill", "fill"
        x, y = dates
    same = x == y if x.dtype.kind not in "fc" else (x == y) | (np.isnan(x) & np.isnan(y))
    if np.all(same):
        return None
    index = tuple(int(i) for i in np.argwhere(~np.asarray(same))[0])
    return f"at {dict(zip(a.dims, index, strict=True))}: {x[index]!r} vs {y[index]!r}"


def _one_length_per_dimension(group: VirtualGroup, prefix: str = "") -> None:
    """Arrays of one group share a dimension's length (a file's groups may each have a
    dimension of the same name)."""
    lengths: dict[str, tuple[int, str]] = {}
    for name, a in group.arrays.items():
        path = prefix + name
        for d, n in zip(a.dims, a.shape, strict=True):
            seen = lengths.setdefault(d, (n, path))
            if seen[0] != n:
                raise CombineError(f"the dimension {d!r} is {seen[0]} long in {seen[1]} but "
                                   f"{n} in {path}: the file sets do not cover the same "
                                   f"{d!r}")
    for name, child in group.groups.items():
        _one_length_per_dimension(child, f"{prefix}{name}/")
