"""Reading an array stored in segments (:mod:`refgrid.model.segments`), as it is shown
(:mod:`refgrid.model.presented`).

A read splits the selection at segment boundaries along the segmented dimension, reads each
*storage group* (segments stored alike: usually all of them) through one reader of stored
chunks — so an archive of 10^4 files differing only in ``add_offset`` is one coalesced read —
and converts each segment's part of it (decoded as xarray decodes that file, where the array
is shown decoded).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import NamedTuple, Protocol, cast

import numpy as np

from refgrid.core.cf import mask_and_scale
from refgrid.core.dtypes import ATTRIBUTE_TYPES_ATTR, reader_attrs
from refgrid.core.sources import SourceCheck
from refgrid.core.typed import StorageOptions
from refgrid.errors import ReadError
from refgrid.grid.selection import normalize_selection
from refgrid.model.presented import kind_of
from refgrid.model.segments import Encoding
from refgrid.model.virtual import VirtualArray


class ArrayReader(Protocol):
    """What reads one array: :class:`refgrid.read.array.Reader`, or for an array stored in
    segments :class:`SegmentedReader`."""

    def read(self, selection: object = ...) -> np.ndarray: ...


ReaderOf = Callable[[VirtualArray, str, StorageOptions | None, SourceCheck | None],
                    ArrayReader]
"""How a reader of stored chunks is made (:class:`refgrid.read.array.Reader`)."""


class SegmentedReader:
    """Reads of one array in segments: the :class:`~refgrid.read.array.Reader` interface
    views and the engine use."""

    def __init__(self, array: VirtualArray, name: str, storage_options: StorageOptions | None,
                 check: SourceCheck | None, stored: ReaderOf) -> None:
        segments = array.segments
        assert segments is not None
        self.array, self.segments = array, segments
        self.axis = array.axis(segments.dim)
        bounds = array.grid.axes[self.axis].bounds
        self.first = bounds[np.asarray(segments.starts)]
        """Each segment's first element along the segmented axis."""
        groups: dict[tuple[str, str, str], Encoding] = {}
        known: dict[tuple[int, str, str], int] = {}  # (segments read from one document share
        self.group = np.empty(len(segments), np.intp)  # their storage's codecs)
        for k, e in enumerate(segments.encodings):
            quick = (id(e.codecs), e.dtype.str, repr(e.fill_value))
            if quick not in known:
                key = e.storage
                if key not in groups:
                    groups[key] = e
                known[quick] = list(groups).index(key)
            self.group[k] = known[quick]
        self._kinds: tuple[np.ndarray, list[Columns]] | None = None
        self.readers = [stored(replace(array, dtype=g.dtype, codecs=g.codecs,
                                       fill_value=g.fill_value, segments=None),
                               name, storage_options, check) for g in groups.values()]

    def read(self, selection: object = ...) -> np.ndarray:
        """``array[selection]`` (orthogonal), each segment decoded by its own encoding."""
        array, axis = self.array, self.axis
        index = list(normalize_selection(selection, array.shape))
        dropped = [isinstance(i, int | np.integer) for i in index]
        index = [np.asarray([i]) if d else i for i, d in zip(index, dropped, strict=True)]
        along = np.arange(array.shape[axis])[index[axis]]
        segment = np.searchsorted(self.first, along, side="right") - 1
        if len(segment) and (segment == segment[0]).all():  # (a chunk's read: one segment)
            k = int(segment[0])
            raw = self.readers[self.group[k]].read(tuple(index))
            return self.one(k, raw).astype(array.value_dtype, copy=False).reshape(
                [n for n, d in zip(raw.shape, dropped, strict=True) if not d])
        shape = [len(np.arange(n)[i]) for i, n in zip(index, array.shape, strict=True)]
        out = np.empty(shape, array.value_dtype)
        group = self.group[segment]
        for g, reader in enumerate(self.readers):
            where = np.flatnonzero(group == g)
            if not len(where):
                continue
            chosen = list(index)
            chosen[axis] = index[axis] if len(where) == len(along) else along[where]
            raw = reader.read(tuple(chosen))
            if not self.segments.decoded:
                out[_along(axis, where, len(shape))] = raw
                continue
            mine = segment[where]
            kind, columns = self.kinds()
            for j in np.unique(kind[mine]).tolist():
                at = np.flatnonzero(kind[mine] == j)
                if j < 0:  # decoded by xarray itself, a segment at a time
                    for k in np.unique(mine[at]).tolist():
                        one = np.flatnonzero(mine == k)
                        out[_along(axis, where[one], len(shape))] = self.decoded(
                            k, raw[_along(axis, one, len(shape))])
                else:
                    out[_along(axis, where[at], len(shape))] = columns[j].applied(
                        mine[at], raw[_along(axis, at, len(shape))], axis)
        return out.reshape([n for n, d in zip(shape, dropped, strict=True) if not d])

    def kinds(self) -> tuple[np.ndarray, list[Columns]]:
        """Each segment's kind (-1: decoded by xarray alone) and each kind's
        :class:`Columns` — xarray's rules asked once per kind
        (:func:`~refgrid.model.presented.kind_of`), each segment's values taken as xarray
        takes them:
        10^4 files that differ in ``add_offset`` ask once, and decode in one numpy step."""
        if self._kinds is None:
            encodings = self.segments.encodings
            kind = np.full(len(encodings), -1, np.intp)
            by_kind: dict[tuple[object, ...], list[int]] = {}
            for k, e in enumerate(encodings):
                by_kind.setdefault(kind_of(e), []).append(k)
            columns: list[Columns] = []
            for members in by_kind.values():
                found = Columns.of(self.array.name, [encodings[k] for k in members],
                                   np.asarray(members), len(encodings))
                if found is not None:
                    kind[found.members] = len(columns)
                    columns.append(found)
            self._kinds = kind, columns
        return self._kinds

    def one(self, k: int, raw: np.ndarray) -> np.ndarray:
        """``raw``, all of segment ``k``, as it is shown."""
        if not self.segments.decoded:
            return raw
        kind, columns = self.kinds()
        if kind[k] < 0:
            return self.decoded(k, raw)
        return columns[kind[k]].applied(np.full(raw.shape[self.axis], k), raw, self.axis)

    def decoded(self, k: int, raw: np.ndarray) -> np.ndarray:
        """Segment ``k``'s stored values decoded by xarray itself (what it cannot decode —
        an integer ``scale_factor`` beside a fill marker — is a :class:`ReadError`)."""
        attrs = reader_attrs(self.segments.encodings[k].attrs)
        try:
            return np.asarray(mask_and_scale(self.array.name, self.array.dims, attrs,
                                             raw).values)
        except (ValueError, TypeError, OverflowError) as e:
            raise ReadError(f"array {self.array.name!r}: segment {k} (from chunk "
                            f"{self.segments.starts[k]} along {self.segments.dim!r}) does "
                            f"not decode: {type(e).__name__}: {e}") from e


def _along(axis: int, index: np.ndarray, ndim: int) -> tuple[slice | np.ndarray, ...]:
    cut: list[slice | np.ndarray] = [slice(None)] * ndim
    cut[axis] = index
    return tuple(cut)


class Plan(NamedTuple):
    """xarray's mask-and-scale of one segment (``CFMaskCoder`` then ``CFScaleOffsetCoder``,
    as ``decode_cf_variable`` applies them to numbers) as elementwise numpy steps: the
    values cast to ``masked`` and the ``fills`` replaced by ``fill``; cast to ``scaled``,
    times ``scale``, plus ``offset``. Each scalar keeps the type xarray holds it in (a
    Python float takes the array's type, a numpy one its own), so the steps applied to many
    segments at once, each scalar broadcast along the segmented axis, give xarray's values
    bit for bit."""

    fills: tuple[np.generic, ...]
    masked: np.dtype | None
    fill: object
    scaled: np.dtype | None
    scale: object
    offset: object


class Columns(NamedTuple):
    """Segments of one kind: the :class:`Plan` of the first, and each segment's values as
    columns indexed by segment (where the array has ``count`` of them)."""

    plan: Plan
    members: np.ndarray
    fills: np.ndarray | None
    scales: np.ndarray | None
    offsets: np.ndarray | None

    @classmethod
    def of(cls, name: str, encodings: list[Encoding], members: np.ndarray, count: int
           ) -> Columns | None:
        """The columns of ``encodings`` (segments ``members``) that xarray's rules of the
        first decode alike; None where they do not (the others are decoded alone)."""
        first = encodings[0]
        plan = _plan(name, first) if _simple(first) else None
        if plan is None:
            return None
        found: dict[str, np.ndarray | None] = {}
        finite = np.ones(len(encodings), bool)
        for attr, kept, dtype in (
                ("fill", plan.fills[0] if plan.fills else None,
                 plan.fills[0].dtype if plan.fills else None),
                ("scale_factor", plan.scale, None), ("add_offset", plan.offset, None)):
            if kept is None:
                found[attr] = None
                continue
            values = [e.attrs.get("_FillValue", e.attrs.get("missing_value")) if
                      attr == "fill" else e.attrs.get(attr) for e in encodings]
            finite &= np.array([_finite(v) for v in values])
            typed = dtype or _typed(kept, plan.scaled or plan.masked or first.dtype)
            column = np.zeros(count, typed)
            try:
                column[members] = np.array([v if _finite(v) else 0 for v in values], typed)
            except (OverflowError, ValueError):  # (a value its recorded type cannot hold:
                return None  # xarray's own decoding says what it makes of it)
            found[attr] = column
        members = members[finite]
        if not len(members):
            return None
        return cls(plan, members, found["fill"], found["scale_factor"], found["add_offset"])

    def applied(self, segment: np.ndarray, raw: np.ndarray, axis: int) -> np.ndarray:
        """``raw`` (its positions along ``axis`` of segments ``segment``, all of this
        kind) masked and scaled as xarray does each segment."""
        plan = self.plan
        shape = [1] * raw.ndim
        shape[axis] = len(segment)

        def at(column: np.ndarray) -> np.ndarray:
            return column[segment].reshape(shape)

        data = raw
        if plan.masked is not None:
            data = np.array(raw, dtype=plan.masked, copy=True)
            assert self.fills is not None
            data[data == at(self.fills)] = plan.fill
        if plan.scaled is not None:
            data = data.astype(plan.scaled, copy=True)
            if self.scales is not None:
                data *= at(self.scales)
            if self.offsets is not None:
                data += at(self.offsets)
        return data


def _simple(encoding: Encoding) -> bool:
    """Whether a segment's kind takes one plan for all: scalars of recorded types, one fill
    marker at most, no ``_Unsigned`` (each segment is checked finite when planned)."""
    attrs = encoding.attrs
    fills = [k for k in attrs if k in ("_FillValue", "missing_value")]
    return len(fills) <= 1 and "_Unsigned" not in attrs and isinstance(
        attrs.get(ATTRIBUTE_TYPES_ATTR) or {}, Mapping) and all(
        _finite(v) for k, v in attrs.items() if k != ATTRIBUTE_TYPES_ATTR)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
        value)


def _plan(name: str, encoding: Encoding) -> Plan | None:
    """The :class:`Plan` of a segment, from xarray's own rules (None where its decoding
    takes more than masking and scaling — ``_Unsigned`` — or xarray's rules are not where
    this release of it keeps them: then xarray decodes it)."""
    try:
        from xarray.coding.variables import _check_fill_values, _choose_float_dtype
        from xarray.core import dtypes
    except ImportError:  # (private names: another xarray release)
        return None
    attrs = reader_attrs(encoding.attrs)
    raw = np.dtype(encoding.dtype).newbyteorder("=")
    if "_Unsigned" in attrs or raw.kind not in "iuf":
        return None
    scale, offset = (np.asarray(v).item() if v is not None and np.ndim(v) > 0 else v
                     for v in (attrs.get("scale_factor"), attrs.get("add_offset")))
    packed = "scale_factor" in attrs or "add_offset" in attrs
    held, fills = _check_fill_values(dict(attrs), name, raw)
    masked, fill = None, None
    if fills:
        if packed:
            masked, fill = np.dtype(_choose_float_dtype(raw, attrs)), np.nan
        else:
            promoted, fill = dtypes.maybe_promote(raw)
            masked = np.dtype(promoted)
    scaled = None
    if packed:  # (with a fill attribute, the type the mask left; else xarray's choice)
        scaled = (masked or raw) if held else np.dtype(_choose_float_dtype(masked or raw,
                                                                           attrs))
    found = tuple(cast("np.generic", np.asarray(f)[()]) for f in fills)
    return Plan(found, masked, fill, scaled, scale, offset)


def _typed(value: object, array: np.dtype) -> np.dtype:
    """The type a scalar takes in an operation on an ``array`` of values: its own (numpy's),
    or the array's (a Python number, which numpy takes as the array's type)."""
    return value.dtype if isinstance(value, np.generic) else array
