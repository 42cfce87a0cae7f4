"""Many files → one virtual dataset: :func:`combine` and :func:`merge`.

A combine runs in stages, each a module:

1. files are scanned (or given scanned) and **shaped** one by one (:mod:`.shaping`): the
   variables chosen, a time taken from the file name;
2. they are **partitioned**: by their value along a new dimension (``stack_by``), then — with
   ``merge=True`` — into file sets by the data variables they hold;
3. each part is **concatenated** along the concat dimension (:mod:`.concat`: ordering,
   irregular grids, times re-encoded, per-file meaning checked, absent variables filled);
4. the file sets are **merged** and the parts **stacked** (:mod:`.sets`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Literal, cast

import numpy as np

from refgrid.combining.concat import (
    Combine,
    concatenated,
    label_of,
    once_per_variable,
    some,
    with_inline_coordinates,
)
from refgrid.combining.shaping import data_variables
from refgrid.combining.spec import CombineSpec, Missing
from refgrid.core.inputs import expand_counting
from refgrid.core.names import Value
from refgrid.errors import ArgumentError, CombineError
from refgrid.model.choose import held_names, unknown_names
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup

Sources = Sequence[VirtualGroup | str | os.PathLike[str]] | str | os.PathLike[str]
"""What :func:`combine` takes: scanned groups, or what the CLI takes — paths, URLs, glob
patterns and ``@list`` files — scanned here."""


def combine(
    groups: Sources,
    concat_dim: str = "time",
    *,
    sources: Sequence[str] | None = None,
    overlap: Literal["error", "allow"] = "error",
    others: Literal["identical", "stack"] = "identical",
    codecs: Literal["segments", "recode", "error"] = "segments",
    missing: Missing = "error",
    variables: Sequence[str] | str | None = None,
    drop_variables: Sequence[str] | str | None = None,
    merge: bool = False,
    stack_dim: str | None = None,
    stack_by: str | None = None,
    time_from: str | None = None,
    time_units: str | None = None,
    calendar: str | None = None,
    storage_options: dict[str, object] | None = None,
    fingerprint: Callable[[VirtualArray], str | None] | None = None,
) -> VirtualGroup:
    """Concatenate files along ``concat_dim`` — and merge, stack and choose (see the
    module docstrings of :mod:`.concat` and :mod:`.sets`).

    ``groups``: groups :func:`refgrid.scan` made, or — as ``refgrid combine`` takes them —
    paths, URLs, glob patterns (``"data/tas_*.nc"``) and ``@list`` files, which are
    expanded and scanned with ``storage_options``; a file named twice is combined once, and
    said so in the report. ``sources`` names the files in messages (default: the first URL
    each group references) and is what ``stack_by`` and ``time_from`` patterns read.

    Choosing, before anything is compared: ``variables`` keeps these variables (paths such
    as ``"sub/tas"``) and what they are read with (their dimensions' coordinates, bounds,
    auxiliary coordinates, grid mappings); ``drop_variables`` leaves these out. A name no
    file holds is an error.

    ``missing="fill"``: a variable (or group) absent from some files reads as its fill value
    there — no bytes are written: its chunks there are missing — and the report names those
    files; it needs a ``_FillValue`` (else a reader could not tell fill from data). So do
    stacked members and merged file sets that cover other values along ``concat_dim``:
    joined as xarray's ``join="outer"`` joins them, the whole files of others standing in
    with no chunk where a part has none (:mod:`.coverage`). Default ``"error"``: such files
    and parts are refused, naming them.

    ``merge=True``: files are grouped into file sets by the data variables they hold (one
    variable per set, as CMIP archives keep them), each set combined with its own chunk grid,
    and the sets merged (:func:`merge`).

    ``stack_dim``/``stack_by``: stack the files along a new leading dimension, each file's
    value taken from its name — a pattern such as ``"{member}/tas_*.nc"`` (text),
    ``"run{run:d}.nc"`` (integers) or ``"exp_%Y%m.nc"`` (dates) — or from a global
    attribute, ``"attribute:realization"``. Files of one value are combined along
    ``concat_dim``; the values must then agree on everything but their data variables.

    ``time_from``: files without a coordinate along ``concat_dim`` take it from their name,
    ``"sst_%Y%m%d.nc"``, in ``time_units`` (default days since 1970-01-01, seconds where the
    pattern reads times of day) and ``calendar`` (default standard: the name's date is the
    calendar's); a file's own time — scalar, or a coordinate — is kept, and must fall in the
    period its name gives (the same year, month, day... as the pattern reads: noon of the
    day ``sst_20030102.nc`` names agrees), else a :class:`~refgrid.CombineError` names the
    file and both. Data variables of files without the dimension gain it.

    ``overlap="allow"`` keeps files whose coordinate ranges overlap. ``others="stack"``
    keeps variables without the concat dimension per file along a new leading ``file``
    dimension. Files that store a variable in other ways — its type (float64 among
    float32), byte order, codecs, packing (``scale_factor``/``add_offset`` per file) or fill
    markers — join in *segments* (``codecs="segments"``): each file's chunks are decoded by
    its own encoding and shown as xarray's ``open_mfdataset`` shows them, no data copied
    (``docs/segments.md``; the report says so per variable). ``codecs="recode"`` instead
    re-encodes the chunks of files whose codecs differ with the first file's and inlines
    them — data is copied, and each such variable is reported; ``codecs="error"`` refuses
    any such difference. ``storage_options`` reach
    the source files, which are read for the concat coordinate, for times to re-encode and
    to compare variables without the concat dimension. ``fingerprint`` gives a digest of an
    array's values where one is known without reading (batch workers compute them where
    they scan): arrays whose digests are equal are identical and are not read.
    """
    spec = CombineSpec.of(concat_dim, overlap=overlap, others=others, codecs=codecs,
                          missing=missing, merge=merge, variables=variables,
                          drop_variables=drop_variables, stack_dim=stack_dim,
                          stack_by=stack_by, time_from=time_from, time_units=time_units,
                          calendar=calendar)
    return combine_with(groups, spec, sources=sources, storage_options=storage_options,
                        fingerprint=fingerprint)


def combine_with(groups: Sources, spec: CombineSpec, *, sources: Sequence[str] | None = None,
                 storage_options: dict[str, object] | None = None,
                 fingerprint: Callable[[VirtualArray], str | None] | None = None
                 ) -> VirtualGroup:
    """:func:`combine`, its settings one :class:`CombineSpec` (what the CLI and
    ``serve --follow`` make)."""
    shape = spec.shape
    scanned, named, report = _scanned(groups, storage_options, shape.drop_variables)
    if not scanned:
        raise CombineError("nothing to combine: no groups given")
    labels = list(sources) if sources is not None else named or [
        label_of(g, k) for k, g in enumerate(scanned)]
    if len(labels) != len(scanned):
        raise CombineError(f"{len(labels)} source names for {len(scanned)} groups")
    _check_chosen(spec, scanned)
    shaped = [shape.shaped(g, lab, spec.concat_dim, storage_options)
              for g, lab in zip(scanned, labels, strict=True)]
    read: dict[int, np.ndarray] = {}  # (the coordinates a join reads, read once)
    parts, joins = _joined(partition(shaped, labels, spec), spec, storage_options, read)
    results, values, named_parts = [], [], []
    for value, sets in parts.items():
        combined = [concatenated(members, names, spec, storage_options=storage_options,
                                 fingerprint=fingerprint, values=_theirs(members, read))
                    for members, names in sets]
        set_labels = [_files(names) for _, names in sets]
        results.append(combined[0] if len(combined) == 1 else
                       merged_sets(combined, set_labels, storage_options, fingerprint))
        values.append(value)
        named_parts.append(f"{sum(len(names) for _, names in sets)} files")
    root = results[0] if spec.stack_dim is None else stack(  # (stacking: every part valued)
        results, cast("list[Value]", values), named_parts, spec,
        storage_options=storage_options, fingerprint=fingerprint)
    return replace(root, report=once_per_variable((*report, *joins, *root.report)))


def _joined(parts: Parts, spec: CombineSpec, storage_options: dict[str, object] | None,
            values: dict[int, np.ndarray]) -> tuple[Parts, list[ReportEntry]]:
    """``parts`` with the files of others that stand in where a part lacks values along the
    concat dimension (:mod:`.coverage`), and what the report says of them; the coordinates
    read are kept in ``values`` (by ``id``) for the concat."""
    from refgrid.combining.coverage import Part, outer_join, part_name, stand_in
    from refgrid.read.array import read

    def kept(array: VirtualArray) -> np.ndarray:
        if id(array) not in values:
            values[id(array)] = read(array, storage_options=storage_options)
        return values[id(array)]

    listed = [(value, members, names) for value, sets in parts.items()
              for members, names in sets]
    described = [Part(part_name(spec.stack_dim, value, names), names,
                      data_variables(members[0], spec.concat_dim))
                 for value, members, names in listed]
    join = outer_join(described, lambda p, k: listed[p][1][k], spec.concat_dim,
                      spec.missing == "fill", spec.others == "stack", kept)
    out: Parts = {}
    for (value, members, names), part, stand, first in zip(
            listed, described, join.standing, join.firsts, strict=True):
        out.setdefault(value, []).append((
            [*members, *(stand_in(listed[q][1][k], members[first], spec.concat_dim,
                                  part.name, kept) for q, k in stand)],
            [*names, *(listed[q][2][k] for q, k in stand)]))
    return out, join.report


def _theirs(members: Sequence[VirtualGroup], values: dict[int, np.ndarray]
            ) -> dict[int, np.ndarray]:
    """The values read of ``members``' own arrays (a part's concat keeps what it reads by
    ``id``: only arrays alive throughout are handed over, never another part's)."""
    return {id(a): values[id(a)] for g in members for a in g.arrays.values()
            if id(a) in values}


def merge(groups: Sequence[VirtualGroup], *, sources: Sequence[str] | None = None,
          storage_options: dict[str, object] | None = None) -> VirtualGroup:
    """Datasets (each :func:`combine`'s result for one file set, say ``tas`` and ``pr``)
    side by side, as ``xr.merge`` gives: each variable keeps its own chunk grid; a variable
    in several datasets (the shared ``time``, ``lat``) must hold the same values in each
    (dates compared as dates) or the merge is refused naming it, the datasets and the first
    difference. ``sources`` names the datasets in messages."""
    if not groups or not all(isinstance(g, VirtualGroup) for g in groups):
        raise ArgumentError("merge takes the groups refgrid.combine or refgrid.scan made")
    labels = list(sources) if sources is not None else [
        label_of(g, k) for k, g in enumerate(groups)]
    if len(labels) != len(groups):
        raise ArgumentError(f"{len(labels)} names for {len(groups)} groups")
    return merged_sets(list(groups), labels, storage_options, None)


def merged_sets(groups: list[VirtualGroup], labels: list[str],
                storage_options: dict[str, object] | None,
                fingerprint: Callable[[VirtualArray], str | None] | None) -> VirtualGroup:
    from refgrid.combining.sets import merged

    return merged(groups, labels, storage_options or {}, fingerprint or (lambda a: None))


def stack(groups: list[VirtualGroup], values: list[Value], labels: list[str],
          spec: CombineSpec, *, storage_options: dict[str, object] | None = None,
          fingerprint: Callable[[VirtualArray], str | None] | None = None) -> VirtualGroup:
    """Combined datasets, one per value, stacked along ``spec``'s new dimension (its
    members' coordinates must agree: no overlap, no per-member copies)."""
    from refgrid.combining.sets import stacked

    dim = spec.stack_dim
    assert dim is not None  # (a spec that stacks)
    job = Combine(CombineSpec(dim, codecs=spec.codecs, missing=spec.missing),
                  storage_options or {}, fingerprint or (lambda a: None), stacking=True)
    return stacked(groups, values, dim, labels, job)


Parts = dict[Value | None, list[tuple[list[VirtualGroup], list[str]]]]
"""Files partitioned: by stack value (None: no stacking), then into file sets."""


def partition(groups: Sequence[VirtualGroup], labels: Sequence[str],
              spec: CombineSpec) -> Parts:
    """``groups`` by their value along the stacking dimension (in order of appearance),
    then — merging — into file sets by the data variables they hold."""
    parts: dict[Value | None, dict[frozenset[str], tuple[list[VirtualGroup], list[str]]]] = {}
    for g, lab in zip(groups, labels, strict=True):
        value = spec.shape.stack_value(g, lab) if spec.stack_dim is not None else None
        key = data_variables(g, spec.concat_dim) if spec.merge else frozenset()
        members, names = parts.setdefault(value, {}).setdefault(key, ([], []))
        members.append(g)
        names.append(lab)
    return {value: list(sets.values()) for value, sets in parts.items()}


def _check_chosen(spec: CombineSpec, groups: Sequence[VirtualGroup]) -> None:
    """A chosen name that none of the files holds is a typo, not a choice."""
    named = [*(spec.shape.variables or ()), *spec.shape.drop_variables]
    if not named:
        return
    held: set[str] = set()
    for g in groups:
        held |= held_names(g)
    unknown = unknown_names(named, held)
    if unknown:
        raise ArgumentError(f"no file holds {', '.join(map(repr, unknown))} (they hold: "
                            f"{', '.join(sorted(held)) or 'nothing'})")


def _files(labels: Sequence[str]) -> str:
    return labels[0] if len(labels) == 1 else f"{labels[0]} and {len(labels) - 1} more"


def _scanned(items: Sources, storage_options: dict[str, object] | None,
             dropped: tuple[str, ...]) -> tuple[list[VirtualGroup], list[str] | None,
                                                list[ReportEntry]]:
    """The groups to combine (files scanned with the ``dropped`` variables left unscanned),
    their names (None: groups as given), and the report of files named more than once."""
    from refgrid.scanners import ScanOptions, scan_with

    listed = [items] if isinstance(items, str | os.PathLike) else list(items)
    groups = [x for x in listed if isinstance(x, VirtualGroup)]
    paths = [os.fspath(x) for x in listed if isinstance(x, str | os.PathLike)]
    if len(groups) == len(listed):
        return groups, None, []
    if len(paths) != len(listed):
        kinds = sorted({type(x).__name__ for x in listed})
        raise ArgumentError(f"combine takes the groups refgrid.scan made, or paths, URLs and "
                            f"glob patterns (as refgrid combine does) — not a mix of "
                            f"{', '.join(kinds)}")
    found, twice = expand_counting(paths, storage_options)
    report = [ReportEntry(url, "", "duplicate", f"named {n} times: combined once")
              for url, n in twice.items()]
    return [scan_with(url, ScanOptions(dropped=dropped), None, storage_options or {})
            for url in found], list(found), report


__all__ = ["CombineSpec", "combine", "combine_with", "merge", "some",
           "with_inline_coordinates"]
