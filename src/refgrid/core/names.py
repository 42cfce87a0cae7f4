"""Values in file names: ``{member}``, ``{year:d}``, ``%Y%m%d`` and ``*`` in a pattern.

Archives often put what a file holds in its name only: the member of an ensemble
(``r1i1p1f1/tas_*.nc``), the day of a daily file without a time coordinate
(``sst_20030101.nc``), as NcML's ``dateFormatMark`` and pangeo-forge's file patterns read
them. One small pattern language serves :func:`refgrid.combine`'s ``stack_by`` and
``time_from``:

- ``{name}`` a text field (one path segment or part of one), ``{name:d}`` an integer field;
- ``%Y %y %m %d %j %H %M %S``: a date, as ``strftime`` writes it (fixed widths, so
  ``%Y%m%d`` reads ``20030101``);
- ``*`` anything within a path segment; every other character stands for itself.

A pattern matches the end of a path or URL at a segment boundary: ``{member}/tas_*.nc``
matches ``s3://b/cmip/r1i1p1f1/tas_2000.nc``. Parsing is the one place that knows the syntax,
so a bad pattern is refused once, with where it went wrong.

A name's date denotes a period, as long as its finest field: ``sst_%Y%m%d.nc`` names a day,
``tas_%Y%m.nc`` a month. A time *falls in* it when it has the name's value in every field
the pattern reads (:data:`DATE_FIELDS`): 2003-01-02 12:00 falls in ``sst_20030102.nc``'s
day, 2003-01-03 00:00 does not (the period ends before the next midnight).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from refgrid.core.cf import STANDARD_CALENDARS
from refgrid.errors import ArgumentError

DIRECTIVES = {"Y": r"\d{4}", "y": r"\d{2}", "m": r"\d{2}", "d": r"\d{2}", "j": r"\d{3}",
              "H": r"\d{2}", "M": r"\d{2}", "S": r"\d{2}"}
"""The ``strftime`` directives a pattern may hold, with what they match (fixed widths)."""
CLOCK = frozenset("HMS")
"""Directives below a day: times with them are kept to the second, others to the day."""
_TOKEN = re.compile(r"\{(?P<field>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<kind>d))?\}"
                    r"|%(?P<directive>.)|(?P<star>\*)|(?P<brace>[{}])")

DATE_FIELDS = {"Y": "year", "m": "month", "d": "day", "j": "day_of_year", "H": "hour",
               "M": "minute", "S": "second"}
"""The field of a date each directive reads (``%y`` the year too; named as pandas names
them): a time falls in the period a name gives when it has the name's value in each."""
Value = str | int | datetime
"""A field's value: text, an integer (``{name:d}``) or a date (``%`` directives)."""
DateParts = dict[str, int]
"""The numbers a name's date directives hold, by directive (``%y``'s as the full year ``Y``)."""


@dataclass(frozen=True)
class NamePattern:
    """A parsed pattern (:func:`parse`); :meth:`match` reads a path's values."""

    text: str
    regex: re.Pattern[str]
    fields: tuple[str, ...]
    """The named fields, in order."""
    integers: frozenset[str]
    directives: frozenset[str]
    """The date directives the pattern holds (empty: no date)."""

    @classmethod
    def parse(cls, text: str) -> NamePattern:
        if not isinstance(text, str) or not text:
            raise ArgumentError(f"a file-name pattern must be a non-empty string, not {text!r}")
        out, fields, integers, directives = [], [], set(), set()
        position = 0
        for token in _TOKEN.finditer(text):
            out.append(re.escape(text[position:token.start()]))
            position = token.end()
            if token["field"]:
                name = token["field"]
                if name in fields:
                    raise ArgumentError(f"file-name pattern {text!r}: the field {{{name}}} "
                                        "appears twice")
                fields.append(name)
                if token["kind"]:
                    integers.add(name)
                out.append(rf"(?P<f_{name}>-?\d+)" if token["kind"] else
                           rf"(?P<f_{name}>[^/]+?)")
            elif token["directive"]:
                d = token["directive"]
                if d == "%":
                    out.append("%")
                    continue
                if d not in DIRECTIVES:
                    raise ArgumentError(f"file-name pattern {text!r}: %{d} is not one of the "
                                        f"date directives it reads (%{', %'.join(DIRECTIVES)})")
                out.append(f"(?P<d_{d}>{DIRECTIVES[d]})" if d not in directives else
                           f"(?P=d_{d})")
                directives.add(d)
            elif token["star"]:
                out.append(r"[^/]*?")
            else:
                raise ArgumentError(f"file-name pattern {text!r}: a lone {token['brace']!r} at "
                                    f"character {token.start()} (fields are {{name}} or "
                                    "{name:d})")
        out.append(re.escape(text[position:]))
        if directives and not directives & {"Y", "y"}:
            raise ArgumentError(f"file-name pattern {text!r}: dates need a year (%Y or %y)")
        return cls(text, re.compile(r"(?:^|/)" + "".join(out) + "$"), tuple(fields),
                   frozenset(integers), frozenset(directives))

    def match(self, path: str) -> dict[str, Value] | None:
        """The fields (and under ``"date"`` the date) the end of ``path`` holds, or None when
        it does not match."""
        found = self.regex.search(path.rstrip("/"))
        if found is None:
            return None
        values: dict[str, Value] = {}
        for name in self.fields:
            text = found[f"f_{name}"]
            values[name] = int(text) if name in self.integers else text
        if self.directives:
            values["date"] = date_of(self._parts(found), path)
        return values

    def values(self, path: str) -> dict[str, Value]:
        """:meth:`match`, or an :class:`ArgumentError` naming the path and the pattern."""
        found = self.match(path)
        if found is None:
            raise self._unmatched(path)
        return found

    def date_parts(self, path: str) -> DateParts:
        """The numbers the date directives of ``path``'s name hold (not yet a date: which
        dates exist depends on the calendar, :func:`date_of`), or an :class:`ArgumentError`
        naming the path and the pattern."""
        found = self.regex.search(path.rstrip("/"))
        if found is None:
            raise self._unmatched(path)
        return self._parts(found)

    def _parts(self, found: re.Match[str]) -> DateParts:
        numbers = {d: int(found[f"d_{d}"]) for d in self.directives}
        short = numbers.pop("y", None)
        if "Y" not in numbers and short is not None:
            numbers["Y"] = short + (1900 if short >= 69 else 2000)
        return numbers

    def _unmatched(self, path: str) -> ArgumentError:
        return ArgumentError(f"{path} does not match the file-name pattern {self.text!r}")

    @property
    def clock(self) -> bool:
        """Whether the pattern reads times of day (not only dates)."""
        return bool(self.directives & CLOCK)


def date_of(parts: DateParts, where: str, calendar: str = "standard") -> Any:
    """The date ``parts`` give in ``calendar`` (a canonical name, :func:`cf.calendar_name
    <refgrid.core.cf.calendar_name>`): a ``datetime`` in the standard calendars, cftime's in
    the others — whose years have other days: day 61 of a noleap year is 2 March, a 360-day
    February has a 30th. A date the calendar lacks is an :class:`ArgumentError` naming
    ``where``."""
    def make(year: int, month: int, day: int) -> Any:
        if calendar in STANDARD_CALENDARS:
            return datetime(year, month, day, *clock)
        import cftime

        return cftime.datetime(year, month, day, *clock, calendar=calendar)

    year, clock = parts["Y"], (parts.get("H", 0), parts.get("M", 0), parts.get("S", 0))
    shown = "" if calendar in STANDARD_CALENDARS else f" in the {calendar} calendar"
    try:
        if "j" in parts:
            date = make(year, 1, 1) + timedelta(days=parts["j"] - 1)
            if date.year != year:
                raise ValueError(f"day of year {parts['j']} is outside the year")
            return make(year, date.month, date.day)
        return make(year, parts.get("m", 1), parts.get("d", 1))
    except ValueError as e:
        raise ArgumentError(f"{where}: its name holds no valid date{shown} ({e})") from e


def to_json(value: Value) -> list[str | int]:
    """A value as a batch worker records it (``["date", ISO]``, ``["int", n]``...)."""
    if isinstance(value, datetime):
        return ["date", value.isoformat()]
    return ["int", value] if isinstance(value, int) else ["str", value]


def from_json(recorded: object) -> Value:
    """:func:`to_json`'s value back."""
    if not isinstance(recorded, list) or len(recorded) != 2 or recorded[0] not in (
            "date", "int", "str"):
        raise ValueError(f"not a recorded value: {recorded!r}")
    kind, value = recorded
    if kind == "date":
        return datetime.fromisoformat(str(value))
    return int(value) if kind == "int" else str(value)
