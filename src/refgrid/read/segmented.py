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
from refgrid.grid.selection import normalize_selection
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
        self.group = np.empty(len(segments), np.intp)
        for k, e in enumerate(segments.encodings):
            key = e.storage
            if key not in groups:
                groups[key] = e
            self.group[k] = list(groups).index(key)
        self.plans: dict[int, Plan | None] = {}
        """Each segment's decoding as numpy steps (made when first read)."""
        self.templates: dict[tuple[object, ...], Plan | None] = {}
        """The plan of the first segment of each kind (:meth:`plan`)."""
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
            for key, members in self.by_plan(np.unique(mine).tolist()).items():
                at = np.flatnonzero(np.isin(mine, members))
                cut = _along(axis, at, len(shape))
                put = _along(axis, where[at], len(shape))
                if key is None:  # decoded by xarray itself, a segment at a time
                    for k in members:
                        one = np.flatnonzero(mine == k)
                        out[_along(axis, where[one], len(shape))] = self.decoded(
                            k, raw[_along(axis, one, len(shape))])
                else:
                    plans = [self.plans[k] for k in mine[at].tolist()]
                    out[put] = _applied(cast("list[Plan]", plans), raw[cut], axis)
        return out.reshape([n for n, d in zip(shape, dropped, strict=True) if not d])

    def by_plan(self, members: list[int]) -> dict[tuple[object, ...] | None, list[int]]:
        """Segments ``members`` by the kind of their plan (:func:`_plan`): those of one
        kind are decoded together, in one numpy step (None: by xarray, one at a time)."""
        out: dict[tuple[object, ...] | None, list[int]] = {}
        for k in members:
            if k not in self.plans:
                self.plans[k] = self.plan(self.segments.encodings[k])
            plan = self.plans[k]
            out.setdefault(None if plan is None else plan.kind, []).append(k)
        return out

    def plan(self, encoding: Encoding) -> Plan | None:
        """A segment's :class:`Plan`: xarray's rules are asked once per kind of segment
        (:func:`_kind_of`: the attributes' names and types), then each segment's values
        taken as xarray takes them — 10^4 files that differ in ``add_offset`` ask once."""
        kind = _kind_of(encoding)
        if kind is None:
            return _plan(self.array.name, encoding)
        if kind not in self.templates:
            self.templates[kind] = _plan(self.array.name, encoding)
            return self.templates[kind]
        template = self.templates[kind]
        if template is None:
            return None
        types = cast("dict[str, str]", encoding.attrs.get(ATTRIBUTE_TYPES_ATTR) or {})
        scale, offset = (None if v is None else np.dtype(types[name]).type(v)
                         if name in types else v for name, v in (
                             ("scale_factor", encoding.attrs.get("scale_factor")),
                             ("add_offset", encoding.attrs.get("add_offset"))))
        fill = encoding.attrs.get("_FillValue", encoding.attrs.get("missing_value"))
        fills = () if fill is None else (template.fills[0].dtype.type(fill),)
        return template._replace(fills=fills, scale=scale, offset=offset)

    def decoded(self, k: int, raw: np.ndarray) -> np.ndarray:
        """Segment ``k``'s stored values decoded by xarray itself."""
        attrs = reader_attrs(self.segments.encodings[k].attrs)
        return np.asarray(mask_and_scale(self.array.name, self.array.dims, attrs, raw).values)


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

    @property
    def kind(self) -> tuple[object, ...]:
        """What must agree for segments to be decoded together: types, not values."""
        return (tuple(f.dtype for f in self.fills), self.masked, self.scaled,
                _type(self.scale), _type(self.offset))


def _type(value: object) -> object:
    return None if value is None else value.dtype if isinstance(value, np.generic) else "weak"


def _kind_of(encoding: Encoding) -> tuple[object, ...] | None:
    """What xarray's rules depend on, of a segment whose values are scalars of recorded
    types and one finite fill marker at most (None: another segment, planned alone)."""
    attrs = encoding.attrs
    types = attrs.get(ATTRIBUTE_TYPES_ATTR) or {}
    names = sorted(k for k in attrs if k != ATTRIBUTE_TYPES_ATTR)
    fills = [k for k in names if k in ("_FillValue", "missing_value")]
    if not isinstance(types, Mapping) or len(fills) > 1 or "_Unsigned" in names or not all(
            _finite(attrs[k]) for k in names):
        return None
    return encoding.dtype.str, tuple((k, types.get(k, type(attrs[k]).__name__))
                                     for k in names)


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


def _applied(plans: list[Plan], raw: np.ndarray, axis: int) -> np.ndarray:
    """``raw`` (its positions along ``axis`` each of the segment whose plan ``plans``
    gives, all of one kind) masked and scaled as xarray does each segment."""
    first = plans[0]
    shape = [1] * raw.ndim
    shape[axis] = len(plans)

    def column(values: list[object], dtype: np.dtype) -> np.ndarray:
        return np.asarray(values, dtype).reshape(shape)

    data = raw
    if first.masked is not None:
        data = np.array(raw, dtype=first.masked, copy=True)
        condition = np.zeros(data.shape, bool)
        for j, found in enumerate(first.fills):
            condition |= data == column([p.fills[j] for p in plans], found.dtype)
        data[condition] = first.fill
    if first.scaled is not None:
        data = data.astype(first.scaled, copy=True)
        if first.scale is not None:
            data *= column([p.scale for p in plans], _typed(first.scale, first.scaled))
        if first.offset is not None:
            data += column([p.offset for p in plans], _typed(first.offset, first.scaled))
    return data


def _typed(value: object, array: np.dtype) -> np.dtype:
    """The type a scalar takes in an operation on an ``array`` of values: its own (numpy's),
    or the array's (a Python number, which numpy takes as the array's type)."""
    return value.dtype if isinstance(value, np.generic) else array
