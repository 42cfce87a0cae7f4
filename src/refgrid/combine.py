"""Many files → one virtual dataset, concatenated along a dimension of irregular length.

Files are ordered by the first value of their concat coordinate (decoded, so files with
different time units order correctly), checked for overlaps, and joined variable by variable:
the result's grid along the concat dimension is every file's logical chunk lengths in turn
(rectilinear), with the encoded lengths kept where a file's last chunk is stored padded.

Policies, all reported rather than silent:
- the concat coordinate is read, re-encoded to the first file's units and calendar, and
  inlined as one chunk;
- variables without the concat dimension are taken from the first file after checking they
  are identical in every file (``others="stack"`` keeps them per file along a new leading
  dimension ``file`` instead);
- attributes are the first file's; differing values in other files are recorded in
  ``VirtualGroup.report`` (action ``attribute-conflict``);
- files whose codecs decode differently are an error, or with ``codecs="recode"`` re-encoded
  to the first file's codecs and inlined (reported: the data is copied).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np

from refgrid.codecs.filters import bytes_codec
from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR, ENCODING_ATTR, reader_attrs
from refgrid.core.inputs import expand_counting
from refgrid.errors import ArgumentError, CombineError, RefgridError
from refgrid.grid.rectilinear import AxisChunks, RectilinearGrid
from refgrid.model.manifest import INLINE, MISSING, ChunkManifest
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup, same_value

DECODING_ATTRS = ("scale_factor", "add_offset", "_FillValue", "missing_value", "_Unsigned")
"""Attributes that change decoded values: they must agree across files."""
LEVEL_KEYS = frozenset({"level", "clevel", "complevel"})
"""Codec settings that change how data was compressed, not how it decodes."""


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
    codecs: Literal["error", "recode"] = "error",
    storage_options: dict[str, Any] | None = None,
    fingerprint: Callable[[VirtualArray], str | None] | None = None,
) -> VirtualGroup:
    """Concatenate files along ``concat_dim`` (see the module docstring).

    ``groups``: groups :func:`refgrid.scan` made, or — as ``refgrid combine`` takes them —
    paths, URLs, glob patterns (``"data/tas_*.nc"``) and ``@list`` files, which are
    expanded and scanned with ``storage_options``; a file named twice is combined once, and
    said so in the report. ``sources`` names the files in messages (default: the first URL
    each group references).
    ``codecs="recode"`` accepts files whose codecs decode differently from the first file's
    (say contiguous, uncompressed files among compressed chunked ones): their chunks are
    decoded, re-encoded with the first file's codecs and inlined — data is copied, and each
    such variable is reported. ``storage_options`` reach the source files, which are read
    for the concat coordinate and to compare variables without the concat dimension.
    ``fingerprint`` gives a digest of an array's values where one is known without reading
    (batch workers compute them where they scan): arrays without the concat dimension whose
    digests are equal are identical and are not read.
    """
    groups, named, report = _scanned(groups, storage_options)
    if not groups:
        raise CombineError("nothing to combine: no groups given")
    labels = list(sources) if sources is not None else named or [
        _label(g, k) for k, g in enumerate(groups)]
    if len(labels) != len(groups):
        raise CombineError(f"{len(labels)} source names for {len(groups)} groups")
    dims = {d for g in groups for _, node in g.walk() if isinstance(node, VirtualArray)
            for d in node.dims}
    if concat_dim not in dims:
        raise CombineError(f"no variable in any of the {len(groups)} files has the dimension "
                           f"{concat_dim!r} to combine along (dimensions: "
                           f"{', '.join(sorted(dims)) or 'none'})")
    job = _Combine(concat_dim, overlap, others, codecs, storage_options or {},
                   fingerprint or _unknown)
    root = job.group(list(groups), labels, "")
    scanned = tuple(entry for g in groups for entry in g.report)
    identities = {url: identity for g in groups for url, identity in g.sources.items()}
    return replace(root, report=(*report, *scanned, *job.report), sources=identities)


def with_inline_coordinates(group: VirtualGroup, concat_dim: str,
                            storage_options: dict[str, Any] | None = None) -> VirtualGroup:
    """``group`` with each ``concat_dim`` coordinate read and inlined as :func:`combine`
    stores it: batch workers do this where they scan, so that combining their records reads
    no coordinate from the sources."""
    job = _Combine(concat_dim, "error", "identical", "error", storage_options or {}, _unknown)
    url = _label(group, 0)

    def inline(g: VirtualGroup, path: str) -> VirtualGroup:
        arrays = {name: job.coordinate([a], [url], _where(path, name))
                  if a.dims == (concat_dim,) and a.name == concat_dim else a
                  for name, a in g.arrays.items()}
        groups = {name: inline(child, _where(path, name)) for name, child in g.groups.items()}
        return replace(g, arrays=arrays, groups=groups)

    return inline(group, "")


def _unknown(array: VirtualArray) -> None:
    return None


class _Combine:
    def __init__(self, dim: str, overlap: str, others: str, codecs: str,
                 storage_options: dict[str, Any],
                 fingerprint: Callable[[VirtualArray], str | None]) -> None:
        self.dim, self.overlap, self.others, self.recode = dim, overlap, others, codecs == "recode"
        self.storage_options = storage_options
        self.fingerprint = fingerprint
        self.report: list[ReportEntry] = []
        self.values: dict[int, np.ndarray] = {}

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
        if missing:
            detail = "; ".join(f"{_where(path, n)} missing from {', '.join(f)}"
                               for n, f in sorted(missing.items()))
            raise CombineError(f"variables are not in every file: {detail}")
        arrays = {}
        for name in names:
            parts = [g.arrays[name] for g in groups]
            arrays[name] = self.array(parts, labels, _where(path, name))
        child_names = _all_names(groups, "groups")
        absent = {n: [lab for g, lab in zip(groups, labels, strict=True) if n not in g.groups]
                  for n in child_names}
        if any(absent.values()):
            detail = "; ".join(f"group {_where(path, n)} missing from {', '.join(f)}"
                               for n, f in absent.items() if f)
            raise CombineError(f"groups are not in every file: {detail}")
        children = {n: self.group([g.groups[n] for g in groups], labels, _where(path, n))
                    for n in child_names}
        attrs = self.attributes([g.attrs for g in groups], labels, path or "/")
        return VirtualGroup(attrs, arrays, children)

    # -- ordering and the concat coordinate ----------------------------------------------

    def _order(self, groups: list[VirtualGroup], labels: list[str], path: str) -> list[int]:
        if any(self.dim not in g.arrays for g in groups):
            return list(range(len(groups)))  # no coordinate: keep the given order
        coords = [g.arrays[self.dim] for g in groups]
        bounds = _bounds([self.read(c) for c in coords], coords)  # (first, last) instants
        empty = [k for k, b in enumerate(bounds) if b is None]
        filled = sorted((k for k, b in enumerate(bounds) if b is not None),
                        key=lambda k: bounds[k][0])
        if self.overlap == "error":
            for a, b in itertools.pairwise(filled):
                if bounds[a][1] >= bounds[b][0]:
                    raise CombineError(
                        f"{_where(path, self.dim)}: {labels[a]} ends at {bounds[a][1]} "
                        f"but {labels[b]} starts at {bounds[b][0]}: the files overlap or "
                        "repeat values (pass overlap='allow' to keep both)")
        return filled + empty

    def coordinate(self, parts: list[VirtualArray], labels: list[str],
                   where: str) -> VirtualArray:
        """The concat coordinate, read, re-encoded to the first file's units, inlined."""
        first = parts[0]
        values = [self.read(p) for p in parts]
        units = [p.attrs.get("units") for p in parts]
        calendars = [p.attrs.get("calendar", "standard") for p in parts]
        if any(u != units[0] or c != calendars[0] for u, c in zip(units, calendars, strict=True)):
            if not (isinstance(units[0], str) and " since " in units[0]):
                odd = [lab for lab, u in zip(labels, units, strict=True) if u != units[0]]
                raise CombineError(f"{where}: units differ ({', '.join(odd)} vs {labels[0]}) "
                                   "and are not CF time units that can be re-encoded")
            values = _reencoded(values, parts, labels, where)
        data = np.concatenate(values).astype(first.dtype)
        grid = RectilinearGrid.regular([len(data)], [max(1, len(data))])
        stored = data.astype(first.dtype.newbyteorder("<")) if data.dtype.itemsize > 1 else data
        path_id = np.full(grid.chunk_counts, INLINE if len(data) else -1, np.int32)
        inline: dict[tuple[int, ...], bytes] = {(0,): stored.tobytes()} if len(data) else {}
        manifest = ChunkManifest((), path_id, np.zeros(grid.chunk_counts),
                                 np.zeros(grid.chunk_counts), inline)
        return replace(first, dtype=stored.dtype, grid=grid, manifest=manifest,
                       codecs=(bytes_codec(stored.dtype),))

    # -- variables ------------------------------------------------------------------------

    def array(self, parts: list[VirtualArray], labels: list[str], where: str) -> VirtualArray:
        first = parts[0]
        attrs = self.attributes([p.attrs for p in parts], labels, where)
        if self.dim not in first.dims:
            return replace(self.constant(parts, labels, where), attrs=attrs)
        if first.dims == (self.dim,) and first.name == self.dim:
            return replace(self.coordinate(parts, labels, where), attrs=attrs)
        self.check(parts, labels, where)
        if self.recode:
            parts = [self.recoded(p, first, lab, where) for p, lab in zip(parts, labels,
                                                                             strict=True)]
        aligned = [replace(p, codecs=first.codecs, attrs=first.attrs) for p in parts]
        try:
            joined = VirtualArray.concat(aligned, self.dim)
        except RefgridError as e:
            raise CombineError(f"{where}: {e}") from None
        return replace(joined, attrs=attrs)

    def check(self, parts: list[VirtualArray], labels: list[str], where: str) -> None:
        """Every disagreement that would mis-place or mis-decode data, with every file."""
        axis = parts[0].axis(self.dim)
        signatures = [_signature(p, axis) for p in parts]
        reference = signatures[0]
        problems = []
        for what, expected in reference.items():
            if what == "codecs" and self.recode:
                continue
            exact = what in EXACT_KEYS
            odd = [k for k, sig in enumerate(signatures) if not (
                sig[what] == expected if exact else same_value(sig[what], expected))]
            if odd:
                names = ", ".join(labels[k] for k in odd)
                problems.append(f"{what} differs in {names} from {labels[0]} "
                                f"({_brief(signatures[odd[0]][what])} vs {_brief(expected)})")
        if problems:
            raise CombineError(f"{where}: " + "; ".join(problems))

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
        path_id = np.full(source.shape, MISSING, np.int32)
        inline = {}
        for coords in np.argwhere(source.path_id != MISSING):
            key = tuple(int(c) for c in coords)
            values = read(part, grid.chunk_region(key), storage_options=self.storage_options)
            block = np.full(grid.encoded_chunk_shape(key), part.fill_value, dtype=stored)
            block[tuple(slice(0, n) for n in values.shape)] = values
            inline[key] = encode_chunk(block, first.codecs)
            path_id[key] = INLINE
        self.report.append(ReportEntry(label, where, "inlined", (
            f"codecs {[c['name'] for c in part.codecs]} differ from the first file's "
            f"{[c['name'] for c in first.codecs]}: {len(inline)} chunks re-encoded and "
            "inlined (data copied)")))
        zeros = np.zeros(source.shape, np.uint64)
        return replace(part, codecs=first.codecs,
                       manifest=ChunkManifest((), path_id, zeros, zeros, inline))

    def constant(self, parts: list[VirtualArray], labels: list[str], where: str) -> VirtualArray:
        """A variable without the concat dimension: one copy when identical everywhere."""
        first = parts[0]
        if self.others == "stack":
            stacked = [_with_leading_axis(p, "file") for p in parts]
            return VirtualArray.concat([replace(s, attrs=first.attrs) for s in stacked], "file")
        reference = None
        first_digest = self.fingerprint(first)
        odd = []
        for p, lab in zip(parts[1:], labels[1:], strict=True):
            if first_digest is not None and self.fingerprint(p) == first_digest:
                continue
            if p.manifest == first.manifest and p.grid == first.grid and p.dtype == first.dtype:
                continue
            if reference is None:
                reference = self.read(first)
            values = self.read(p)
            if values.shape != reference.shape or not same_value(values, reference):
                odd.append(lab)
        if odd:
            raise CombineError(f"{where}: has no {self.dim!r} dimension and differs in "
                               f"{', '.join(odd)} from {labels[0]} (pass others='stack' to keep "
                               "one copy per file)")
        return first

    def attributes(self, values: list[Any], labels: list[str], where: str) -> dict[str, Any]:
        """The first file's attributes; other files' differing values are recorded (not
        refgrid's bookkeeping: each file has its own storage facts, and the combined array
        reports the first file's, as xarray's ``open_mfdataset`` does)."""
        first = dict(values[0])
        for attrs, lab in zip(values[1:], labels[1:], strict=True):
            for name in sorted(set(first) | set(attrs)):
                if name in (ATTRIBUTE_TYPES_ATTR, ENCODING_ATTR):
                    continue
                if not same_value(first.get(name), attrs.get(name)):
                    self.report.append(ReportEntry(
                        lab, f"{where}@{name}", "attribute-conflict",
                        f"kept {labels[0]}'s value {_brief(first.get(name))}, not "
                        f"{_brief(attrs.get(name))}"))
        return first


# -- helpers --------------------------------------------------------------------------------

EXACT_KEYS = frozenset({"dimensions", "dtype", "shape on other dimensions",
                        "chunking on other dimensions", "codecs"})


def _signature(array: VirtualArray, axis: int) -> dict[str, Any]:
    """What must agree across files for ``array``: compared key by key (NaN-aware for
    fill values and packing attributes)."""
    grid = array.grid
    attrs = reader_attrs(array.attrs)
    return {
        "dimensions": array.dims,
        "dtype": str(array.dtype),
        "shape on other dimensions": array.shape[:axis] + array.shape[axis + 1:],
        "chunking on other dimensions": tuple(
            (tuple(grid.lengths(d).tolist()), tuple(grid.encoded_lengths(d).tolist()))
            for d in range(grid.ndim) if d != axis),
        "codecs": _decoding(array.codecs),
        "fill value": _comparable(array.fill_value),
        **{name: _comparable(attrs.get(name)) for name in DECODING_ATTRS},
    }


def _scanned(items: Sources, storage_options: dict[str, Any] | None
             ) -> tuple[list[VirtualGroup], list[str] | None, list[ReportEntry]]:
    """The groups to combine, their names (None: groups as given), and the report of files
    named more than once."""
    from refgrid.scan import scan

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
    return [scan(url, **(storage_options or {})) for url in found], list(found), report


def _label(group: VirtualGroup, k: int) -> str:
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


def _bounds(values: list[np.ndarray], coords: list[VirtualArray]) -> list[Any]:
    """Each file's first and last coordinate value as comparable instants (CF times decoded,
    one decode per distinct units and calendar), or ``None`` for an empty file."""
    ends = [np.asarray([v[0], v[-1]]) if len(v) else None for v in values]
    keys = [(c.attrs.get("units"), c.attrs.get("calendar", "standard")) for c in coords]
    out: list[Any] = [None] * len(values)
    for key in set(keys):
        members = [k for k, kk in enumerate(keys) if kk == key and ends[k] is not None]
        if not members:
            continue
        stacked = np.concatenate([ends[k] for k in members])
        units, calendar = key
        if isinstance(units, str) and " since " in units:
            stacked = decode_times(stacked, units, calendar)
        for j, k in enumerate(members):
            out[k] = (stacked[2 * j], stacked[2 * j + 1])
    return out


def decode_times(values: np.ndarray, units: str, calendar: str) -> np.ndarray:
    """CF times decoded as xarray decodes them, for ordering and re-encoding. Quietly:
    xarray warns when dates beyond 2262 come back as cftime objects, which is a matter of
    representation here, not of the values."""
    import warnings

    from xarray.coding.times import decode_cf_datetime
    from xarray.coding.variables import SerializationWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SerializationWarning)
        return np.asarray(decode_cf_datetime(values, units, calendar))


def _reencoded(values: list[np.ndarray], parts: list[VirtualArray], labels: list[str],
               where: str) -> list[np.ndarray]:
    """Each file's times in the first file's units: one decode and encode per distinct
    units and calendar (10^5 files in two kinds of units are two re-encodings, not 10^5)."""
    first = parts[0]
    kinds: dict[tuple[Any, Any], list[int]] = {}
    for k, p in enumerate(parts):
        kinds.setdefault((p.attrs.get("units"), p.attrs.get("calendar", "standard")),
                         []).append(k)
    out = list(values)
    for members in kinds.values():
        if members[0] == 0:
            continue  # the first file's own units
        joined = np.concatenate([values[k] for k in members])
        try:
            encoded = _reencode(joined, parts[members[0]], first, labels[members[0]], where)
        except CombineError:  # name the very file whose times do not fit
            for k in members:
                _reencode(values[k], parts[k], first, labels[k], where)
            raise
        for k, piece in zip(members, np.split(encoded, np.cumsum(
                [len(values[k]) for k in members])[:-1]), strict=True):
            out[k] = piece
    return out


def _reencode(values: np.ndarray, part: VirtualArray, first: VirtualArray, label: str,
              where: str) -> np.ndarray:
    from xarray.coding.times import encode_cf_datetime

    dates = decode_times(values, part.attrs["units"], part.attrs.get("calendar", "standard"))
    encoded, _, _ = encode_cf_datetime(dates, first.attrs["units"],
                                       first.attrs.get("calendar", "standard"), first.dtype)
    back = decode_times(encoded, first.attrs["units"], first.attrs.get("calendar", "standard"))
    if not np.array_equal(np.asarray(back), np.asarray(dates)):
        raise CombineError(f"{where}: times of {label} cannot be encoded exactly in "
                           f"{first.attrs['units']!r}")
    return np.asarray(encoded)


def _decoding(codecs: tuple[Any, ...]) -> list[Any]:
    """Codecs with compression levels removed: what decides how bytes decode."""
    return [{"name": c["name"], "configuration": {
        k: v for k, v in c.get("configuration", {}).items() if k not in LEVEL_KEYS}}
        for c in codecs]


def _comparable(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _brief(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _with_leading_axis(array: VirtualArray, dim: str) -> VirtualArray:
    one = np.ones(1, dtype=np.int64)
    grid = RectilinearGrid((AxisChunks(one, one), *array.grid.axes))
    m = array.manifest
    manifest = ChunkManifest(m.paths, m.path_id[None], m.offset[None], m.length[None],
                             {(0, *k): v for k, v in m.inline.items()})
    return replace(array, dims=(dim, *array.dims), grid=grid, manifest=manifest)
