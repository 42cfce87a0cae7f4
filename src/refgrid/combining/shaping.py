"""What is done to each file before files are compared, and what partitions them.

:class:`FileShape` holds the per-file choices of :func:`refgrid.combine` and
:func:`refgrid.batch` — the variables chosen, a time taken from the file name, the value a
file is stacked at along a new dimension — so that a combine in this process and a batch
worker on another machine shape a file the same way (it is sent to the workers, and a batch
records it in its settings: an archive is appended to only with the same).

A time from the name gives each data variable a leading dimension of length 1 and the file
a coordinate holding the name's date: no data is copied, the chunks keep their references
(:func:`~refgrid.combining.concat.with_leading_axis`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from refgrid.codecs.filters import CodecJSON, bytes_codec
from refgrid.core import cf
from refgrid.core.dtypes import STRING
from refgrid.core.names import NamePattern, Value
from refgrid.errors import ArgumentError, CombineError
from refgrid.grid.rectilinear import RectilinearGrid
from refgrid.model.choose import choose, coordinate_names, held_names
from refgrid.model.manifest import ManifestBuilder
from refgrid.model.virtual import ReportEntry, VirtualArray, VirtualGroup

ATTRIBUTE = "attribute:"
"""``stack_by="attribute:NAME"``: the value is the file's global attribute ``NAME``."""
EPOCH = "1970-01-01"


@dataclass(frozen=True)
class FileShape:
    """The per-file choices of a combine or batch (see the module docstring)."""

    variables: tuple[str, ...] | None = None
    drop_variables: tuple[str, ...] = ()
    time_from: str | None = None
    """A file-name pattern with a date (``"sst_%Y%m%d.nc"``): the file's time along the
    concat dimension, for files without a coordinate along it."""
    time_units: str | None = None
    """The units of times from names (default: days since 1970-01-01, or seconds where the
    pattern reads times of day)."""
    calendar: str = "standard"
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
        """The choices as the public functions take them, checked."""
        return cls(_names(variables, "variables"), _names(drop_variables, "drop_variables")
                   or (), time_from, time_units, calendar or "standard", stack_dim, stack_by)

    def __post_init__(self) -> None:
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
                       calendar=self.calendar)
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

    def shaped(self, group: VirtualGroup, url: str, dim: str) -> VirtualGroup:
        """``group`` (the scan of ``url``) with its variables chosen and its time from its
        name."""
        if self.variables is not None or self.drop_variables:
            group = choose(group, self.variables, self.drop_variables, url, strict=False)
        if self.time_from is None:
            return group
        date = NamePattern.parse(self.time_from).values(url)["date"]
        assert isinstance(date, datetime)  # (a pattern with directives reads a date)
        return _with_time(group, url, dim, date, self.units, self.calendar)

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
        raw = _encoded(list(values), units, "standard", where)  # type: ignore[arg-type]
        return _inline(name, raw.dtype, {"units": units, "calendar": "standard"},
                       raw.tobytes(), len(values), bytes_codec(raw.dtype), 0)
    shown = ", ".join(sorted(k.__name__ for k in kinds))
    raise CombineError(f"{where}: its values are of several kinds ({shown}): a coordinate "
                       "holds one")


def _with_time(group: VirtualGroup, url: str, dim: str, date: datetime, units: str,
               calendar: str) -> VirtualGroup:
    """The file with a time coordinate ``dim`` of one step at ``date`` (see the module
    docstring)."""
    from refgrid.combining.concat import with_leading_axis

    existing = group.arrays.get(dim)
    if existing is not None and existing.dims:
        raise CombineError(f"{url}: already has a coordinate {dim!r} along {existing.dims}: "
                           "time_from is for files without one (or with a scalar one)")
    named = [existing.attrs[a] for a in ("bounds", "climatology")
             if existing is not None and existing.attrs.get(a) in group.arrays]
    if named:  # (they would lose the units they take from the scalar time)
        raise CombineError(f"{url}: its scalar {dim!r} has bounds ({', '.join(map(str, named))})"
                           f" a time from the name cannot keep: leave them out with "
                           f"drop_variables={named!r}")
    held = {d for _, node in group.walk() if isinstance(node, VirtualArray) for d in node.dims}
    if dim in held:
        raise CombineError(f"{url}: already has a dimension {dim!r}: time_from is for files "
                           "without one")
    raw = _encoded([date], units, calendar, url)
    coordinate = _inline(dim, raw.dtype, {"units": units, "calendar": calendar},
                         raw.tobytes(), 1, bytes_codec(raw.dtype), 0)

    def stacked(g: VirtualGroup) -> VirtualGroup:
        coords = coordinate_names(g)
        arrays = {name: a if name in coords else with_leading_axis(a, dim)
                  for name, a in g.arrays.items() if not (name == dim and not a.dims)}
        return replace(g, arrays=arrays,
                       groups={n: stacked(child) for n, child in g.groups.items()})

    shaped = stacked(group)
    report = shaped.report
    if existing is not None:
        report = (*report, ReportEntry(url, dim, "re-encoded", (
            f"its scalar {dim!r} is replaced by the date in its name ({date:%Y-%m-%d %H:%M:%S})")))
    return replace(shaped, arrays={dim: coordinate, **shaped.arrays}, report=report,
                   sources=group.sources)


STANDARD = frozenset({"standard", "proleptic_gregorian"})
"""Calendars whose dates are numpy's; others are cftime's (a noleap year has no 29 February)."""


def _encoded(dates: list[datetime], units: str, calendar: str, where: str) -> np.ndarray:
    """``dates`` in ``units`` of ``calendar``: int64 where exact, else float64."""
    try:
        if cf.calendar_name(calendar) in STANDARD:
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


def _names(value: Sequence[str] | str | None, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = (value,) if isinstance(value, str) else tuple(value)
    if not all(isinstance(n, str) and n.strip("/") for n in names):
        raise ArgumentError(f"{what} must be variable names, not {value!r}")
    return names
