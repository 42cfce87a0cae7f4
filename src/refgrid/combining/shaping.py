"""What is done to each file before files are compared, and what partitions them.

:class:`FileShape` holds the per-file choices of :func:`refgrid.combine` and
:func:`refgrid.batch` — the variables chosen, a time taken from the file name, the value a
file is stacked at along a new dimension — so that a combine in this process and a batch
worker on another machine shape a file the same way (it is sent to the workers, and a batch
records it in its settings: an archive is appended to only with the same).

With ``time_from``, a file's time along the concat dimension is its own where it holds one
— a scalar ``time``, or a coordinate along the dimension — and its name's date only checks
it: the file's times must fall in the period the name gives (:data:`~refgrid.core.names.
DATE_FIELDS`: ``sst_%Y%m%d.nc`` names a day, and noon of that day agrees), else the combine is
refused naming the file and both values. Only a file without a coordinate takes its name's
date, as xarray's ``open_mfdataset`` with a ``preprocess`` adding it would. A scalar time (and
a file without one) gives each data variable a leading dimension of length 1, and the scalar
time's bounds too; no data is copied, the chunks keep their references
(:func:`~refgrid.combining.concat.with_leading_axis`). Each file's report says which it was
(``own-time`` or ``from-name``); a combine keeps one entry of each.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np

from refgrid.codecs.filters import CodecJSON, bytes_codec
from refgrid.combining.arrays import brief, inlined, with_leading_axis
from refgrid.core import cf
from refgrid.core.dtypes import STRING
from refgrid.core.names import DATE_FIELDS, DateParts, NamePattern, Value, date_of
from refgrid.errors import ArgumentError, CombineError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.choose import choose, chosen_names, coordinate_names, held_names
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup

ATTRIBUTE = "attribute:"
"""``stack_by="attribute:NAME"``: the value is the file's global attribute ``NAME``."""
EPOCH = "1970-01-01"
TIME_RULE = 2
"""What :attr:`FileShape.time_from` does to a file, versioned in the settings a batch records
(:attr:`FileShape.settings`): the records and output of an earlier rule are made again, not
appended to (2: a file's own time is kept, its name checks it; 1 replaced a scalar time by
the name's date)."""


@dataclass(frozen=True)
class FileShape:
    """The per-file choices of a combine or batch (see the module docstring)."""

    variables: tuple[str, ...] | None = None
    drop_variables: tuple[str, ...] = ()
    time_from: str | None = None
    """A file-name pattern with a date (``"sst_%Y%m%d.nc"``): the file's time along the
    concat dimension, for files without a coordinate along it; a file's own time (scalar or
    a coordinate) is kept and must fall in the period its name gives."""
    time_units: str | None = None
    """The units of times from names (default: days since 1970-01-01, or seconds where the
    pattern reads times of day)."""
    calendar: str = "standard"
    """The calendar of times from names (their dates are the calendar's: a 360-day year has
    a 30 February)."""
    stack_dim: str | None = None
    """A new dimension the files are stacked along (``"member"``)."""
    stack_by: str | None = None
    """Where a file's value along ``stack_dim`` comes from: a file-name pattern
    (``"{member}/tas_*.nc"``, ``"%Y%m"``) or ``"attribute:NAME"``."""

    @classmethod
    def of(cls, variables: Sequence[str] | str | None = None,
           drop_variables: Sequence[str] | str | None = None, time_from: str | None = None,
           time_units: str | None = None, calendar: str | None = None,
           stack_dim: str | None = None, stack_by: str | None = None) -> FileShape:
        """The choices as the public functions take them, checked; times from names get
        their units explicit, so that a spec made again from its record equals it."""
        shape = cls(chosen_names(variables, "variables", keeping=True),
                    chosen_names(drop_variables, "drop_variables", keeping=False) or (),
                    time_from, time_units, calendar or "standard", stack_dim, stack_by)
        return shape if shape.time_from is None or shape.time_units is not None else \
            replace(shape, time_units=shape.units)

    def __post_init__(self) -> None:
        for name in ("time_from", "time_units", "calendar", "stack_dim", "stack_by"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ArgumentError(f"{name} must be text, not {value!r}")
        if self.time_from is not None and not NamePattern.parse(self.time_from).directives:
            raise ArgumentError(f"time_from={self.time_from!r} holds no date directive "
                                "(%Y, %m, %d...): it cannot give a time")
        if self.time_units is not None and not cf.is_time_units(self.time_units):
            raise ArgumentError(f"time_units={self.time_units!r} are not CF time units "
                                "('days since 2000-01-01', say)")
        if (self.time_units is not None or self.calendar != "standard") and \
                self.time_from is None:
            raise ArgumentError("time_units and calendar are for times from file names: "
                                "pass time_from= too")
        if (self.stack_dim is None) != (self.stack_by is None):
            raise ArgumentError("stacking needs both stack_dim= (the new dimension's name) "
                                "and stack_by= (a file-name pattern or 'attribute:NAME')")
        if self.stack_by is not None and not self.stack_by.startswith(ATTRIBUTE):
            pattern = NamePattern.parse(self.stack_by)
            if not pattern.directives and self.stack_dim not in pattern.fields and \
                    len(pattern.fields) != 1:
                raise ArgumentError(
                    f"stack_by={self.stack_by!r}: name the field that holds the value "
                    f"{{{self.stack_dim}}} (its fields: {', '.join(pattern.fields) or 'none'})")

    @property
    def settings(self) -> dict[str, str]:
        """The choices that decide a batch's output, as its report records them."""
        out = {"variables": ",".join(self.variables) if self.variables is not None else "",
               "drop_variables": ",".join(self.drop_variables)}
        if self.time_from is not None:
            out.update(time_from=self.time_from, time_units=self.units,
                       calendar=self.calendar, time_rule=str(TIME_RULE))
        if self.stack_dim is not None:
            out.update(stack_dim=self.stack_dim, stack_by=str(self.stack_by))
        return out

    def key(self, merge: bool) -> str:
        """What a batch record was shaped with (empty: nothing done to the file): a record
        shaped otherwise is scanned again, not reused."""
        if self == FileShape() and not merge:
            return ""
        return json.dumps({**self.settings, "merge": merge}, sort_keys=True)

    def named(self, group: VirtualGroup) -> list[str]:
        """The chosen names (kept or dropped) the file ``group`` holds: a batch checks every
        name against all its files, as a combine does."""
        held = held_names(group)
        return [n for n in (*(self.variables or ()), *self.drop_variables)
                if n.strip("/") in held]

    @property
    def units(self) -> str:
        if self.time_units is not None:
            return self.time_units
        clock = self.time_from is not None and NamePattern.parse(self.time_from).clock
        return f"{'seconds' if clock else 'days'} since {EPOCH}"

    def shaped(self, group: VirtualGroup, url: str, dim: str,
               storage_options: dict[str, object] | None = None) -> VirtualGroup:
        """``group`` (the scan of ``url``) with its variables chosen and, with
        :attr:`time_from`, its time along ``dim`` its own, checked against its name, or its
        name's (see the module docstring). ``storage_options`` reach ``url``, whose own time
        is read (and inlined, so a combine reads it once)."""
        if self.variables is not None or self.drop_variables:
            group = choose(group, self.variables, self.drop_variables, url, strict=False)
        if self.time_from is None:
            return group
        parts = NamePattern.parse(self.time_from).date_parts(url)
        date = date_of(parts, url, cf.calendar_name(self.calendar))  # (a date it can be)
        own = group.arrays.get(dim)
        along = [node for _, node in group.walk() if isinstance(node, VirtualArray)
                 and dim in node.dims]
        if own is not None and own.dims not in ((), (dim,)):
            raise CombineError(f"{url}: its {dim!r} runs along {own.dims}, not along {dim!r}: "
                               "not a time time_from can take or check")
        if own is not None and not own.dims and along:
            raise CombineError(f"{url}: holds a scalar {dim!r} and a dimension {dim!r} beside "
                               "it: which is its time is not clear")
        if own is not None:
            return self._own_time(group, url, dim, own, parts, storage_options or {})
        lengths = sorted({node.shape[node.axis(dim)] for node in along})
        if lengths and lengths != [1]:
            raise CombineError(f"{url}: has {' or '.join(map(str, lengths))} steps along "
                               f"{dim!r} and no {dim!r} coordinate: the one date its name "
                               "gives cannot be their time")
        raw = _encoded([date], self.units, self.calendar, url)
        coordinate = _inline(dim, raw.dtype, {"units": self.units, "calendar": self.calendar},
                             raw.tobytes(), 1, bytes_codec(raw.dtype), 0)
        shaped = group if along else _stacked(group, dim)
        entry = ReportEntry(url, dim, "from-name", (
            f"files without a {dim!r} coordinate take the date their name gives "
            f"({self.time_from!r}), in {self.units!r} ({self.calendar})"))
        return replace(shaped, arrays={dim: coordinate, **shaped.arrays},
                       report=(*shaped.report, entry), sources=group.sources)

    def _own_time(self, group: VirtualGroup, url: str, dim: str, own: VirtualArray,
                  parts: DateParts, storage_options: dict[str, object]) -> VirtualGroup:
        """The file with its own time ``own`` (scalar, or along ``dim``) read, checked
        against the date its name gives, and inlined; a scalar one (and its bounds) gains
        the dimension, as the data variables do."""
        from refgrid.read.array import read

        assert self.time_from is not None
        encoding = cf.time_encodings({n: a.attrs for n, a in group.arrays.items()}).get(dim)
        if encoding is None:
            raise CombineError(
                f"{url}: its own {dim!r} has no CF time units ({brief(own.attrs.get('units'))})"
                f": the date its name gives cannot check it — {_way_out(own, dim)}combine "
                "without time_from")
        stored = read(own, storage_options=storage_options)
        _check_against_name(own, stored, encoding, parts, url, self.time_from)
        if own.dims:
            timed, shaped = inlined(own, stored, pieces=False), group
        else:
            timed = inlined(with_leading_axis(own, dim), stored.reshape(1), pieces=False)
            bounds = {own.attrs.get(a) for a in cf.BOUNDS_ATTRS}
            shaped = _stacked(group, dim, {n for n in bounds if isinstance(n, str)})
        entry = ReportEntry(url, dim, "own-time", (
            f"files that hold a {dim!r} keep their own; the date their name gives "
            f"({self.time_from!r}) only checks it: the same {_fields(parts)}"))
        return replace(shaped, arrays={**shaped.arrays, dim: timed},
                       report=(*shaped.report, entry), sources=group.sources)

    def stack_value(self, group: VirtualGroup, url: str) -> Value:
        """The value of the file ``url`` along :attr:`stack_dim`."""
        assert self.stack_by is not None and self.stack_dim is not None
        if self.stack_by.startswith(ATTRIBUTE):
            name = self.stack_by.removeprefix(ATTRIBUTE)
            if name not in group.attrs:
                raise CombineError(f"{url}: has no global attribute {name!r} to stack it "
                                   f"along {self.stack_dim!r} by")
            return _attribute_value(group.attrs[name], url, name)
        found = NamePattern.parse(self.stack_by).values(url)
        fields = [f for f in found if f != "date"]
        if self.stack_dim in found:
            return found[self.stack_dim]
        return found[fields[0]] if len(fields) == 1 else found["date"]


def data_variables(group: VirtualGroup, dim: str, prefix: str = "") -> frozenset[str]:
    """The paths of a file's data variables along ``dim`` (not its coordinates): files with
    the same are one file set of a merge."""
    coords = coordinate_names(group)
    out = {prefix + name for name, a in group.arrays.items()
           if dim in a.dims and name not in coords}
    for name, child in group.groups.items():
        out |= data_variables(child, dim, f"{prefix}{name}/")
    return frozenset(out)


def value_coordinate(name: str, values: Sequence[Value], where: str) -> VirtualArray:
    """A coordinate holding ``values`` inline: text as Zarr strings, integers as int64,
    dates as CF times (days since 1970-01-01, or seconds for times of day)."""
    kinds = {type(v) for v in values}
    if kinds <= {str}:
        import numcodecs

        data = np.array(values, dtype=object)
        return _inline(name, STRING, {}, bytes(numcodecs.VLenUTF8().encode(data)),
                       len(values), {"name": "vlen-utf8"}, "")
    if kinds <= {int}:
        raw = np.asarray(values, dtype="<i8")
        return _inline(name, raw.dtype, {}, raw.tobytes(), len(values),
                       bytes_codec(raw.dtype), 0)
    if kinds <= {datetime}:
        clock = any(v.hour or v.minute or v.second for v in values)  # type: ignore[union-attr]
        units = f"{'seconds' if clock else 'days'} since {EPOCH}"
        raw = _encoded(list(values), units, "standard", where)
        return _inline(name, raw.dtype, {"units": units, "calendar": "standard"},
                       raw.tobytes(), len(values), bytes_codec(raw.dtype), 0)
    shown = ", ".join(sorted(k.__name__ for k in kinds))
    raise CombineError(f"{where}: its values are of several kinds ({shown}): a coordinate "
                       "holds one")


def _stacked(group: VirtualGroup, dim: str, also: frozenset[str] | set[str] = frozenset()
             ) -> VirtualGroup:
    """``group`` with a leading ``dim`` of length 1 on each data variable — and on the
    coordinates ``also`` names (a scalar time's bounds) —, in its subgroups too."""
    coords = coordinate_names(group) - set(also)
    arrays = {name: a if name in coords else with_leading_axis(a, dim)
              for name, a in group.arrays.items()}
    return replace(group, arrays=arrays,
                   groups={n: _stacked(child, dim) for n, child in group.groups.items()})


def _check_against_name(own: VirtualArray, stored: np.ndarray, encoding: cf.TimeEncoding,
                        parts: DateParts, url: str, pattern: str) -> None:
    """Refuse a file whose own times (``stored``, in ``encoding``) do not all fall in the
    period its name gives, naming the file, the variable and both values."""
    from refgrid.read.unpacked import unpack_values

    values = unpack_values(own, stored).reshape(-1)  # (masked: NaN would decode as a date)
    missing = np.isnan(values) if values.dtype.kind == "f" else np.zeros(values.shape, bool)
    try:
        dates = cf.decode_times(values[~missing], *encoding) if not missing.all() else \
            np.array([], "datetime64[ns]")
    except Exception as e:  # units xarray cannot decode ("days since last frost")
        raise CombineError(f"{url}: its own {own.name!r} cannot be decoded ({encoding[0]!r}, "
                           f"{encoding[1]}): {e}") from e
    outside = _outside(dates, parts)
    odd = int(missing.sum() + outside.sum())
    if not odd:
        return
    value = "no value (its fill value)" if missing.any() else _shown(dates[outside][0])
    more = f", and {odd - 1} more of its {values.size}" if odd > 1 else ""
    given = ", ".join(f"{DATE_FIELDS[d].replace('_', ' ')} {parts[d]}"
                      for d in DATE_FIELDS if d in parts)
    raise CombineError(
        f"{url}: its own {own.name!r} ({value}{more}) disagrees with its name, which gives "
        f"{given} (time_from={pattern!r}): a file's own time is kept and must have the "
        f"{_fields(parts)} its name gives — {_way_out(own, own.name)}combine without "
        "time_from to keep the files' times unchecked")


def _outside(dates: np.ndarray, parts: DateParts) -> np.ndarray:
    """Where decoded times (numpy's datetime64 or cftime dates) fall outside the period a
    name's ``parts`` give: another value in a field the name reads
    (:data:`~refgrid.core.names.DATE_FIELDS`)."""
    import pandas as pd

    index = pd.DatetimeIndex(dates) if dates.dtype.kind == "M" else None

    def field(name: str) -> np.ndarray:
        if index is not None:
            return np.asarray(getattr(index, name))
        # cftime dates one by one (an index of them costs milliseconds to build)
        return np.array([getattr(d, "dayofyr" if name == "day_of_year" else name)
                         for d in dates], dtype=np.int64)

    inside = np.ones(dates.shape, bool)
    for directive, number in parts.items():
        inside &= field(DATE_FIELDS[directive]) == number
    return ~inside


def _fields(parts: DateParts) -> str:
    """The fields a name's date gives, in words ("year, month and day")."""
    named = [DATE_FIELDS[d].replace("_", " ") for d in DATE_FIELDS if d in parts]
    return " and ".join(filter(None, [", ".join(named[:-1]), named[-1]]))


def _way_out(own: VirtualArray, dim: str) -> str:
    """How to take the name's date instead of a file's own time: where it is one step,
    without it."""
    return f"drop it (drop_variables=[{dim!r}]) to take the name's date instead, or " if \
        math.prod(own.shape) == 1 else ""


def _shown(date: Any) -> str:
    """A decoded time as people write it (2003-01-02 12:00:00, not numpy's nanoseconds)."""
    if isinstance(date, np.datetime64):
        date = date.astype("datetime64[us]").item()
    return date.isoformat(sep=" ") if isinstance(date, datetime) else str(date)


def _encoded(dates: list[Any], units: str, calendar: str, where: str) -> np.ndarray:
    """``dates`` (``datetime``, or cftime's in other calendars) in ``units`` of ``calendar``:
    int64 where exact, else float64."""
    try:
        if cf.calendar_name(calendar) in cf.STANDARD_CALENDARS:
            values = np.asarray([np.datetime64(d, "s") for d in dates])
        else:
            import cftime

            values = np.asarray([cftime.datetime(d.year, d.month, d.day, d.hour, d.minute,
                                                 d.second, calendar=calendar) for d in dates])
        try:
            encoded = cf.encode_times(values, units, calendar, np.dtype("<i8"))
        except ValueError:  # a fraction of the units: stored as float64
            encoded = cf.encode_times(values, units, calendar, np.dtype("<f8"))
    except ValueError as e:  # (a date the calendar lacks, units it cannot take)
        raise CombineError(f"{where}: its date cannot be written in {units!r} ({calendar}): "
                           f"{e}") from e
    return np.asarray(encoded).astype(encoded.dtype.newbyteorder("<"))


def _inline(name: str, dtype: np.dtype, attrs: dict[str, object], data: bytes, n: int,
            codec: CodecJSON, fill: object) -> VirtualArray:
    grid = RectilinearGrid.regular((n,), (max(1, n),))
    built = ManifestBuilder(grid.chunk_counts)
    if n:
        built.inlined((0,), data)
    return VirtualArray(name, (name,), dtype, grid, built.build(), fill, (codec,), attrs)


def _attribute_value(value: object, url: str, name: str) -> Value:
    if isinstance(value, np.ndarray | list | tuple):
        flat = np.asarray(value).reshape(-1)
        if flat.size != 1:
            raise CombineError(f"{url}: its attribute {name!r} holds {flat.size} values, not "
                               "one to stack it by")
        value = flat[0]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise CombineError(f"{url}: its attribute {name!r} ({value!r}) is not text or a "
                           "number")
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise CombineError(f"{url}: its attribute {name!r} ({value!r}) is not a whole "
                               "number: coordinates from attributes are text or integers")
        value = int(value)
    return value
