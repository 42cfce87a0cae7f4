"""Many files → one virtual dataset, concatenated along a dimension of irregular length.

Files are ordered by the first value of their concat coordinate (decoded, so files with
different time units order correctly; highest first where every file's values fall, as
xarray orders them), checked for overlaps, and joined variable by variable:
the result's grid along the concat dimension is every file's logical chunk lengths in turn
(rectilinear), with the encoded lengths kept where a file's last chunk is stored padded.

Policies, all reported rather than silent:
- the concat coordinate is read, re-encoded to the first file's units, and inlined as one
  chunk; so is every other variable along the concat dimension whose values are CF times
  (the coordinate's ``bounds`` and ``climatology``, ``forecast_reference_time``...) where
  files encode them differently (:mod:`refgrid.core.cf`); a change of calendar, or values the
  first file's type cannot hold exactly in its units, is refused naming the variable and files;
- variables without the concat dimension are taken from the first file after checking they
  are identical in every file — times compared as dates, not as numbers — (``others="stack"``
  keeps them per file along a new leading dimension ``file`` instead);
- every other attribute that changes what a stored number means (units, calendars, valid
  ranges: :data:`refgrid.core.cf.MEANING_ATTRS`, values and types) must agree across files,
  or the combine is refused — so must packing and fill markers where segments are not
  made (variables without the dimension, ``codecs="error"``/``"recode"``); where values
  are read and written anew (the concat coordinate), fill markers agree when they mark the
  same values;
- other attributes are the first file's; differing values in other files are recorded in
  ``VirtualGroup.report`` (action ``attribute-conflict``);
- files that store a variable along the dimension in other ways (type, byte order, codecs,
  packing, fill markers) join in segments, each decoded by its own encoding
  (:mod:`refgrid.model.segments`, reported); with ``codecs="recode"`` files whose codecs
  differ are re-encoded to the first file's codecs and inlined (reported: the data is
  copied); with ``codecs="error"`` any such difference is refused.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from refgrid.codecs.filters import CodecJSON
from refgrid.combining.arrays import brief, inlined, with_leading_axis
from refgrid.combining.spec import CombineSpec
from refgrid.core import cf
from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR, ENCODING_ATTR, reader_attrs
from refgrid.core.typed import Attributes, Untyped
from refgrid.errors import CombineError, RefgridError
from refgrid.grid.rectilinear import AxisChunks, RectilinearGrid
from refgrid.model.manifest import MISSING, ChunkManifest, ManifestBuilder
from refgrid.model.presented import joined
from refgrid.model.segments import Encoding
from refgrid.model.virtual import (
    ReportEntry,
    VirtualArray,
    VirtualGroup,
    same_value,
)
from refgrid.model.zarr_json import DIMENSION_NAMES_ATTR

Times = list[cf.TimeEncoding | None]
"""Each file's time encoding of one variable (None: its values are not CF times there)."""
INLINE_TIMES_LIMIT = 2**22
"""Bytes of one file's time variable a batch worker inlines into its record (so combining the
records re-encodes them without opening the sources); larger ones stay references."""
LEVEL_KEYS = frozenset({"level", "clevel", "complevel"})
"""Codec settings that change how data was compressed, not how it decodes."""


def concatenated(groups: Sequence[VirtualGroup], labels: Sequence[str], spec: CombineSpec, *,
                 storage_options: dict[str, object] | None = None,
                 fingerprint: Callable[[VirtualArray], str | None] | None = None,
                 values: dict[int, np.ndarray] | None = None) -> VirtualGroup:
    """Files (scanned, named by ``labels``) joined along ``spec.concat_dim`` with its
    policies: see the module docstring and :func:`refgrid.combine`, which shapes and
    partitions files first. ``values``: arrays already read, by ``id`` (the coordinates
    an outer join of parts read)."""
    concat_dim = spec.concat_dim
    if not groups:
        raise CombineError("nothing to combine: no groups given")
    held = [k for k, g in enumerate(groups) if g.arrays or any(
        isinstance(node, VirtualArray) for _, node in g.walk())]
    skipped = [] if len(held) == len(groups) else [
        ReportEntry(labels[k], "", "skipped", "holds none of the chosen variables")
        for k in sorted(set(range(len(groups))) - set(held))]
    if skipped:  # (a file of another file set, where variables are chosen)
        if not held:
            return replace(groups[0], report=tuple(skipped), sources={})
        groups, labels = [groups[k] for k in held], [labels[k] for k in held]
    dims = {d for g in groups for _, node in g.walk() if isinstance(node, VirtualArray)
            for d in node.dims}
    if concat_dim not in dims:
        raise CombineError(f"no variable in any of the {len(groups)} files has the dimension "
                           f"{concat_dim!r} to combine along (dimensions: "
                           f"{', '.join(sorted(dims)) or 'none'})")
    job = Combine(spec, storage_options or {}, fingerprint or _unknown)
    job.values = values if values is not None else job.values
    if spec.missing == "fill":
        job.lengths = {lab: _extent(g, concat_dim) for g, lab in zip(groups, labels,
                                                                     strict=True)}
    root = job.group(list(groups), list(labels), "")
    scanned = tuple(entry for g in groups for entry in g.report)
    identities = {url: identity for g in groups for url, identity in g.sources.items()}
    return replace(root, report=once_per_variable((*skipped, *scanned, *job.report)),
                   sources=identities)


def _extent(group: VirtualGroup, dim: str) -> tuple[int, int]:
    """A file's length along ``dim`` and the chunk length a variable it lacks takes there:
    its first data variable's along ``dim`` (its coordinate's where it has no other), so
    the file decides it, not which file held the variable first — a batch that appends
    the file fills it as a whole batch does."""
    along = [node for _, node in group.walk() if isinstance(node, VirtualArray)
             and dim in node.dims]
    if not along:
        return 0, 1
    first = next((a for a in along if a.name != dim), along[0])
    axis = first.axis(dim)
    length = first.shape[axis]
    return length, int(first.grid.lengths(axis)[0]) if length else 1


def with_inline_coordinates(group: VirtualGroup, concat_dim: str,
                            storage_options: dict[str, object] | None = None) -> VirtualGroup:
    """``group`` with each ``concat_dim`` coordinate read and inlined as :func:`combine`
    stores it, and so every other variable along ``concat_dim`` whose values are CF times
    (up to :data:`INLINE_TIMES_LIMIT` bytes): batch workers do this where they scan, so that
    combining their records — re-encoding times to one file's units — reads no source."""
    job = Combine(CombineSpec(concat_dim), storage_options or {}, _unknown, pieces=False)
    url = label_of(group, 0)

    def inline(g: VirtualGroup, path: str) -> VirtualGroup:
        times = cf.time_encodings({name: a.attrs for name, a in g.arrays.items()})
        arrays = {}
        for name, a in g.arrays.items():
            if a.dims == (concat_dim,) and a.name == concat_dim:
                a = job.coordinate([a], [url], _where(path, name), [times.get(name)])
            elif concat_dim in a.dims and name in times and \
                    math.prod(a.shape) * a.dtype.itemsize <= INLINE_TIMES_LIMIT:
                a = job.inlined(a, job.read(a))
            arrays[name] = a
        groups = {name: inline(child, _where(path, name)) for name, child in g.groups.items()}
        return replace(g, arrays=arrays, groups=groups)

    return inline(group, "")


def _unknown(array: VirtualArray) -> None:
    return None


SAID_ONCE = frozenset({"from-name", "own-time"})
"""What shaping does to each file alike, reported by each file and said once in a combine's
report (by its first file: the entry says what is done to every file of its kind)."""


def once_per_variable(entries: tuple[ReportEntry, ...]) -> tuple[ReportEntry, ...]:
    """The report with one re-encoding entry per variable — a batch combines slices of
    files, then the slices, and each level may re-encode (the outermost level's entry is
    kept) — and one entry per variable of each kind :data:`SAID_ONCE` names."""
    last = {e.variable: e for e in entries if e.action == "re-encoded"}
    first: dict[tuple[str, str], ReportEntry] = {}
    for e in entries:
        if e.action in SAID_ONCE:
            first.setdefault((e.variable, e.action), e)
    return tuple(e for e in entries if (e.action != "re-encoded" or last[e.variable] is e)
                 and (e.action not in SAID_ONCE or first[e.variable, e.action] is e))


class Combine:
    def __init__(self, spec: CombineSpec, storage_options: dict[str, object],
                 fingerprint: Callable[[VirtualArray], str | None], *, pieces: bool = True,
                 stacking: bool = False) -> None:
        self.dim, self.overlap, self.others = spec.concat_dim, spec.overlap, spec.others
        self.recode, self.fill = spec.codecs == "recode", spec.missing == "fill"
        self.segmenting = spec.codecs == "segments"
        self.stacking = stacking
        """Whether the groups are members stacked along a new dimension (whose coordinates
        must agree: no per-file copies)."""
        self.lengths: dict[str, tuple[int, int]] = {}
        """Each file's length along the dimension and the chunk length there (by label):
        what a variable absent from it spans there (``missing="fill"``)."""
        self.storage_options = storage_options
        self.fingerprint = fingerprint
        self.pieces = pieces
        """Whether what is inlined is stored in pieces (a combined archive) or as one chunk
        (a file's own, as a batch worker records it: its variables must combine as the
        file's chunks do, not look like an archive's coordinate in pieces)."""
        self.report: list[ReportEntry] = []
        self.values: dict[int, np.ndarray] = {}

    def inlined(self, like: VirtualArray, data: np.ndarray) -> VirtualArray:
        return inlined(like, data, pieces=self.pieces)

    def read(self, array: VirtualArray) -> np.ndarray:
        """An array's values, read once per combine (coordinates serve ordering and output)."""
        key = id(array)
        if key not in self.values:
            from refgrid.read.array import read

            self.values[key] = read(array, storage_options=self.storage_options)
        return self.values[key]

    def group(self, groups: list[VirtualGroup], labels: list[str], path: str) -> VirtualGroup:
        order = self._order(groups, labels, path)
        groups = [groups[k] for k in order]
        labels = [labels[k] for k in order]
        names = _all_names(groups, "arrays")
        missing = {n: [lab for g, lab in zip(groups, labels, strict=True) if n not in g.arrays]
                   for n in names}
        missing = {n: files for n, files in missing.items() if files}
        if missing and (not self.fill or self.dim in missing):
            detail = "; ".join(f"{_where(path, n)} missing from {some(f)}"
                               for n, f in sorted(missing.items()))
            hint = "" if self.fill else " (pass missing='fill' to read them as their fill " \
                "value in the files without them)"
            raise CombineError(f"variables are not in every file: {detail}{hint}")
        if missing:
            templates = {n: next(g.arrays[n] for g in groups if n in g.arrays) for n in missing}
            groups = [self.completed(g, lab, path, templates) for g, lab in zip(groups, labels,
                                                                                strict=True)]
            for n, files in missing.items():
                there = "read as its fill value there" if self.dim in templates[n].dims else \
                    f"taken from the files that hold it (it has no {self.dim!r} dimension)"
                self.report.append(ReportEntry(files[0], _where(path, n), "filled", (
                    f"absent from {len(files)} file(s) ({some(files)}): {there}")))
        encodings = [cf.time_encodings({n: a.attrs for n, a in g.arrays.items()})
                     for g in groups]
        arrays = {}
        for name in names:
            parts = [g.arrays[name] for g in groups]
            times = [found.get(name) for found in encodings]
            arrays[name] = self.array(parts, labels, _where(path, name), times)
        child_names = _all_names(groups, "groups")
        absent = {n: [lab for g, lab in zip(groups, labels, strict=True) if n not in g.groups]
                  for n in child_names}
        if any(absent.values()) and not self.fill:
            detail = "; ".join(f"group {_where(path, n)} missing from {some(f)}"
                               for n, f in absent.items() if f)
            raise CombineError(f"groups are not in every file: {detail} (pass "
                               "missing='fill' to read their variables as their fill values "
                               "in the files without them)")
        for n, files in absent.items():
            if files:
                template = next(g.groups[n] for g in groups if n in g.groups)
                groups = [g if n in g.groups else replace(g, groups={
                    **g.groups, n: self.absent_group(template, lab, _where(path, n))})
                    for g, lab in zip(groups, labels, strict=True)]
                self.report.append(ReportEntry(files[0], _where(path, n), "filled", (
                    f"group absent from {len(files)} file(s) ({some(files)}): its variables "
                    "read as their fill values there")))
        children = {n: self.group([g.groups[n] for g in groups], labels, _where(path, n))
                    for n in child_names}
        attrs = self.attributes([g.attrs for g in groups], labels, path or "/")
        return VirtualGroup(attrs, arrays, children)

    def completed(self, group: VirtualGroup, label: str, path: str,
                  templates: dict[str, VirtualArray]) -> VirtualGroup:
        """``group`` with each variable of ``templates`` it lacks stood in for
        (``missing="fill"``)."""
        lacking = [n for n in templates if n not in group.arrays]
        if not lacking:
            return group
        arrays = dict(group.arrays)
        for n in lacking:
            arrays[n] = self.absent(templates[n], label, _where(path, n))
        return replace(group, arrays=arrays)

    def absent(self, template: VirtualArray, label: str, where: str) -> VirtualArray:
        """What stands in for a variable a file lacks: along the dimension, ``template``
        with no chunk stored over the file's length (read as the fill value: no bytes are
        written or copied); without it, ``template`` itself (kept from the files that have
        it, which must agree)."""
        if self.dim not in template.dims:
            return template
        fillable(template, f"absent from {label}", where)
        axis = template.axis(self.dim)
        length, step = self.lengths.get(label, (0, 1))
        steps = np.full(length // step, step, dtype=np.int64)
        if length % step:
            steps = np.append(steps, length % step)
        axes = list(template.grid.axes)
        axes[axis] = AxisChunks(steps, steps.copy())
        grid = RectilinearGrid(tuple(axes))
        return replace(template, grid=grid, manifest=ChunkManifest.empty(grid.chunk_counts),
                       segments=None)  # (a combined part's: read as its fill as shown)

    def absent_group(self, template: VirtualGroup, label: str, path: str) -> VirtualGroup:
        return VirtualGroup(template.attrs, {
            n: self.absent(a, label, _where(path, n)) for n, a in template.arrays.items()}, {
            n: self.absent_group(g, label, _where(path, n)) for n, g in template.groups.items()})

    # -- ordering and the concat coordinate ----------------------------------------------

    def _order(self, groups: list[VirtualGroup], labels: list[str], path: str) -> list[int]:
        if any(self.dim not in g.arrays for g in groups):
            return list(range(len(groups)))  # no coordinate: keep the given order
        coords = [g.arrays[self.dim] for g in groups]
        _one_calendar([cf.time_encodings({self.dim: c.attrs}).get(self.dim) for c in coords],
                      labels, _where(path, self.dim))
        bounds = _bounds([self.read(c) for c in coords], coords)  # (first, last) instants
        empty = [k for k, b in enumerate(bounds) if b is None]
        filled = sorted((k for k, b in enumerate(bounds) if b is not None),
                        key=lambda k: bounds[k][0])
        falling = [k for k in filled if bounds[k][0] > bounds[k][1]]
        if falling:  # files whose values decrease: the highest first, as xarray orders them
            rising = [k for k in filled if bounds[k][0] < bounds[k][1]]
            if rising:
                raise CombineError(
                    f"{_where(path, self.dim)}: its values increase in {labels[rising[0]]} "
                    f"but decrease in {labels[falling[0]]}: one coordinate cannot run both "
                    "ways")
            filled.reverse()
        if self.overlap == "error":
            for a, b in itertools.pairwise(filled):
                if bounds[a][1] >= bounds[b][0] if not falling else \
                        bounds[a][1] <= bounds[b][0]:
                    raise CombineError(
                        f"{_where(path, self.dim)}: {labels[a]} ends at {bounds[a][1]} "
                        f"but {labels[b]} starts at {bounds[b][0]}: the files overlap or "
                        "repeat values (pass overlap='allow' to keep both)")
        return filled + empty

    def coordinate(self, parts: list[VirtualArray], labels: list[str], where: str,
                   times: Times) -> VirtualArray:
        """The concat coordinate, read, re-encoded to the first file's units, inlined."""
        self.check(parts, labels, where, times, reread=True)
        if all(t is not None for t in times):
            return self.inlined(parts[0], self.times(parts, labels, where, times))
        units = [p.attrs.get("units") for p in parts]
        if any(t is not None for t in times) or any(u != units[0] for u in units):
            odd = [lab for lab, u in zip(labels, units, strict=True) if u != units[0]]
            raise CombineError(f"{where}: units differ ({', '.join(odd)} vs {labels[0]}) "
                               "and are not CF time units that can be re-encoded")
        data = np.concatenate([self.read(p) for p in parts])
        return self.inlined(parts[0], _exactly(data, parts, labels, where))

    def times(self, parts: list[VirtualArray], labels: list[str], where: str,
              times: Times) -> np.ndarray:
        """The values of a time variable along the concat dimension, every file's in the
        first file's units and type: one decode and encode per distinct units (10^5 files
        in two kinds of units are two re-encodings, not 10^5)."""
        target = times[0]
        untimed = [lab for t, lab in zip(times, labels, strict=True) if t is None]
        if target is None or untimed:
            timed = [lab for t, lab in zip(times, labels, strict=True) if t is not None]
            raise CombineError(f"{where}: holds CF times in {some(timed)} but not in "
                               f"{some(untimed)}: a Zarr array has one encoding")
        _one_calendar(times, labels, where)
        first = parts[0]
        kinds: dict[cf.TimeEncoding, list[int]] = {}
        for k, t in enumerate(times):
            kinds.setdefault(t, []).append(k)  # type: ignore[arg-type]
        values = [self.read(p) for p in parts]
        if len(kinds) > 1:
            packed = [a for a in ("scale_factor", "add_offset") if a in first.attrs]
            if packed:
                others = [labels[m[0]] for t, m in kinds.items() if t != target]
                raise CombineError(f"{where}: packed times ({', '.join(packed)}) in other "
                                   f"units in {some(others)} cannot be re-encoded exactly")
        out = list(values)
        moved: list[str] = []
        for encoding, members in kinds.items():
            if encoding == target:
                continue
            moved.append(labels[members[0]])
            joined = np.concatenate([values[k].reshape(-1) for k in members])
            try:
                encoded = retimed(joined, encoding, target, first)
            except ValueError:  # name the very file whose times do not fit
                for k in members:
                    try:
                        retimed(values[k].reshape(-1), encoding, target, first)
                    except ValueError as e:
                        raise CombineError(f"{where}: the times of {labels[k]} "
                                           f"({encoding[0]!r}) {e}") from e
                raise
            pieces = np.split(encoded, np.cumsum([values[k].size for k in members])[:-1])
            for k, piece in zip(members, pieces, strict=True):
                out[k] = piece.reshape(values[k].shape)
        if moved:
            example = next(t for t in times if t is not None and t != target)
            self.report.append(ReportEntry(moved[0], where, "re-encoded", (
                f"times in other units than {labels[0]}'s ({example[0]!r} in {moved[0]}"
                f"{' and others' if len(kinds) > 2 else ''}) re-encoded to {target[0]!r} "
                f"({target[1]}) and inlined")))
        data = np.concatenate(out, axis=first.axis(self.dim))
        return _exactly(data, parts, labels, where)

    # -- variables ------------------------------------------------------------------------

    def array(self, parts: list[VirtualArray], labels: list[str], where: str,
              times: Times) -> VirtualArray:
        first = parts[0]
        timed = any(t is not None for t in times)
        alike = self.segmented(parts, times)
        attrs = self.attributes([p.attrs for p in parts], labels, where, skip=(
            TIME_ATTRS if timed else ()) + (tuple(cf.PACKING_ATTRS) if alike else ()))
        if alike:
            return self.segments(parts, alike, labels, where, times, attrs)
        if self.dim not in first.dims:
            kept = self.constant(parts, labels, where, times)
            if DIMENSION_NAMES_ATTR in kept.attrs:  # stacked: a dimension more
                attrs[DIMENSION_NAMES_ATTR] = kept.attrs[DIMENSION_NAMES_ATTR]
            return replace(kept, attrs=attrs)
        if first.dims == (self.dim,) and first.name == self.dim:
            return replace(self.coordinate(parts, labels, where, times), attrs=attrs)
        if timed and any(t != times[0] or _stored_differently(p, first)
                         for t, p in zip(times, parts, strict=True)):
            self.check(parts, labels, where, times, reread=True)
            return replace(self.inlined(first, self.times(parts, labels, where, times)),
                           attrs=attrs)
        self.check(parts, labels, where, times)
        if self.recode:
            parts = [self.recoded(p, first, lab, where) for p, lab in zip(parts, labels,
                                                                             strict=True)]
        fill = _read_fill(parts)
        aligned = [replace(p, codecs=first.codecs, attrs=first.attrs, fill_value=fill)
                   for p in parts]
        try:
            joined = VirtualArray.concat(aligned, self.dim)
        except RefgridError as e:
            raise CombineError(f"{where}: {e}") from e
        return replace(joined, attrs=attrs)

    def segmented(self, parts: list[VirtualArray], times: Times) -> list[VirtualArray] | None:
        """``parts`` as they join in segments (:mod:`refgrid.model.segments`: a storage
        fill nothing reads and a compression level alone aligned with the first file's),
        where they do: a variable along the dimension (not its coordinate, nor times
        re-encoded), of numbers, that files store or pack in other ways — as
        ``codecs="segments"`` (the default) asks. None where they do not."""
        first = parts[0]
        if not self.segmenting or self.dim not in first.dims or first.name == self.dim or any(
                t is not None for t in times) or not all(
                p.dtype.kind in "iuf" and p.dtype.fields is None for p in parts):
            return None
        fill, decoding = _read_fill(parts), _decoding(first.codecs)
        alike = [replace(p, codecs=first.codecs) if p.segments is None and _decoding(
            p.codecs) == decoding else p for p in parts]
        alike = [replace(p, fill_value=fill) if _unread_fill(p, first) else p for p in alike]
        kept = _stored(alike[0])
        return alike if any(p.segments is not None or _stored(p) != kept
                            for p in alike) else None

    def segments(self, parts: list[VirtualArray], alike: list[VirtualArray],
                 labels: list[str], where: str, times: Times, attrs: Attributes
                 ) -> VirtualArray:
        """``parts`` joined in segments (as :meth:`segmented` aligned them: ``alike``),
        each read by its own encoding; what else must agree is checked as for any
        variable."""
        self.check(parts, labels, where, times, segmenting=True)
        try:
            array = joined(alike, self.dim, attrs)
        except RefgridError as e:
            raise CombineError(f"{where}: {e}") from e
        segments = array.segments
        if segments is not None:
            self.report.append(ReportEntry(labels[0], where, "segmented", (
                f"stored in {len(segments)} runs of files of other types, codecs or packing: "
                f"each read by its own encoding and shown "
                f"{'decoded as xarray decodes each file' if segments.decoded else 'as stored'}"
                f" ({array.dtype}); no data copied")))
        return array

    def check(self, parts: list[VirtualArray], labels: list[str], where: str, times: Times,
              *, reread: bool = False, segmenting: bool = False) -> None:
        """Every disagreement that would mis-place or mis-decode data, with every file.
        ``reread``: the values are read and written anew (in the first file's type and
        units), so only what decides their meaning must agree, not how they are stored;
        ``segmenting``: each file's values are decoded by its own encoding, which may
        differ (:data:`SEGMENT_KEYS`)."""
        timed = any(t is not None for t in times)
        axis = parts[0].axis(self.dim) if self.dim in parts[0].dims else None
        signatures = [_signature(p, axis, timed) for p in parts]
        reference = signatures[0]
        problems = []
        for what, expected in reference.items():
            if (what == "codecs" and self.recode) or (reread and what in STORAGE_KEYS) or (
                    segmenting and what in SEGMENT_KEYS):
                continue
            exact = what in EXACT_KEYS
            if what == "dtype" and self.recode:  # (re-encoded in the first file's order)
                odd = [k for k, p in enumerate(parts) if p.value_dtype != parts[0].value_dtype]
            else:
                odd = [k for k, sig in enumerate(signatures) if not (
                    sig[what] == expected if exact else same_value(sig[what], expected))]
            ref = 0
            if what == "fill value":
                odd, ref = _unread_fills(parts, odd)
                expected = signatures[ref][what]
            elif reread and what in MARKER_ATTRS:
                odd = [k for k in odd if not self.marks_alike(parts[0], parts[k])]
            if odd:
                names = ", ".join(labels[k] for k in odd)
                problems.append(f"{what} differs in {names} from {labels[ref]} "
                                f"({brief(signatures[odd[0]][what])} vs {brief(expected)})")
        if problems:
            lead = f"has no {self.dim!r} dimension and its " if axis is None else ""
            recode = " (pass codecs='recode' to re-encode them, copying their data)" if any(
                p.startswith("codecs ") for p in problems) else ""
            raise CombineError(f"{where}: {lead}" + "; ".join(problems) + recode)

    def marks_alike(self, first: VirtualArray, part: VirtualArray) -> bool:
        """Whether ``part``'s values, read and written anew under ``first``'s attributes,
        are missing exactly where its own ``_FillValue`` and ``missing_value`` say: then its
        markers mean nothing else (xarray's re-save gives float coordinates a NaN
        ``_FillValue`` that marks no value)."""
        values = self.read(part)
        return bool(np.array_equal(cf.stored_mask(values, reader_attrs(part.attrs)),
                                   cf.stored_mask(values, reader_attrs(first.attrs))))

    def recoded(self, part: VirtualArray, first: VirtualArray, label: str,
                where: str) -> VirtualArray:
        """``part`` with its chunks re-encoded to ``first``'s codecs (inlined), if needed."""
        if _decoding(part.codecs) == _decoding(first.codecs):
            return part
        from refgrid.codecs.filters import stored_dtype
        from refgrid.codecs.pipeline import encode_chunk
        from refgrid.read.array import read

        stored = stored_dtype(part.dtype, first.codecs)
        grid, source = part.grid, part.manifest
        built = ManifestBuilder(source.shape)
        for coords in np.argwhere(source.path_id != MISSING):
            key = tuple(int(c) for c in coords)
            values = read(part, grid.chunk_region(key), storage_options=self.storage_options)
            block = np.full(grid.encoded_chunk_shape(key), part.fill_value, dtype=stored)
            block[tuple(slice(0, n) for n in values.shape)] = values
            built.inlined(key, encode_chunk(block, first.codecs))
        self.report.append(ReportEntry(label, where, "inlined", (
            f"codecs {[c['name'] for c in part.codecs]} differ from the first file's "
            f"{[c['name'] for c in first.codecs]}: {len(built.inline)} chunks re-encoded and "
            "inlined (data copied)")))
        return replace(part, dtype=stored, codecs=first.codecs, manifest=built.build(),
                       segments=None)  # (its values read as shown, now stored one way)

    def constant(self, parts: list[VirtualArray], labels: list[str], where: str,
                 times: Times) -> VirtualArray:
        """A variable without the concat dimension: one copy when identical everywhere —
        times compared as the dates they are, whatever units each file wrote them in."""
        first = parts[0]
        self.check(parts, labels, where, times, reread=self.others != "stack")
        retimed = any(t != times[0] for t in times)
        if self.others == "stack":
            if retimed:
                odd = [lab for t, lab in zip(times, labels, strict=True) if t != times[0]]
                raise CombineError(f"{where}: its times are in other units in {some(odd)} "
                                   f"than in {labels[0]}: stacked files keep one encoding")
            stacked = [with_leading_axis(p, "file") for p in parts]
            fill = _read_fill(stacked)
            return VirtualArray.concat([replace(s, attrs=stacked[0].attrs, fill_value=fill)
                                        for s in stacked], "file")
        reference = None
        first_digest = self.fingerprint(first)
        odd = []
        for p, lab, t in zip(parts[1:], labels[1:], times[1:], strict=True):
            if t != times[0]:
                same = self.same_dates(first, times[0], p, t)
            elif (first_digest is not None and self.fingerprint(p) == first_digest) or (
                    p.manifest == first.manifest and p.grid == first.grid
                    and p.dtype == first.dtype):
                continue
            else:
                if reference is None:
                    reference = self.read(first)
                values = self.read(p)
                same = values.shape == reference.shape and same_value(values, reference)
            if not same:
                odd.append(lab)
        if odd:
            hint = "" if self.stacking else " (pass others='stack' to keep one copy per file)"
            raise CombineError(f"{where}: has no {self.dim!r} dimension and differs in "
                               f"{some(odd)} from {labels[0]}{hint}")
        return first

    def same_dates(self, a: VirtualArray, a_time: cf.TimeEncoding | None, b: VirtualArray,
                   b_time: cf.TimeEncoding | None) -> bool:
        """Whether two time variables hold the same dates (and the same gaps)."""
        if a_time is None or b_time is None or any(
                name in x.attrs for x in (a, b) for name in ("scale_factor", "add_offset")):
            return False  # (packed times in other units are not compared: refused)
        x, y = self.read(a), self.read(b)
        if x.shape != y.shape:
            return False
        attrs = reader_attrs(a.attrs)
        mx, my = cf.stored_mask(x, attrs), cf.stored_mask(y, attrs)
        try:
            dates = cf.decode_times(x[~mx], *a_time), cf.decode_times(y[~my], *b_time)
        except Exception as e:  # units xarray cannot decode ("days since last frost")
            raise CombineError(f"{a.name}: its times cannot be decoded to compare them "
                               f"({a_time[0]!r} and {b_time[0]!r}): {e}") from e
        return bool(np.array_equal(mx, my) and np.array_equal(*dates))

    def attributes(self, values: list[Mapping[str, object]], labels: list[str], where: str,
                   skip: tuple[str, ...] = ()) -> Attributes:
        """The first file's attributes; other files' differing values are recorded (not
        refgrid's bookkeeping: each file has its own storage facts, and the combined array
        reports the first file's, as xarray's ``open_mfdataset`` does; nor ``skip``: the
        units of times re-encoded to the first file's)."""
        self.report += attribute_conflicts(values, labels, where, skip)
        return dict(values[0])


def attribute_conflicts(values: Sequence[Mapping[str, object]], labels: Sequence[str],
                        where: str, skip: tuple[str, ...] = ()) -> list[ReportEntry]:
    """Where the others' attributes differ from the first's (kept): one
    ``attribute-conflict`` entry each — refgrid's per-file storage facts and ``skip`` aside."""
    first = values[0]
    out = []
    for attrs, lab in zip(values[1:], labels[1:], strict=True):
        for name in sorted(set(first) | set(attrs)):
            if name in (ATTRIBUTE_TYPES_ATTR, ENCODING_ATTR) or name in skip:
                continue
            if not same_value(first.get(name), attrs.get(name)):
                out.append(ReportEntry(lab, f"{where}@{name}", "attribute-conflict",
                                       f"kept {labels[0]}'s value {brief(first.get(name))}, "
                                       f"not {brief(attrs.get(name))}"))
    return out


# -- helpers --------------------------------------------------------------------------------

EXACT_KEYS = frozenset({"dimensions", "dtype", "shape on other dimensions",
                        "chunking on other dimensions", "codecs"})
STORAGE_KEYS = frozenset({"dtype", "chunking on other dimensions", "codecs", "fill value"})
"""How values are stored, not what they mean: free to differ where values are read and
written anew."""
SEGMENT_KEYS = frozenset({"dtype", "codecs", "fill value", *cf.PACKING_ATTRS})
"""What files may differ in where each is decoded by its own encoding (segments)."""
MARKER_ATTRS = frozenset({"_FillValue", "missing_value"})
"""Attributes that mark values missing: where values are read and written anew, they agree
when they mark the same values (:meth:`Combine.marks_alike`)."""
TIME_ATTRS = ("units", "calendar")
"""The attributes of times that re-encoding makes the first file's."""


@dataclass(frozen=True)
class _Typed:
    """An attribute's value with its numeric type: a float32 ``scale_factor`` unpacks to
    float32, a float64 one to float64, so equal values of other types do not agree."""

    value: object
    kind: str

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Typed) and self.kind == other.kind and same_value(
            self.value, other.value)

    def __repr__(self) -> str:
        return f"{self.value!r} ({self.kind})" if self.kind else repr(self.value)

    __hash__ = None  # type: ignore[assignment]


def _typed(value: object) -> _Typed | None:
    if value is None:
        return None
    if isinstance(value, str | bytes | bool):
        return _Typed(value, "")
    kind = np.asarray(value).dtype
    return _Typed(_comparable(value), kind.name if kind.kind in "iufc" else "")


def _signature(array: VirtualArray, axis: int | None, timed: bool) -> dict[str, object]:
    """What must agree across files for ``array``: compared key by key (NaN-aware for
    fill values and attributes; numeric attributes with their types). ``axis``: of the
    concat dimension (None: the array has none); ``timed``: the units and calendar of its
    times are compared as dates, not here."""
    grid = array.grid
    attrs = reader_attrs(array.attrs)
    if "calendar" in attrs:
        attrs["calendar"] = cf.calendar_name(attrs["calendar"])
    others = [d for d in range(grid.ndim) if d != axis]
    return {
        "dimensions": array.dims,
        "dtype": str(array.dtype),
        "shape on other dimensions": tuple(array.shape[d] for d in others),
        "chunking on other dimensions": tuple(
            (tuple(grid.lengths(d).tolist()), tuple(grid.encoded_lengths(d).tolist()))
            for d in others),
        "codecs": _decoding(array.codecs),
        "fill value": _comparable(array.fill_value),
        **{("attribute dtype" if name == "dtype" else name): _typed(attrs.get(name))
           for name in cf.MEANING_ATTRS if not (timed and name in TIME_ATTRS)},
    }


def _stored_differently(a: VirtualArray, b: VirtualArray) -> bool:
    """Whether two files store a variable in other types, codecs or chunks (one inlined by a
    batch worker, the other referenced, say): read and written anew, they join."""
    return a.dtype != b.dtype or _decoding(a.codecs) != _decoding(b.codecs) or any(
        not np.array_equal(a.grid.lengths(d), b.grid.lengths(d))
        for d in range(1, a.grid.ndim) if a.grid.ndim == b.grid.ndim)


def _unread_fills(parts: Sequence[VirtualArray], odd: list[int]) -> tuple[list[int], int]:
    """The files whose storage fill differs where a reader meets it — a chunk never written
    — and the file they are compared with: a fill no missing chunk uses decodes nothing
    (``nccopy`` turns HDF5's fill off, storing 0 where ``_FillValue`` says 1e20), so only
    the files with missing chunks must agree, with the first of them."""
    holed = [k for k, p in enumerate(parts) if p.manifest.missing.any()]
    if not odd or not holed:
        return [], 0
    expected = _comparable(parts[holed[0]].fill_value)
    return [k for k in holed if not same_value(_comparable(parts[k].fill_value),
                                               expected)], holed[0]


def _stored(part: VirtualArray) -> Encoding:
    """How a file stores a variable (as :meth:`Combine.segmented` aligned it)."""
    return Encoding.of(part.dtype, part.codecs, part.fill_value, part.attrs)


def _unread_fill(part: VirtualArray, first: VirtualArray) -> bool:
    """Whether ``part``'s storage fill is read nowhere (it has no missing chunk) and may be
    taken as ``first``'s (of the same type), so that it makes no segment of its own."""
    return not part.manifest.missing.any() and part.dtype == first.dtype


def _read_fill(parts: Sequence[VirtualArray]) -> object:
    """The storage fill of joined files (checked by :func:`_unread_fills`): that of the
    files with missing chunks, where readers meet it; the first file's where none has."""
    return next((p.fill_value for p in parts if p.manifest.missing.any()), parts[0].fill_value)


def retimed(values: np.ndarray, encoding: cf.TimeEncoding, target: cf.TimeEncoding,
             first: VirtualArray) -> np.ndarray:
    """``values`` (times in ``encoding``) in ``target``'s units as ``first``'s type; the
    fill value and NaN stay as they are (``first``'s fill attributes hold for every file)."""
    attrs = reader_attrs(first.attrs)
    mask = cf.stored_mask(values, attrs)
    dates = cf.decode_times(values[~mask], *encoding)
    out = np.empty(values.shape, first.value_dtype)
    out[~mask] = cf.encode_times(dates, target[0], target[1], first.value_dtype)
    kept = values[mask]
    out[mask] = kept
    if not same_value(out[mask], kept):
        raise ValueError(f"hold fill values {first.value_dtype} cannot hold")
    return out


def _exactly(data: np.ndarray, parts: list[VirtualArray], labels: list[str],
             where: str) -> np.ndarray:
    """``data`` (every file's values, joined) as the first file's type — refused where a
    value would change (another file's fractions in the first file's integers, say)."""
    dtype = parts[0].value_dtype
    cast = data.astype(dtype)
    if data.dtype != dtype and not same_value(cast.astype(data.dtype), data):
        odd = [k for k, p in enumerate(parts) if p.value_dtype != dtype]
        raise CombineError(f"{where}: values of {some([labels[k] for k in odd])} "
                           f"({parts[odd[0]].value_dtype}) cannot be held exactly by "
                           f"{labels[0]}'s type {dtype}")
    return cast


def _one_calendar(times: Times, labels: list[str], where: str) -> None:
    """Refuse times in several calendars: a date of one may not exist in another."""
    target = next((t for t in times if t is not None), None)
    odd = [lab for t, lab in zip(times, labels, strict=True)
           if t is not None and target is not None and t[1] != target[1]]
    if odd and target is not None:
        other = next(t for t in times if t is not None and t[1] != target[1])
        first = labels[times.index(target)]
        raise CombineError(
            f"{where}: calendar {other[1]!r} in {some(odd)} differs from {target[1]!r} in "
            f"{first}: dates cannot be re-encoded exactly across calendars; combine the files "
            "of each calendar separately")


def some(labels: Sequence[str]) -> str:
    """Files named in a message: the first few, and how many more."""
    shown = ", ".join(labels[:3])
    return shown + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")


def label_of(group: VirtualGroup, k: int) -> str:
    for _, node in group.walk():
        if isinstance(node, VirtualArray) and node.manifest.paths:
            return node.manifest.paths[0]
    return f"group #{k}"


def _where(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def _all_names(groups: list[VirtualGroup], kind: str) -> list[str]:
    names: dict[str, None] = {}
    for g in groups:
        names.update(dict.fromkeys(getattr(g, kind)))
    return list(names)


def _bounds(values: list[np.ndarray], coords: list[VirtualArray]) -> list[Untyped]:
    """Each file's first and last coordinate value as comparable instants (CF times decoded,
    one decode per distinct units and calendar), or ``None`` for an empty file: numbers,
    datetime64 or cftime dates (cftime is untyped)."""
    ends = [np.asarray([v[0], v[-1]]) if len(v) else None for v in values]
    keys = [(c.attrs.get("units"), c.attrs.get("calendar", "standard")) for c in coords]
    out: list[Untyped] = [None] * len(values)
    for key in set(keys):
        members = [k for k, kk in enumerate(keys) if kk == key and ends[k] is not None]
        if not members:
            continue
        stacked = np.concatenate([ends[k] for k in members])
        units, calendar = key
        if cf.is_time_units(units):
            stacked = cf.decode_times(stacked, str(units), calendar)
        for j, k in enumerate(members):
            out[k] = (stacked[2 * j], stacked[2 * j + 1])
    return out


def _decoding(codecs: Sequence[CodecJSON]) -> list[CodecJSON]:
    """Codecs with compression levels removed: what decides how bytes decode."""
    return [{"name": c["name"], "configuration": {
        k: v for k, v in c.get("configuration", {}).items() if k not in LEVEL_KEYS}}
        for c in codecs]


def fillable(array: VirtualArray, why: str, where: str) -> None:
    """Refuses to read ``array``'s missing chunks as absent values (``why`` it would) unless
    its fill value is its ``_FillValue``: any other value readers would take for data."""
    fill = reader_attrs(array.attrs).get("_FillValue")
    if fill is None or not same_value(_comparable(np.asarray(fill).reshape(-1)[0]),
                                      _comparable(array.fill_value)):
        raise CombineError(
            f"{where}: {why}, and without a _FillValue equal to its fill value "
            f"({brief(array.fill_value)}) readers would take that value for data there: it "
            "cannot be filled (choose the files that hold it, or drop it with "
            "drop_variables=)")


def _comparable(value: object) -> object:
    return value.tolist() if isinstance(value, np.ndarray) else value
